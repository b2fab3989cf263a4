"""The options several commands share (the model, the generation settings) and their defaults."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The same as ``registry.DEFAULT_MODEL``, repeated because importing the registry imports MLX.
DEFAULT_MODEL = "mlx-community/starcoder2-3b-4bit"
#: ``testing.PRESETS``'s names, repeated because importing it imports numpy (checked by a test).
PRESET_NAMES = ("tiny", "small", "3b", "7b", "15b")
#: ``testing.MODEL_ENV`` (the model when none is given), repeated: importing testing imports numpy.
MODEL_ENV = "LANGCHAIN_STARCODER_MODEL"
FILL_MARKER = "<FILL>"
#: Read by ``serve`` when --api-key is not given (keeps the key out of the process list).
API_KEY_ENV = "LANGCHAIN_STARCODER_API_KEY"
#: ``serve``'s prompt-cache folder when --prompt-cache-dir is not given (else the user's cache folder).
PROMPT_CACHE_ENV = "LANGCHAIN_STARCODER_PROMPT_CACHE_DIR"
DEFAULT_PROMPT_CACHE_HELP = (
    f"${PROMPT_CACHE_ENV}, else $XDG_CACHE_HOME/langchain-starcoder/prompt-cache, else ~/.cache/..."
)
#: The key sent to a --base-url server (the wrappers' ``api_key`` reads it too).
REMOTE_KEY_ENV = "STARCODER_API_KEY"


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def _unescape(text: str) -> str:
    r"""Turn the escapes ``\n``, ``\t``, ``\r`` and ``\\`` typed on a command line into characters."""
    return re.sub(r"\\([ntr\\])", lambda m: _ESCAPES[m.group(1)], text)


def _model_option(group: argparse.ArgumentParser | argparse._ArgumentGroup, gguf: bool = False) -> None:
    kinds = "hub id, local checkpoint folder or .gguf file" if gguf else "hub id or local checkpoint folder"
    group.add_argument(
        "--model",
        default=os.environ.get(MODEL_ENV, DEFAULT_MODEL),
        help=f"{kinds} (default: ${MODEL_ENV}, else {DEFAULT_MODEL})",
    )
    group.add_argument("--revision", help="hub branch, tag or commit")


def _gguf_options(group: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--gguf-file", metavar="NAME", help="the GGUF file to load from the folder or hub repo"
    )
    group.add_argument(
        "--sliding-window",
        type=int,
        metavar="N",
        help="GGUF only: the attention window (0: full attention; default StarCoder2's 4096)",
    )


def _model_args(parser: argparse.ArgumentParser, *, named_adapters: bool = False) -> None:
    """The model and how it loads; ``named_adapters`` (serve): ``--adapter`` repeats, as ``NAME=DIR``."""
    group = parser.add_argument_group("model")
    _model_option(group, gguf=True)
    _gguf_options(group)
    group.add_argument(
        "--quantize", type=int, choices=(4, 8), help="quantize a full-precision checkpoint on load"
    )
    group.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "float16", "bfloat16"),
        help="compute dtype (auto: float32 on the CPU, the checkpoint's on a GPU)",
    )
    group.add_argument("--kv-bits", type=int, choices=(4, 8), help="quantize the KV cache")
    if named_adapters:
        group.add_argument(
            "--adapter",
            action="append",
            metavar="[NAME=]DIR",
            help="a fine-tuning adapter's folder: DIR alone runs the model with it; NAME=DIR, repeated, "
            "serves each beside the base, picked per request by model=NAME or by lora (docs/server.md)",
        )
    else:
        group.add_argument(
            "--adapter",
            type=Path,
            metavar="DIR",
            help="a fine-tuning adapter's folder (from langchain-starcoder finetune or mlx_lm.lora)",
        )
    group.add_argument(
        "--prompt-cache-dir",
        type=Path,
        metavar="DIR",
        help="keep long prompt caches in DIR, so a later run reuses a prefilled repository context "
        "(serve: default " + DEFAULT_PROMPT_CACHE_HELP + ")",
    )
    where = parser.add_argument_group("where the model runs (docs/scaling-out.md)")
    where.add_argument(
        "--backend",
        choices=("mlx", "llama.cpp"),
        default="mlx",
        help="mlx: in this process (default); llama.cpp: a llama-server this command starts and stops "
        "(the llama-cpp extra; much faster on a Linux CPU; a folder is converted to GGUF once, cached)",
    )
    where.add_argument("--llama-threads", type=int, metavar="N", help="llama.cpp: CPU threads (default: all)")
    where.add_argument("--llama-slots", type=int, metavar="N", help="llama.cpp: requests decoded together")
    where.add_argument(
        "--llama-context", type=int, metavar="N", help="llama.cpp: tokens per request (default: the window)"
    )
    where.add_argument(
        "--inexact-past-window",
        action="store_true",
        help="llama.cpp: allow StarCoder2 requests past the sliding window, which llama.cpp ignores "
        "(answers there differ from the model's)",
    )
    where.add_argument(
        "--base-url",
        metavar="URL",
        help="run on this vLLM or llama.cpp server instead; --model is the served model's name",
    )
    where.add_argument(
        "--tokenizer", help="with --base-url: checkpoint folder, hub id or .gguf to take the tokenizer from"
    )
    where.add_argument(
        "--remote-api-key",
        metavar="KEY",
        default=os.environ.get(REMOTE_KEY_ENV),
        help=f"with --base-url: the server's API key (default: ${REMOTE_KEY_ENV})",
    )


#: The load options the model flags set: each option's field (``MLXOptions``, ``LlamaCppOptions``) and its
#: flag, whose ``args`` name is the flag's.
LOAD_FLAGS = {
    "revision": "--revision",
    "gguf_file": "--gguf-file",
    "sliding_window": "--sliding-window",
    "quantize": "--quantize",
    "dtype": "--dtype",
    "kv_bits": "--kv-bits",
    "prompt_cache_dir": "--prompt-cache-dir",
    "adapter_path": "--adapter",
    "threads": "--llama-threads",
    "slots": "--llama-slots",
    "context": "--llama-context",
    "inexact_past_window": "--inexact-past-window",
}


def load_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The load options the flags give, by field (the keywords of ``StarCoderEngine.load``)."""
    return {name: getattr(args, flag[2:].replace("-", "_")) for name, flag in LOAD_FLAGS.items()}


def default_prompt_cache_dir() -> Path:
    """Where ``serve`` keeps prompt caches unless told otherwise: $LANGCHAIN_STARCODER_PROMPT_CACHE_DIR,
    else the user's cache folder."""
    if os.environ.get(PROMPT_CACHE_ENV):
        return Path(os.environ[PROMPT_CACHE_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "langchain-starcoder" / "prompt-cache"


def _speculation_args(parser: argparse.ArgumentParser) -> None:
    """Speculative decoding, the same on every command that generates (generate, infill, serve)."""
    parser.add_argument_group("speculative decoding (docs/engine.md)").add_argument(
        "--prompt-lookup",
        type=int,
        metavar="N",
        help="prompt lookup for greedy generation: drafts of up to N tokens from the prompt, verified in "
        "one pass, same output (default: where it pays; 0: off; serve: a request's "
        "prompt_lookup_num_tokens wins)",
    )


def _generation_args(parser: argparse.ArgumentParser, max_tokens: int) -> None:
    group = parser.add_argument_group("generation")
    group.add_argument("--max-tokens", type=int, default=max_tokens, help=f"default {max_tokens}")
    group.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    group.add_argument("--top-p", type=float, default=1.0)
    group.add_argument("--top-k", type=int, default=0)
    group.add_argument("--min-p", type=float, default=0.0)
    group.add_argument("--repetition-penalty", type=float)
    group.add_argument("--seed", type=int, help="makes sampling reproducible")
    group.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help=r"stop string, repeatable; \n and \t are understood (e.g. --stop '\ndef ')",
    )
    _speculation_args(parser)


def picked(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The parsed options ``names``, as keywords of the same names."""
    return {name: getattr(args, name) for name in names}


def _generation(args: argparse.Namespace) -> dict[str, Any]:
    """The generation settings, validated before any model is loaded."""
    from ..types import GenerationParams

    names = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed")
    settings = picked(args, *names)
    settings["stop"] = [_unescape(s) for s in args.stop]
    settings["prompt_lookup_num_tokens"] = args.prompt_lookup
    GenerationParams.create(**settings)
    return settings


def _serve_positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    """An argparse type for a serve bound: a number above 0."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not 0 < value < float("inf"):
            msg = f"expected a {kind.__name__} above 0, got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its error
    return parse
