"""The commands that write a checkpoint: quantize, convert (GGUF <-> checkpoint folder), build-test-model."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..checkpoints import folder_bytes, human_bytes, staged_folder
from ..errors import InvalidParameterError
from .output import CommandError, _err, _notes

# --- quantize --------------------------------------------------------------------------------------


def _cmd_quantize(args: argparse.Namespace) -> int:
    """write an MLX-quantized checkpoint

    Quantize a full-precision StarCoder2 checkpoint (folder or hub id) into the folder DST.
    """
    from ..checkpoints import quantize_checkpoint

    quantize_checkpoint(
        args.src,
        args.dst,
        bits=args.bits,
        group_size=args.group_size,
        revision=args.revision,
        force=args.force,
        verify=not args.no_verify,
    )
    return 0


# --- convert ----------------------------------------------------------------------------------------


def _cmd_convert(args: argparse.Namespace) -> int:
    """GGUF file -> MLX checkpoint folder, or checkpoint -> GGUF file (DST ending in .gguf)

    Convert a StarCoder2 GGUF file (llama.cpp, Ollama) into an MLX checkpoint folder DST (safetensors,
    config.json, tokenizer.json) that this package and mlx-lm load; Q4_0, Q4_1 and Q8_0 tensors stay
    quantized. Or, with DST ending in .gguf, write a checkpoint folder or hub id (full precision or
    MLX-quantized) as a GGUF file in llama.cpp's layout, one tensor at a time (--outtype).
    """
    from ..gguf_format import convert_gguf, is_gguf, resolve_gguf_file
    from ..loading import check_weights_match_config, read_config, weight_headers

    if str(args.dst).endswith(".gguf") or args.outtype is not None:
        return _convert_to_gguf(args)
    if not is_gguf(args.src, args.gguf_file):
        msg = "convert reads GGUF files: give a .gguf file, or --gguf-file NAME with a folder or hub id."
        raise CommandError(msg)
    src = resolve_gguf_file(args.src, args.gguf_file, args.revision)
    dst = Path(args.dst).expanduser()
    with staged_folder(dst, args.force, source=src, command="convert") as tmp, _notes():
        convert_gguf(src, tmp, sliding_window=args.sliding_window)
        check_weights_match_config(tmp, read_config(tmp), weight_headers(tmp))  # loads as a checkpoint
        written = folder_bytes(tmp)
    _err(f"Converted {src.name} into an MLX checkpoint ({human_bytes(written)}):")
    print(dst)
    return 0


def _convert_to_gguf(args: argparse.Namespace) -> int:
    """A checkpoint folder -> a GGUF file in llama.cpp's layout (written beside, then moved in place)."""
    from ..gguf_format import convert_to_gguf, is_gguf
    from ..gguf_format.write import whole_file
    from ..loading import resolve_model_path

    if is_gguf(args.src, args.gguf_file):
        msg = "convert writes a GGUF file from a checkpoint folder or hub id, not from another GGUF file."
        raise CommandError(msg)
    dst = Path(args.dst).expanduser()
    if dst.suffix != ".gguf":
        msg = f"The GGUF file to write must end in .gguf, not {dst.name!r}."
        raise CommandError(msg)
    if dst.exists() and not args.force:
        msg = f"{dst} exists; pass --force to replace it."
        raise CommandError(msg)
    src = resolve_model_path(args.src, args.revision)
    outtype = args.outtype or "f16"
    with whole_file(dst) as partial:
        convert_to_gguf(src, partial, outtype=outtype)
    _err(f"Converted {src.name} into a {outtype} GGUF file ({human_bytes(dst.stat().st_size)}):")
    print(dst)
    return 0


# --- build-test-model --------------------------------------------------------------------------------


def _cmd_build_test_model(args: argparse.Namespace) -> int:
    """build a checkpoint with random weights, offline

    Build a StarCoder2 checkpoint with random weights (the real layout), offline.
    """
    from ..testing import INSTRUCT_CHAT_TEMPLATE, build_starcoder2

    dst = Path(args.dst).expanduser()
    if args.layers is not None and args.layers < 1:
        msg = f"--layers must be at least 1, not {args.layers}."
        raise InvalidParameterError(msg)
    with staged_folder(dst, args.force, command="build-test-model") as tmp:
        build_starcoder2(
            tmp,
            preset=args.preset,
            num_layers=args.layers,
            sliding_window=args.sliding_window,
            seed=args.seed,
            dtype=args.dtype,
            quantize=args.quantize,
            chat_template=INSTRUCT_CHAT_TEMPLATE if args.instruct else None,
        )
        written = folder_bytes(tmp)
    _err(f"Built a {args.preset} StarCoder2 checkpoint with random weights ({human_bytes(written)}):")
    print(dst)
    return 0
