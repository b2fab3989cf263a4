"""Evaluation (issue 40): does repository context raise a model's exact match on ``cross_file`` holes of
code no one here wrote, by more than its bootstrap interval; and what the evaluation itself costs.

- The checkpoint: ``fim_copier.build_fim_copier``, a model trained here to look up what its prompt holds.
- The effect: ``cross_file`` holes of ``EVAL_PACKAGES`` (click, jinja2 and httpx from the environment's
  site-packages, each copied into a folder of its own), each hole's file cut to ``PREFIX_CHARS`` before
  and ``SUFFIX_CHARS`` after (as CrossCodeEval cuts its prompts: the builder gives the hole the budget
  first, so a whole long file would leave no room for context in this model's 2,048 positions), then
  ``evaluate`` under ``psm``, ``psm+repo=N``, ``spm`` and ``spm+repo=N``, and ``report.compare``: the paired
  difference of each metric and its paired bootstrap 95% interval.
- The cost: ``CONFIGS`` x ``COST_HOLES`` holes of every kind on the trained tiny checkpoint, timed end to
  end (cutting, completing, scoring); and on the 2-layer 3b shape (random weights), the evaluation's own
  time per hole (cutting and scoring) against the model's (the runner's ``total_s``).

Run alone: ``python -m benchmarks.evaluation [--workdir DIR] [--tiny]``; in the suite:
``--only evaluation``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from .fim_copier import (
    MAX_PROMPT_TOKENS,
    PREFIX_CHARS,
    REPO_TOKENS,
    SUFFIX_CHARS,
    TRAIN_PACKAGES,
    TRAINING_NEEDS,
    build_fim_copier,
    copyable,
    package_repo,
    windowed,
    with_context,
)
from .harness import REPO, WIDE, Row, Section, recipe_key

ITEM = 24  # the row number in the report (23 is structured output's)
TITLE = "Evaluation: repository context on code no one here wrote, and the evaluation's cost"
#: Pure-Python packages of the environment that no one here wrote: the evaluated repositories.
EVAL_PACKAGES = ("click", "jinja2", "httpx")
CONFIGS = ("psm", "psm+repo", "spm", "spm+repo")  # context given with each hole (REPO_TOKENS)
MAX_TOKENS = 32  # a line's completion, with room
EFFECT_HOLES, COST_HOLES, WIDE_HOLES = 200, 200, 8
#: The holes whose answer the repository context holds and the file's window does not (``copyable``).
ONLY_IN_CONTEXT = "answer_only_in_context"


# --- measuring -----------------------------------------------------------------------------------


def effect(folder: Path, workdir: Path, packages: tuple[str, ...], n: int, log: Any) -> dict[str, Any]:
    """``cross_file`` holes of each package under ``CONFIGS``: repository context against none, per
    package and pooled (paired differences with bootstrap 95% intervals)."""
    from langchain_starcoder.evaluation import EvalReport

    reports = {name: package_effect(folder, workdir, name, n, log) for name in packages}
    pooled = EvalReport([r for report in reports.values() for r in report.records])
    pooled.metadata[ONLY_IN_CONTEXT] = sum(r.metadata.get(ONLY_IN_CONTEXT, 0) for r in reports.values())
    out: dict[str, Any] = {}
    for name, report in [*reports.items(), ("pooled", pooled)]:
        out[name] = {
            "summary": report.summary("config"),
            "with_context": {mode: _comparison(report, f"{mode}+repo", mode) for mode in ("psm", "spm")},
            ONLY_IN_CONTEXT: report.metadata.get(ONLY_IN_CONTEXT),
        }
    out["examples"] = [dataclasses.asdict(r) for r in pooled.records[:8]]
    return out


def package_effect(folder: Path, workdir: Path, name: str, n: int, log: Any) -> Any:
    """One package's report under ``CONFIGS``, kept in ``workdir`` (a package takes CPU minutes: a run
    cut short resumes there, and packages can run in separate processes)."""
    from langchain_starcoder import StarCoderEngine
    from langchain_starcoder.evaluation import EvalReport, cut_holes, evaluate
    from langchain_starcoder.repo import RepoIndex

    recipe = [folder.name, name, n, CONFIGS, PREFIX_CHARS, SUFFIX_CHARS, REPO_TOKENS]
    recipe += [MAX_PROMPT_TOKENS, MAX_TOKENS]
    key = recipe_key(recipe)
    saved = workdir / "eval-reports" / f"{name}-{key}.json"
    if saved.exists():
        return EvalReport.load(saved)
    engine = StarCoderEngine.load(folder)
    try:
        index = RepoIndex(package_repo(name, workdir / "eval-repos"))
        holes = [
            dataclasses.replace(windowed(h), context=with_context(index, h, engine.count_tokens))
            for h in cut_holes(index, kinds="cross_file", n=n, seed=0)
        ]
        # The effect's ceiling for a model that looks up: holes whose answer only the context holds.
        only = sum(copyable(h, h.context) and not copyable(h, ()) for h in holes)
        log(f"    {name}: {len(holes)} cross_file holes x {len(CONFIGS)} configurations")
        report = evaluate(
            engine,
            holes,
            CONFIGS,
            repo=index,
            max_tokens=MAX_TOKENS,
            max_prompt_tokens=MAX_PROMPT_TOKENS,
        )
    finally:
        engine.close()
    if report.metadata.get("interrupted"):
        raise KeyboardInterrupt  # a part of a package is not kept as if it were the whole
    report.metadata[ONLY_IN_CONTEXT] = only
    saved.parent.mkdir(parents=True, exist_ok=True)
    report.save(saved)
    return report


def _comparison(report: Any, a: str, b: str) -> dict[str, Any]:
    c = report.compare(a, b)
    return {d.metric: dataclasses.asdict(d) | {"significant": d.significant} for d in c.rows}


def cost_tiny(folder: Path, repo: Path, n: int, max_tokens: int) -> dict[str, Any]:
    """``n`` holes of every kind x 4 configurations on the trained tiny checkpoint, as the CLI runs
    them (whole files, the index's context lookup, up to ``max_tokens``), timed end to end."""
    from langchain_starcoder import StarCoderEngine
    from langchain_starcoder.evaluation import cut_holes, evaluate
    from langchain_starcoder.repo import RepoIndex

    configs = ("psm", "spm", "psm+repo", "spm+repo")
    started = time.perf_counter()
    engine = StarCoderEngine.load(folder)
    loaded = time.perf_counter()
    index = RepoIndex(repo)
    holes = cut_holes(index, n=n, seed=0)
    cut = time.perf_counter()
    try:
        report = evaluate(engine, holes, configs, repo=index, max_tokens=max_tokens)
    finally:
        engine.close()
    done = time.perf_counter()
    rescored = report.rescored()
    scoring = time.perf_counter() - done
    assert [r.em for r in rescored.records] == [r.em for r in report.records]
    return {
        "holes": len(holes),
        "configs": configs,
        "max_tokens": max_tokens,
        "completions": len(report.records),
        "errors": sum(r.error is not None for r in report.records),
        "load_s": loaded - started,
        "cut_s": cut - loaded,
        "evaluate_s": done - cut,
        "score_s": scoring,
        "model_s": sum(r.total_s or 0.0 for r in report.records),
        "minutes": (done - started) / 60,
        "summary": report.summary("config"),
    }


def cost_wide(checkpoint: Path, repo: Path, n_cut: int, n_run: int) -> dict[str, Any]:
    """The evaluation's own time per hole (cutting ``n_cut`` holes; post-processing and scoring) against
    the model's per completion on ``checkpoint`` (``n_run`` of the holes, PSM with repository context)."""
    from langchain_starcoder import StarCoderEngine
    from langchain_starcoder.evaluation import cceval_truncate, cut_holes, evaluate, score
    from langchain_starcoder.evaluation.runner import POSTPROCESSED
    from langchain_starcoder.repo import RepoIndex

    index = RepoIndex(repo)
    cut_holes(index, n=n_cut, seed=1)  # parses once: the timed cut below is as warm as a second run
    started = time.perf_counter()
    holes = cut_holes(index, n=n_cut, seed=0)
    cut_per_hole = (time.perf_counter() - started) / len(holes)
    engine = StarCoderEngine.load(checkpoint)
    try:
        run = holes[:: max(1, len(holes) // n_run)][:n_run]
        budget = {"repo": index, "max_prompt_tokens": 1024}
        evaluate(engine, run[:1], "psm+repo", max_tokens=4, **budget)  # warm up (compile, caches)
        report = evaluate(engine, run, "psm+repo", max_tokens=16, **budget)
    finally:
        engine.close()
    holes_of = {h.task_id: h for h in run}
    started = time.perf_counter()
    for _ in range(3):  # scoring as the runner does: CrossCodeEval's post-processing, then the scores
        for r in report.records:
            hole = holes_of[r.task_id]
            if r.kind in POSTPROCESSED:
                cceval_truncate(hole.prefix, r.raw if r.raw is not None else r.prediction, r.language)
            score(r.prediction, r.truth, r.language)
    score_per_hole = (time.perf_counter() - started) / (3 * len(report.records))
    model = [r.total_s for r in report.records if r.total_s is not None]
    return {
        "cut_per_hole_s": cut_per_hole,
        "score_per_hole_s": score_per_hole,
        "model_per_hole_s": model,
        "prompt_tokens": [r.prompt_tokens for r in report.records],
        "completion_tokens": [r.completion_tokens for r in report.records],
    }


# --- the section ---------------------------------------------------------------------------------


def measure(workdir: Path, wide: Path, *, tiny: bool, log: Any = print) -> dict[str, Any]:
    """Train (or reuse) the checkpoint, then the effect and the costs (see the module's docs)."""
    # --tiny: a check of the harness, seconds of training
    small = {"copy_seconds": 5.0, "rounds": ((((5, 128, 4),), 5),), "packages": ("json",)}
    folder, training = build_fim_copier(workdir, log, **(small if tiny else {}))
    evaluated = EVAL_PACKAGES[:1] if tiny else EVAL_PACKAGES
    n_effect, n_cost, n_wide = (4, 4, 2) if tiny else (EFFECT_HOLES, COST_HOLES, WIDE_HOLES)
    log("  the effect of repository context")
    found = effect(folder, workdir, evaluated, n_effect, log)
    repo = package_repo(EVAL_PACKAGES[0], workdir / "eval-repos")
    log(f"  the cost: {n_cost} holes x 4 configurations on the tiny checkpoint")
    tiny_cost = cost_tiny(folder, repo, n_cost, 16 if tiny else 128)
    log("  the cost: the evaluation's own time against the model's")
    wide_cost = cost_wide(wide, repo, n_cost, n_wide)
    return {"training": training, "effect": found, "cost_tiny": tiny_cost, "cost_wide": wide_cost}


def section(results: dict[str, Any], wide_shape: str) -> Section:
    s = Section("evaluation", ITEM, TITLE)
    shape = "tiny shape, 4 layers, trained here (copying, looking up, then FIM)"
    effect_ = results["effect"]
    for mode in ("psm", "spm"):
        d = effect_["pooled"]["with_context"][mode]["em"]
        s.rows.append(
            Row(
                ITEM,
                TITLE,
                "cross_file exact match",
                f"{mode} with repository context",
                f"{mode}",
                [d["mean_a"]],
                [d["mean_b"]],
                "share",
                shape,
                note=f"{d['n']} holes of {', '.join(EVAL_PACKAGES)}; paired difference {_pct(d['diff'])}, "
                f"95% interval [{_pct(d['low'])}, {_pct(d['high'])}]",
            )
        )
    t, w = results["cost_tiny"], results["cost_wide"]
    own = w["cut_per_hole_s"] + w["score_per_hole_s"]
    s.rows += [
        Row(
            ITEM,
            TITLE,
            "seconds per hole",
            "the evaluation's own (cutting, post-processing, scoring)",
            "the model's (context, prompt, completion)",
            [own],
            w["model_per_hole_s"],
            "s",
            wide_shape,
            ("<=", 0.05),
            note="PSM with repository context, 1,024-token prompts, 16 tokens",
        ),
        Row(
            ITEM,
            TITLE,
            f"minutes for {t['holes']} holes x {len(t['configs'])} configurations",
            "the whole run (load, cut, complete, score)",
            "the completions alone",
            [t["minutes"]],
            [t["model_s"] / 60],
            "min",
            shape,
            note=f"{', '.join(t['configs'])} on {EVAL_PACKAGES[0]}, whole files, {t['max_tokens']} tokens",
        ),
    ]
    s.notes = _notes(results)
    s.data = results
    return s


def _notes(results: dict[str, Any]) -> list[str]:
    notes = []
    for name, found in results["effect"].items():
        if name == "examples":
            continue
        parts = []
        for mode, metrics in found["with_context"].items():
            shown = ", ".join(
                f"{m} {_pct(d['diff'], m)} [{_pct(d['low'], m)}, {_pct(d['high'], m)}]"
                for m, d in metrics.items()
                if m in ("em", "es", "id_em", "id_f1")
            )
            parts.append(f"{mode}+repo - {mode}: {shown}")
        only = found.get(ONLY_IN_CONTEXT)
        ceiling = "" if only is None else f", {only} with their answer only in the context"
        notes.append(
            f"{name} ({next(iter(found['with_context'].values()))['em']['n']} holes{ceiling}): "
            + "; ".join(parts)
        )
    t, w, tr = results["cost_tiny"], results["cost_wide"], results["training"]
    notes.append(
        f"Tiny run: load {t['load_s']:.1f} s, cut {t['cut_s']:.1f} s, evaluate {t['evaluate_s']:.0f} s "
        f"({t['completions']} completions, {t['errors']} errors), rescoring all {t['score_s']:.2f} s."
    )
    notes.append(
        f"3b shape: cutting {1000 * w['cut_per_hole_s']:.2f} ms and scoring "
        f"{1000 * w['score_per_hole_s']:.2f} "
        f"ms per hole; the model {statistics.median(w['model_per_hole_s']):.2f} s per completion "
        "(2 of the 30 layers: the full model's time is larger, the evaluation's own the same)."
    )
    rounds = "; ".join(
        f"round {k}: {r['lookup_steps']} steps looking up (loss {r['lookup_loss']}), then {r['steps']} "
        f"FIM steps ({r['examples']} prompts, {r['epochs']} epochs, loss {r['final_loss']}), "
        f"{r['cpu_seconds']} CPU s"
        for k, r in enumerate(tr["rounds"], 1)
    )
    notes.append(
        f"Checkpoint: the copier ({tr['copier'].get('steps')} steps), then FIM prompts from "
        f"{len(TRAIN_PACKAGES)} standard-library packages in rounds: {rounds}."
    )
    return notes


def _pct(value: float, metric: str = "em") -> str:
    return f"{value:+.1f}" if metric == "es" else f"{100 * value:+.1f}%"


def bench_evaluation(ctx: Any) -> Section:
    """The evaluation (issue 40): the effect of repository context, and the cost (see the module docs)."""
    missing = [name for name in TRAINING_NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        skipped = Section("evaluation", ITEM, TITLE)
        skipped.skipped = f"{' and '.join(missing)} missing: training its checkpoint needs the test extra"
        return skipped
    wide = ctx.checkpoints.get(WIDE)
    results = measure(ctx.checkpoints.workdir, wide, tiny=ctx.tiny, log=ctx.log)
    return section(results, ctx.checkpoints.shape(WIDE).describe())


def main(argv: list[str] | None = None) -> int:
    from .harness import Checkpoints

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.evaluation", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--workdir", type=Path, default=REPO / ".bench-work")
    parser.add_argument("--tiny", action="store_true", help="a harness check: seconds of training")
    args = parser.parse_args(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    checkpoints = Checkpoints(args.workdir, tiny=args.tiny, log=log)
    results = measure(args.workdir, checkpoints.get(WIDE), tiny=args.tiny, log=log)
    print(json.dumps(section(results, checkpoints.shape(WIDE).describe()).to_json(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
