"""The ``bench`` command: the repository's benchmarks, run in a child process with the arguments as typed."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys

from .output import PROG, CommandError


def _run_bench(argv: list[str]) -> int:
    """Run ``python -m benchmarks ARGS`` in a child process. The benchmarks live in the repository, not the
    wheel, and the package never imports them."""
    # The child's sys.path starts with the working directory, as `python -m` does.
    spec = importlib.machinery.PathFinder.find_spec("benchmarks", [os.getcwd(), *sys.path])
    if spec is None or not spec.submodule_search_locations:
        msg = (
            "The benchmarks are not installed with the package. Run them from a checkout of the "
            "repository: `git clone <repo> && cd langchain-starcoder && pip install -e '.[test]' && "
            f"{PROG} bench` (or `python -m benchmarks`) from its root folder."
        )
        raise CommandError(msg)
    # As `python -m benchmarks` (the working directory first on sys.path), but named as it was typed.
    run = "import sys; from benchmarks.__main__ import main; sys.exit(main(sys.argv[2:], prog=sys.argv[1]))"
    return subprocess.call([sys.executable, "-c", run, f"{PROG} bench", *argv])


def _split_bench(argv: list[str]) -> tuple[bool, list[str]] | None:
    """``[-v] bench ARGS...`` -> (verbose, ARGS); None for any other command."""
    verbose = False
    for i, arg in enumerate(argv):
        if arg in ("-v", "--verbose"):
            verbose = True
        elif arg == "bench":
            return verbose, argv[i + 1 :]
        else:
            return None
    return None
