"""``eval``: how well a model completes holes cut from a repository's own code, per configuration.

Holes are cut (``evaluation.cut_holes``) before the model loads, so a bad argument costs nothing; the
completions run through the in-process engine, or a server's with ``--base-url`` (``--endpoint``: its
/infill or /v1/completions, as editors send holes); the table of means and
paired differences goes to stdout, the report to ``--out``. Ctrl-C keeps the completions done.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import warnings
from pathlib import Path
from typing import Any

from .options import _model_args
from .output import PROG, CommandError, _err, _notes

#: Seconds --exec's command may run per prediction unless --exec-timeout says (the library's default).
DEFAULT_EXEC_TIMEOUT = 60.0
#: The configurations compared unless --configs names others.
DEFAULT_CONFIGS = "psm,spm,psm+repo"
#: What completes the holes: the engine (here or over --base-url), or a --base-url server's endpoint.
ENDPOINTS = ("engine", "infill", "completions")
#: Generated tokens per hole unless --max-tokens says (a hole is a line, a block's body, a call's arguments).
DEFAULT_EVAL_TOKENS = 128


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        msg = f"must be a positive integer, not {text}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        msg = f"must be a positive number of seconds, not {text}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _eval_args(p: argparse.ArgumentParser) -> None:
    """eval's options: the repository, the holes, the configurations, the report; the model's."""
    p.add_argument(
        "repo", metavar="REPO", type=Path, help="the repository's folder (its files are the holes)"
    )
    p.add_argument(
        "--configs",
        default=DEFAULT_CONFIGS,
        help="comma-separated configurations: psm or spm, with +repo for repository context (+repo=N: "
        f"within N tokens) and +noend for the middle-end rule off (default {DEFAULT_CONFIGS}); each "
        "after the first is compared with the first",
    )
    p.add_argument("--holes", type=_positive, default=200, metavar="N", help="how many holes (default 200)")
    p.add_argument(
        "--kinds",
        default="line,span,block,call,cross_file",
        help="comma-separated hole kinds: line, span, block, call, cross_file (default: all)",
    )
    p.add_argument(
        "--languages",
        metavar="LANGS",
        help="comma-separated tree-sitter languages whose files are cut (python,go...; default: all)",
    )
    p.add_argument("--since", metavar="REV", help="only holes in lines added after this git revision")
    p.add_argument(
        "--seed", type=int, default=0, help="which holes are cut (default 0; the same seed, the same)"
    )
    p.add_argument("--out", type=Path, metavar="FILE", help="write the report (every hole's record) as JSON")
    p.add_argument(
        "--exec",
        dest="exec_command",
        metavar="CMD",
        help="a shell command that runs the repository's tests: each prediction is run with it in place, "
        "in a temporary copy, without the network where the platform allows, and pass@1 reported",
    )
    p.add_argument(
        "--exec-timeout",
        type=_seconds,
        default=DEFAULT_EXEC_TIMEOUT,
        metavar="S",
        help=f"seconds --exec's command may run per prediction (default {DEFAULT_EXEC_TIMEOUT:g})",
    )
    p.add_argument(
        "--max-tokens",
        type=_positive,
        default=DEFAULT_EVAL_TOKENS,
        help=f"per hole (default {DEFAULT_EVAL_TOKENS})",
    )
    p.add_argument(
        "--max-prompt-tokens",
        type=_positive,
        help="the prompt's budget, context included (default: the window)",
    )
    _model_args(p)
    _endpoint_args(p)


def _endpoint_args(p: argparse.ArgumentParser) -> None:
    """Which of a --base-url server's endpoints completes the holes (evaluation.targets)."""
    p.add_argument(
        "--endpoint",
        choices=ENDPOINTS,
        default="engine",
        help="with --base-url: engine (default: prompts built here, sent as token ids), infill (the "
        "server's /infill, as llama.vim sends it: +repo context as input_extra) or completions "
        "(/v1/completions with suffix, as Continue sends it: no +repo); --tokenizer FOLDER counts the "
        "context's tokens here, else the server's /tokenize does (a request per count)",
    )
    p.add_argument(
        "--server-fim-mode",
        choices=("psm", "spm"),
        default="psm",
        help="with --endpoint infill or completions: the server's FIM layout (serve --fim-mode); "
        "configurations in the other one are recorded as errors (default psm)",
    )


def _cmd_eval(args: argparse.Namespace) -> int:
    """evaluate completions on holes cut from a repository, per configuration

    Cut holes from a repository's own files (the rest of a line, a span, a block's body, a call's
    arguments, a name defined in another file), complete each under each configuration, score them as
    CrossCodeEval does and print each configuration's means, and each later one's paired difference
    against the first with its bootstrap 95% interval (docs/cli.md).
    """
    # Cut, complete, score; print the table and write the report. Exit 2 for a bad argument, 130 for
    # Ctrl-C (after printing and writing what was done).
    try:
        holes, index = _holes(args)
    except CommandError as e:
        _err(f"{PROG}: error: {e}")
        return 2
    from ..evaluation import evaluate

    try:
        engine = _target(args)
    except CommandError as e:
        _err(f"{PROG}: error: {e}")
        return 2
    try:
        with _notes():
            report = evaluate(
                engine,
                holes,
                args.configs,
                repo=index,
                max_tokens=args.max_tokens,
                max_prompt_tokens=args.max_prompt_tokens,
                exec_command=args.exec_command,
                exec_timeout=args.exec_timeout,
            )
    finally:
        engine.close()
    report.metadata.update(kinds=args.kinds, seed=args.seed, since=args.since, base_url=args.base_url)
    report.metadata.update(languages=args.languages, endpoint=args.endpoint)
    print(format_table(report), flush=True)
    if args.out is not None:
        _save(report, args.out)
        _err(f"Wrote {len(report.records)} records to {args.out}.")
    if report.metadata.get("interrupted"):
        done, total = len(report.records), len(holes) * len(report.metadata["configs"])
        _err(f"{PROG}: interrupted after {done} of {total} completions; the figures are of those.")
        return 130
    return 0


def _target(args: argparse.Namespace) -> Any:
    """The engine (here, or over --base-url), or the --base-url server's /infill or /v1/completions."""
    from .model import _load_engine

    if args.endpoint == "engine":
        return _load_engine(args)
    from ..evaluation import CompletionsEndpoint, InfillEndpoint
    from .options import DEFAULT_MODEL, LOAD_FLAGS, MODEL_ENV, load_settings

    if args.base_url is None:
        msg = f"--endpoint {args.endpoint} is a server's: give its --base-url URL."
        raise CommandError(msg)
    given = [
        LOAD_FLAGS[name] for name, value in load_settings(args).items() if value not in (None, False, "auto")
    ]
    given += ["--backend"] if args.backend != "mlx" else []
    given += ["--max-prompt-tokens"] if args.max_prompt_tokens is not None else []
    if given:
        msg = (
            f"{', '.join(given)} cannot go to --endpoint {args.endpoint}: the server loads the model and "
            "fits the prompt to its window."
        )
        raise CommandError(msg)
    kind = InfillEndpoint if args.endpoint == "infill" else CompletionsEndpoint
    named = args.model != os.environ.get(MODEL_ENV, DEFAULT_MODEL)  # else the served model's own name
    target = kind(
        args.base_url,
        api_key=args.remote_api_key,
        model=args.model if named else None,
        fim_mode=args.server_fim_mode,
        count_tokens=_local_count(args.tokenizer) if args.tokenizer is not None else None,
    )
    _err(f"Completing through {args.base_url}{kind.path} (its FIM layout: {args.server_fim_mode}).")
    return target


def _local_count(folder: str) -> Any:
    """Token counts by the --tokenizer checkpoint's tokenizer, here (as the engine counts: control
    tokens parsed): the repository context's budget without a /tokenize request per count."""
    from .._tokens import parsing_encoder
    from ..loading import load_tokenizer, read_config

    path = Path(folder).expanduser()
    if not path.is_dir():
        msg = f"--tokenizer {folder}: with --endpoint, give the served model's checkpoint folder."
        raise CommandError(msg)
    encode = parsing_encoder(load_tokenizer(path, read_config(path)))
    return lambda text: len(encode(text))


def _holes(args: argparse.Namespace) -> tuple[list[Any], Any]:
    """The holes and the repository index, every argument checked before the model loads."""
    from ..errors import InvalidParameterError
    from ..evaluation import cut_holes, parse_configs
    from ..evaluation.holes import HoleNotice
    from ..repo import RepoIndex

    if not args.repo.is_dir():
        msg = f"{args.repo} is not a folder: give the repository's root folder."
        raise CommandError(msg)
    if args.out is not None and not args.out.parent.is_dir():
        msg = f"--out {args.out}: the folder {args.out.parent} does not exist."
        raise CommandError(msg)
    try:
        parse_configs(args.configs)
        index = RepoIndex(args.repo)
        languages = None if args.languages is None else [x.strip() for x in args.languages.split(",")]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", HoleNotice)
            holes = cut_holes(
                index, kinds=args.kinds, n=args.holes, seed=args.seed, since=args.since, languages=languages
            )
    except InvalidParameterError as e:
        raise CommandError(str(e)) from e
    if args.exec_command is not None and not args.exec_command.strip():
        msg = "--exec needs a command that runs the repository's tests ('pytest -x -q'), not an empty one."
        raise CommandError(msg)
    if not holes:
        since = f" in lines added since {args.since}" if args.since else ""
        msg = f"{args.repo} has no holes of the kinds {args.kinds}{since} (no code of them to cut)."
        raise CommandError(msg)
    for w in caught:  # a kind with no place in the repository: the others took its share
        if issubclass(w.category, HoleNotice):
            _err(f"{PROG}: note: {w.message}")
    _err(f"Cut {len(holes)} holes from {len(index.files)} files of {args.repo} (seed {args.seed}).")
    return holes, index


def _compare_args(p: argparse.ArgumentParser) -> None:
    """compare's options: the reports, their names, the combined report."""
    p.add_argument(
        "reports",
        metavar="REPORT",
        type=Path,
        nargs="+",
        help="eval --out files of the same holes (two or more)",
    )
    p.add_argument(
        "--names",
        metavar="A,B,...",
        help="a name for each report, in order (default: the files' names without .json)",
    )
    p.add_argument("--out", type=Path, metavar="FILE", help="write the combined report as JSON")


def _cmd_compare(args: argparse.Namespace) -> int:
    """compare evaluation reports of the same holes, paired hole by hole

    Read eval --out reports of runs on the same holes (the same --seed, --kinds, --holes and files: the
    base and the base with an adapter, two servers, two checkpoints) and print each run's means, then each
    later run's paired difference against the first with its bootstrap 95% interval (docs/cli.md).
    """
    from ..errors import InvalidParameterError
    from ..evaluation import EvalReport

    names = args.names.split(",") if args.names else [path.stem for path in args.reports]
    try:
        if len(names) != len(args.reports) or len(set(names)) != len(names):
            msg = f"--names needs {len(args.reports)} different names, one per report, not {args.names!r}."
            raise InvalidParameterError(msg)
        report = EvalReport.combined(
            {name: EvalReport.load(path) for name, path in zip(names, args.reports, strict=True)}
        )
        if args.out is not None:
            _save(report, args.out)
    except (InvalidParameterError, CommandError) as e:
        _err(f"{PROG}: error: {e}")
        return 2
    print(format_table(report), flush=True)
    return 0


def _save(report: Any, out: Path) -> None:
    """``report.save`` to a file beside ``out``, then renamed over it: never a half-written report."""
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        report.save(partial)
        os.replace(partial, out)
    except OSError as e:
        with contextlib.suppress(OSError):
            partial.unlink()
        msg = f"Cannot write the report to {out}: {e.strerror or e}."
        raise CommandError(msg) from e


def format_table(report: Any) -> str:
    """Each configuration's mean of every metric, then each later one's paired difference against the
    first with its bootstrap 95% interval (``*``: the interval leaves out 0)."""
    from ..errors import InvalidParameterError
    from ..evaluation.report import METRICS, PASS_AT_1

    rows = report.summary("config")
    # pass@1 where --exec judged some prediction (the same holes' pairs, as the other metrics)
    shown = (*METRICS, PASS_AT_1) if any(r.passed is not None for r in report.records) else METRICS
    head = ["config", "n", "errors", *shown]
    lines = [head] + [
        [r["config"], str(r["n"]), str(r["errors"]), *(_shown(m, r[m]) for m in shown)] for r in rows
    ]
    text = [_aligned(lines)]
    configs = report.configs
    if len(configs) > 1:
        first = configs[0]
        diffs = [["config", "pairs", *shown]]
        for other in configs[1:]:
            try:
                c = report.compare(other, first)
            except InvalidParameterError:
                diffs.append([other, "0", *("–" for _ in shown)])
                continue
            cells = []
            for m in shown:
                if m not in {d.metric for d in c.rows}:  # no hole judged under both
                    cells.append("–")
                    continue
                d = c[m]
                star = "*" if d.significant else ""
                cells.append(
                    f"{_shown(m, d.diff, True)} [{_shown(m, d.low, True)}, {_shown(m, d.high, True)}]{star}"
                )
            diffs.append([other, str(c.rows[0].n if c.rows else 0), *cells])
        text.append(
            f"\nAgainst {first}: the paired difference and its bootstrap 95% interval (* leaves out 0)"
        )
        text.append(_aligned(diffs))
    return "\n".join(text)


def _shown(metric: str, value: float | None, signed: bool = False) -> str:
    """EM, the identifier scores and pass@1 as percentages; ES as CrossCodeEval gives it, out of 100."""
    if value is None:
        return "–"
    sign = "+" if signed else ""
    return f"{100 * value:{sign}.1f}%" if metric != "es" else f"{value:{sign}.1f}"


def _aligned(rows: list[list[str]]) -> str:
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.ljust(w) if k == 0 else cell.rjust(w)
            for k, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )
