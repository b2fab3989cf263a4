"""The argument parser: every command, its options and the function that runs it."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from .._version import __version__
from .checkpoint import _cmd_build_test_model, _cmd_convert, _cmd_quantize
from .evaluate import _cmd_compare, _cmd_eval, _compare_args, _eval_args
from .export_adapter import _cmd_export_adapter, _export_adapter_args
from .finetune import _cmd_finetune, _finetune_args
from .model import _cmd_generate, _cmd_infill, _cmd_info
from .options import (
    API_KEY_ENV,
    FILL_MARKER,
    PRESET_NAMES,
    _generation_args,
    _gguf_options,
    _model_args,
    _model_option,
    _serve_positive,
    _speculation_args,
)
from .output import PROG
from .serve import _cmd_serve


class _ArgumentError(Exception):
    """argparse's complaint, raised instead of printing usage and exiting, so ``main`` says it in one line."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _ArgumentError(self.prog, message)


def _info_args(p: argparse.ArgumentParser) -> None:
    _model_option(p, gguf=True)
    _gguf_options(p)
    p.add_argument("--json", action="store_true", help="print JSON")


def _serve_command_args(p: argparse.ArgumentParser) -> None:
    _model_args(p, named_adapters=True)
    _serve_args(p)
    _speculation_args(p)
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))


def build_parser() -> argparse.ArgumentParser:
    common = _common_options()
    parser = _Parser(
        prog=PROG,
        description="StarCoder2 code models on MLX: generate, fill in the middle, quantize, inspect.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    for handler, add_options in (
        (_cmd_generate, _generate_args),
        (_cmd_infill, _infill_args),
        (_cmd_quantize, _quantize_args),
        (_cmd_convert, _convert_args),
        (_cmd_build_test_model, _build_args),
        (_cmd_info, _info_args),
        (_cmd_serve, _serve_command_args),
        (_cmd_eval, _eval_args),
        (_cmd_compare, _compare_args),
        (_cmd_finetune, _finetune_args),
        (_cmd_export_adapter, _export_adapter_args),
    ):
        _add_command(sub, common, handler, add_options)

    # Parsed by hand in main(): everything after "bench" goes to the benchmarks untouched.
    sub.add_parser("bench", help="run the benchmarks (from a checkout): bench --help", add_help=False)
    return parser


def _add_command(
    sub: Any,
    common: argparse.ArgumentParser,
    handler: Callable[[argparse.Namespace], int],
    add_options: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Add the command ``handler`` runs, as click does: named after it (``_cmd_export_adapter``:
    ``export-adapter``), its one-line help its docstring's first line, its description the rest."""
    name = handler.__name__.removeprefix("_cmd_").replace("_", "-")
    summary, _, description = (inspect.getdoc(handler) or "").partition("\n")
    p = sub.add_parser(name, parents=[common], help=summary, description=description.strip())
    p.set_defaults(func=handler)
    add_options(p)


def _common_options() -> argparse.ArgumentParser:
    """The options every command takes (a parent parser)."""
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand's default must not overwrite a --verbose given before it.
    common.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors"
    )
    return common


def _generate_args(p: argparse.ArgumentParser) -> None:
    """generate's prompt (given as text or read from a file), the model and the generation settings."""
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="the prompt text (special tokens such as <fim_prefix> are parsed)")
    source.add_argument("--file", type=Path, help="read the prompt from a file ('-' for stdin)")
    _model_args(p)
    _generation_args(p, max_tokens=256)


def _quantize_args(p: argparse.ArgumentParser) -> None:
    _source_and_destination(p, "full-precision checkpoint: folder or hub id", "folder to write")
    p.add_argument("--bits", type=int, choices=(4, 8), default=4)
    p.add_argument("--group-size", type=int, choices=(32, 64, 128), default=64)
    p.add_argument("--no-verify", action="store_true", help="skip loading the result to check it")


def _convert_args(p: argparse.ArgumentParser) -> None:
    sources = "a .gguf file (a folder or hub id with --gguf-file), or a checkpoint"
    _source_and_destination(p, sources, "folder to write, or a .gguf file")
    p.add_argument(
        "--outtype",
        choices=("f32", "f16", "q8_0", "q4_0"),
        help="type of the 2-D weights of a GGUF DST (default f16; q4_0 through llama-quantize)",
    )
    _gguf_options(p)


def _build_args(p: argparse.ArgumentParser) -> None:
    """build-test-model's checkpoint: a preset, optionally smaller, in a dtype or quantized."""
    p.add_argument("dst", metavar="DST", type=Path, help="folder to write")
    p.add_argument("--preset", choices=PRESET_NAMES, default="tiny")
    p.add_argument("--layers", type=int, help="number of layers (keeps a big preset small)")
    p.add_argument("--sliding-window", type=int, help="attention window (0: full attention)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    p.add_argument("--quantize", type=int, choices=(4, 8), help="write it quantized (float16 scales)")
    p.add_argument("--instruct", action="store_true", help="give it an instruct chat template")
    p.add_argument("--seed", type=int, default=0)
    _force_option(p, "built here")


def _infill_args(p: argparse.ArgumentParser) -> None:
    """The hole (a marked file, or --prefix and --suffix), its repository context, layout and end; the
    model and the generation settings."""
    p.add_argument("--file", type=Path, help=f"a file with exactly one {FILL_MARKER} marker")
    p.add_argument("--prefix", help=r"the code before the hole, instead of --file (\n understood)")
    p.add_argument("--suffix", help="the code after the hole")
    p.add_argument("--marker", default=FILL_MARKER, help=f"the hole marker (default {FILL_MARKER})")
    p.add_argument(
        "--context", type=Path, nargs="+", default=[], metavar="FILE", help="other files of the repository"
    )
    p.add_argument("--repo-name", help="the repository's name (StarCoder2 repository-level FIM)")
    p.add_argument(
        "--file-path", help="the hole's path in the repository (default: --file, when there is context)"
    )
    _repo_option(
        p,
        "pick context from this repository's code (docs/repository-context.md); default: the git "
        "root of --file (the nearest folder above it holding .git); without one, and with --prefix, "
        "no repository context. --context files win over it",
    )
    p.add_argument(
        "--no-repo", action="store_true", help="no repository context, even inside a git repository"
    )
    p.add_argument("--mode", choices=("psm", "spm"), default="psm")
    p.add_argument(
        "--end",
        choices=("auto", "line", "block", "none"),
        default="auto",
        help="where decoding stops: auto (default: where the code says the hole is filled), the cursor's "
        "line, its block, or none (the model's end, --stop or --max-tokens only)",
    )
    p.add_argument("--max-prompt-tokens", type=int, help="token budget of the prompt (default: the context)")
    p.add_argument("--write", action="store_true", help="fill the file in place (the original goes to F.bak)")
    _model_args(p)
    _generation_args(p, max_tokens=128)


def _source_and_destination(p: argparse.ArgumentParser, source: str, destination: str) -> None:
    """SRC and DST of a command that writes a checkpoint from another, SRC's hub revision, --force."""
    p.add_argument("src", metavar="SRC", help=source)
    p.add_argument("dst", metavar="DST", type=Path, help=destination)
    p.add_argument("--revision", help="hub branch, tag or commit of SRC")
    _force_option(p, "this command wrote")


def _force_option(p: argparse.ArgumentParser, written_by: str) -> None:
    p.add_argument("--force", action="store_true", help=f"replace DST if it is a checkpoint {written_by}")


def _repo_option(p: argparse.ArgumentParser, text: str) -> None:
    p.add_argument("--repo", type=Path, metavar="DIR", help=text)


#: serve's bounds: flag, type, default, metavar, help (each a number above 0).
_SERVE_BOUNDS: tuple[tuple[str, type[int] | type[float], float | None, str, str], ...] = (
    (
        "--max-body-mb",
        float,
        4.0,
        "MB",
        "refuse (413) a request body over MB MiB before reading it whole (default 4)",
    ),
    (
        "--max-connections",
        int,
        None,
        "N",
        "open connections at most; when full, the one waiting longest for "
        "its request is closed (default 512, or half the open-file limit if lower)",
    ),
    (
        "--request-timeout",
        float,
        20.0,
        "S",
        "close a connection whose request (headers and body) has not come in S seconds (default 20)",
    ),
    (
        "--keep-alive-timeout",
        float,
        5.0,
        "S",
        "close an idle keep-alive connection after S seconds (default 5)",
    ),
)


def _serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=8080, help="default 8080")
    p.add_argument(
        "--api-key",
        action="append",
        metavar="KEY",
        help="require 'Authorization: Bearer KEY'; repeat it for several keys. Each key is a tenant: its "
        "documents (supersession, stable prefix, context order) and prompt cache (and the cached-token "
        f"counts) are its own (default: ${API_KEY_ENV}, else no key: ONE tenant, so every client shares "
        "them and can see another's effects on them; docs/security.md)",
    )
    p.add_argument(
        "--api-key-file",
        type=Path,
        metavar="PATH",
        help="read keys from PATH, one per line (blank lines and # comments skipped), each a tenant",
    )
    p.add_argument(
        "--parse-special-tokens",
        action="store_true",
        help="parse control-token strings (<fim_prefix>...) in /v1/completions text prompts (default: data)",
    )
    p.add_argument("--model-name", help="the model id the API reports (default: --model)")
    p.add_argument(
        "--no-prompt-cache",
        action="store_true",
        help="keep no prompt caches on disk (default: keep them, see --prompt-cache-dir)",
    )
    _repo_option(
        p,
        "add this repository's context to /infill and /v1/completions (with suffix) requests that "
        "send file_path (relative to DIR), after the client's input_extra (default: none)",
    )
    p.add_argument(
        "--no-supersede",
        action="store_true",
        help="let a client's older /infill (or /v1/completions with suffix) request for a document run on "
        "when it sends a newer one (default: the older is cancelled; docs/server.md, 'While you type')",
    )
    p.add_argument(
        "--no-stable-prefix",
        action="store_true",
        help="send /infill's input_prefix window as it is (default: when the window slid down the file, put "
        "back the lines it dropped, so the prompt cache serves the prefix; docs/server.md, 'While you type')",
    )
    p.add_argument(
        "--fim-mode",
        choices=("psm", "spm"),
        default="psm",
        help="the FIM layout of /infill and /v1/completions with suffix (default psm; spm puts the suffix "
        "first, so a keystroke at the hole prefills only the prefix's end)",
    )
    p.add_argument(
        "--batch-window-ms",
        type=float,
        default=0,
        metavar="MS",
        help="batch non-streamed requests with the same settings that arrive within MS of each other "
        "(default 0: off, each request reuses the prompt cache)",
    )
    for flag, kind, default, metavar, text in _SERVE_BOUNDS:
        p.add_argument(flag, type=_serve_positive(kind), default=default, metavar=metavar, help=text)
