"""``export-adapter``: an mlx-lm adapter made something other engines take (``finetune.export``): the base
with it merged (``--fused``), PEFT's layout (``--peft``), or llama.cpp's GGUF adapter (``--gguf``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .output import _err


def _export_adapter_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", required=True, metavar="M", help="the base the adapter was trained on: folder or hub id"
    )
    p.add_argument(
        "--adapter", required=True, type=Path, metavar="DIR", help="the adapter's folder (mlx-lm's)"
    )
    out = p.add_mutually_exclusive_group(required=True)
    out.add_argument(
        "--fused", type=Path, metavar="OUT", help="write the base with the adapter merged (a folder)"
    )
    out.add_argument("--peft", type=Path, metavar="OUT", help="write the adapter in PEFT's layout (a folder)")
    out.add_argument(
        "--gguf", type=Path, metavar="OUT", help="write llama.cpp's GGUF adapter (a .gguf file, for --lora)"
    )
    p.add_argument(
        "--dequantize", action="store_true", help="with --fused: write a quantized base unquantized"
    )


def _cmd_export_adapter(args: argparse.Namespace) -> int:
    """merge an adapter into its base, or write it for PEFT or llama.cpp

    Export an mlx-lm adapter (finetune's or mlx_lm.lora's): --fused OUT writes the base with it merged
    (a checkpoint this package, mlx-lm, transformers and `convert` take); --peft OUT its PEFT layout;
    --gguf OUT llama.cpp's GGUF adapter (llama-server --lora). It is checked against --model first
    (docs/cli.md).
    """
    from ..finetune.export import fuse_adapter, to_gguf_lora, to_peft

    if args.fused is not None:
        out = fuse_adapter(args.model, args.adapter, args.fused, dequantize=args.dequantize)
        _err(f"Wrote {args.model} with {args.adapter} merged; load it, or convert it to GGUF:")
    elif args.peft is not None:
        out = to_peft(args.adapter, args.peft, model_dir=args.model)
        _err("Wrote the adapter in PEFT's layout (PeftModel.from_pretrained, convert_lora_to_gguf.py):")
    else:
        out = to_gguf_lora(args.adapter, args.gguf, base=args.model)
        _err("Wrote llama.cpp's GGUF adapter (llama-server -m BASE.gguf --lora FILE):")
    print(out)
    return 0
