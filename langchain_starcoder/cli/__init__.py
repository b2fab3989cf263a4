"""The ``langchain-starcoder`` command: generate, fill in the middle, quantize, inspect and benchmark.

A package: the parser (``parser``), one function per command in the module of its kind (``model``,
``checkpoint``, ``serve``, ``bench``) and what they print (``output``); the library work is in the
checkpoints package.

.. code-block:: bash

    langchain-starcoder generate --model mlx-community/starcoder2-3b-4bit --prompt "def fib(n):"
    langchain-starcoder infill --model M --file app.py --context utils.py --repo-name my/app
    langchain-starcoder quantize bigcode/starcoder2-3b ./starcoder2-3b-4bit --bits 4
    langchain-starcoder convert starcoder2-3b-Q4_0.gguf ./starcoder2-3b-q4
    langchain-starcoder build-test-model ./tiny --preset tiny
    langchain-starcoder info --model ./starcoder2-3b-4bit
    langchain-starcoder serve --model ./starcoder2-3b-4bit --port 8080
    langchain-starcoder bench --help

Generated text goes to stdout and nothing else does: progress, statistics and errors go to stderr, so
``langchain-starcoder generate ... > out.py`` captures just the code. An error prints one line and
exits non-zero; ``--verbose`` adds the traceback. Argparse and commands only (the library behind them is
:mod:`langchain_starcoder.checkpoints`); MLX loads inside the commands that need it, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence

from .._progress import show_progress
from ..errors import StarCoderError
from .bench import _run_bench, _split_bench
from .model import git_root, split_marker
from .options import API_KEY_ENV, DEFAULT_MODEL, FILL_MARKER, MODEL_ENV, PRESET_NAMES
from .output import PROG, CommandError, _err, _quiet_broken_pipe, _stats
from .parser import _ArgumentError, build_parser

__all__ = [
    "API_KEY_ENV",
    "DEFAULT_MODEL",
    "FILL_MARKER",
    "MODEL_ENV",
    "PRESET_NAMES",
    "PROG",
    "CommandError",
    "_stats",
    "build_parser",
    "git_root",
    "main",
    "split_marker",
]


def _dispatch(argv: list[str], bench: list[str] | None) -> int:
    if bench is not None:
        return _run_bench(bench)
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    with show_progress():  # long work (converting, building, a long prefill) shows it on stderr
        return func(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (0 on success)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    bench = _split_bench(argv)
    verbose = bench[0] if bench is not None else any(a in ("-v", "--verbose") for a in argv)
    try:
        return _dispatch(argv, bench[1] if bench is not None else None)
    except _ArgumentError as e:
        _err(f"{e.prog}: error: {e} (see {e.prog} --help)")
        return 2
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BrokenPipeError:
        _quiet_broken_pipe()
        return 0
    except (KeyboardInterrupt, Exception) as e:
        if verbose:
            traceback.print_exc()
        if isinstance(e, KeyboardInterrupt):
            _err(f"{PROG}: interrupted.")
            return 130
        if isinstance(e, StarCoderError):
            _err(f"{PROG}: error: {e}")
        else:
            hint = "" if verbose else " (run with --verbose for the traceback)"
            _err(f"{PROG}: unexpected error: {type(e).__name__}: {e}{hint}")
        return 1
