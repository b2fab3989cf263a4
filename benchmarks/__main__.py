"""``python -m benchmarks``: run the benchmarks and write results.json and results.md.

Examples::

    python -m benchmarks                      # the default set (~15 minutes on 2 cores)
    python -m benchmarks --quick              # fewer tokens and runs (a few minutes)
    python -m benchmarks --only cache,dtype   # some benchmarks
    python -m benchmarks --baselines          # add transformers (torch) and the roofline
    python -m benchmarks --only fullmodel     # the default model at full depth (30 layers, 4-bit)
    python -m benchmarks --only repo          # repository context: cross-file identifier recall
    python -m benchmarks --only typing --typing-repo DIR   # time to ghost text over replayed typing
    python -m benchmarks --preset tiny        # every checkpoint tiny: checks the harness in seconds
    python -m benchmarks --write-results      # also publish the table: benchmarks/results.{json,md}

Results go to ``--out`` (a working folder next to the checkpoints, outside the checkout), printed at
the end. Only ``--write-results`` replaces the committed ``benchmarks/results.json`` and
``results.md``, and only with a run on the real shapes that finished.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import time
import traceback
from pathlib import Path

from .harness import DEFAULT_WORKDIR, Checkpoints, Section, conditions, markdown_table, write_results

HERE = Path(__file__).resolve().parent
PROG = "python -m benchmarks"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    from .cases import BENCHMARKS

    names = ", ".join(BENCHMARKS)
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Benchmark langchain-starcoder on StarCoder2 checkpoints built offline.",
    )
    parser.add_argument("--only", help=f"comma-separated benchmarks to run, of: {names}")
    parser.add_argument("--skip", help="comma-separated benchmarks to leave out")
    parser.add_argument("--baselines", action="store_true", help="also run the baselines (transformers)")
    parser.add_argument("--quick", action="store_true", help="fewer tokens and runs")
    parser.add_argument(
        "--preset",
        choices=("real", "tiny"),
        default="real",
        help="'tiny' builds every checkpoint with the tiny preset: a harness check in seconds, whose "
        "speeds say nothing (the goals are the real shapes'; a tiny run's table does not judge them)",
    )
    parser.add_argument("--reps", type=int, help="interleaved rounds per comparison (default 3, quick 2)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each variant first")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help="where checkpoints are kept")
    parser.add_argument(
        "--out",
        type=Path,
        help="folder for results.json and results.md (default: WORKDIR/results, outside the checkout)",
    )
    parser.add_argument(
        "--write-results",
        action="store_true",
        help="when the run finishes, also copy its results over the published benchmarks/results.json and "
        "results.md (real preset only)",
    )
    parser.add_argument("--tokenizer", type=Path, help="tokenizer.json or checkpoint for --only repo counts")
    parser.add_argument(
        "--typing-repo",
        type=Path,
        help="a git repository whose history --only typing replays (default: a small one made on the spot)",
    )
    parser.add_argument("--no-openblas", action="store_true", help="leave out the OpenBLAS variants")
    parser.add_argument("--keep-going", action="store_true", help="report a failing benchmark and go on")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the table")
    return parser


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """Run the benchmarks the arguments select; 0 on success (missed goals are results, not errors).
    ``prog`` is the command named in the help and the results (``langchain-starcoder bench`` runs this)."""
    from .cases import BENCHMARKS, OPTIONAL, Context

    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.write_results and args.preset != "real":
        parser.error(
            f"--write-results publishes the table of the real shapes; a --preset {args.preset} "
            "run never replaces it (its results go to --out)"
        )
    out = args.out or args.workdir / "results"
    selected = [n for n in BENCHMARKS if n not in OPTIONAL or (args.baselines and n == "baselines")]
    if args.only:
        selected = _names(args.only, BENCHMARKS)
    if args.skip:
        skip = _names(args.skip, BENCHMARKS)
        selected = [n for n in selected if n not in skip]
    tiny = args.preset == "tiny"
    reps = args.reps or (1 if tiny else 2 if args.quick else 3)

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    ctx = Context(
        Checkpoints(args.workdir, tiny=tiny, log=log),
        quick=args.quick,
        reps=reps,
        warmup=args.warmup,
        log=log,
        openblas=not args.no_openblas,
        tokenizer=args.tokenizer,
        typing_repo=args.typing_repo,
    )
    meta = {
        "command": f"{prog} " + shlex.join(argv if argv is not None else sys.argv[1:]),
        "selected": selected,
        "quick": args.quick,
        "preset": args.preset,
        "reps": reps,
        "warmup": args.warmup,
        "conditions": conditions(),
    }
    sections: list[Section] = []
    failed = False
    for name in selected:
        log(f"[{name}] ...")
        start = time.perf_counter()
        try:
            section = BENCHMARKS[name](ctx)
        except Exception:
            if not args.keep_going:
                raise
            failed = True
            section = Section(
                name, 0, name, skipped="failed: " + traceback.format_exc(limit=1).strip()[-300:]
            )
            log(traceback.format_exc())
        section.seconds = time.perf_counter() - start
        sections.append(section)
        log(f"[{name}] {section.seconds:.0f} s")
        write_results(sections, meta, out / "results.json", out / "results.md")  # survive a crash
    print(markdown_table(sections, args.preset))
    if args.write_results and not failed:
        for name in ("results.json", "results.md"):
            shutil.copyfile(out / name, HERE / name)
        log(f"Published to {HERE / 'results.json'} and {HERE / 'results.md'}.")
    print(f"\nResults: {out / 'results.json'} and {out / 'results.md'}", file=sys.stderr)
    return 1 if failed else 0


def _names(value: str, known: dict) -> list[str]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {unknown}; choose from {', '.join(known)}")
    return names


if __name__ == "__main__":
    sys.exit(main())
