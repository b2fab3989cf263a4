"""Evaluation (issue 40): does repository context raise a model's exact match on ``cross_file`` holes of
code no one here wrote, by more than its bootstrap interval; and what the evaluation itself costs.

- The checkpoint: random weights complete nothing, so the speculative benchmark's copier
  (``speculative.build_copier``: the tiny shape with 4 layers, trained with PyTorch to copy a function
  from its prompt; that benchmark's cache, in a shared work folder) is trained further, the same way
  (one thread, AdamW, seed 0), on FIM prompts built by this package (``build_fim_prompt``, StarCoder2's
  repository layout, PSM and SPM, with and without repository context from ``RepoIndex.context_files``)
  around ``cross_file`` and ``line`` holes cut by ``cut_holes`` from standard-library packages
  (``TRAIN_PACKAGES``). The loss is on the middle and its ``<|endoftext|>``, with a tenth of the weight
  on the prompt's tokens. It never sees the evaluated repositories.
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
import hashlib
import importlib.util
import json
import random
import shutil
import statistics
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from .harness import REPO, WIDE, Row, Section
from .speculative import TRAIN_SECONDS, optimize, schedule

ITEM = 24  # the row number in the report (23 is structured output's)
TITLE = "Evaluation: repository context on code no one here wrote, and the evaluation's cost"
#: Standard-library packages the FIM training cuts its holes from (never the evaluated ones).
TRAIN_PACKAGES = (
    "asyncio",
    "email",
    "http",
    "logging",
    "unittest",
    "importlib",
    "concurrent",
    "multiprocessing",
    "xml",
    "urllib",
    "json",
    "sqlite3",
    "ctypes",
    "idlelib",
    "tkinter",
    "lib2to3",
)
#: Pure-Python packages of the environment that no one here wrote: the evaluated repositories.
EVAL_PACKAGES = ("click", "jinja2", "httpx")
PREFIX_CHARS, SUFFIX_CHARS = 1200, 400
REPO_TOKENS, MAX_PROMPT_TOKENS, MAX_TOKENS = 1024, 2000, 32
CONFIGS = ("psm", "psm+repo", "spm", "spm+repo")  # context given with each hole (REPO_TOKENS)
#: The copier's training is the speculative benchmark's own (one cache in a shared work folder); then FIM.
COPY_SECONDS, FIM_SECONDS = TRAIN_SECONDS, 480
FIM_LR, PROMPT_WEIGHT, BATCH, HOLES_PER_PACKAGE = 1e-3, 0.1, 4, 600
EFFECT_HOLES, COST_HOLES, WIDE_HOLES = 200, 200, 8
#: What training the checkpoint imports (the test extra); without them the section is skipped.
TRAINING_NEEDS = ("torch", "transformers")


# --- repositories --------------------------------------------------------------------------------


def package_repo(name: str, dest: Path) -> Path:
    """A folder holding a copy of the installed package ``name``'s source (``dest/name/name``)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        msg = f"{name} is not an installed package (a folder of modules)."
        raise RuntimeError(msg)
    source = Path(next(iter(spec.submodule_search_locations)))
    repo = dest / name
    if not (repo / name).is_dir():
        tmp = dest / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(source, tmp / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
        tmp.rename(repo)
    return repo


def stdlib_repo(name: str, dest: Path) -> Path:
    """A folder holding a copy of the standard-library package ``name``."""
    repo = dest / name
    if not (repo / name).is_dir():
        tmp = dest / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        source = Path(sysconfig.get_paths()["stdlib"]) / name
        shutil.copytree(source, tmp / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        tmp.rename(repo)
    return repo


def windowed(hole: Any) -> Any:
    """The hole with its file cut to ``PREFIX_CHARS`` before it and ``SUFFIX_CHARS`` after it, at lines."""
    prefix, suffix = hole.prefix, hole.suffix
    if len(prefix) > PREFIX_CHARS:
        start = prefix.find("\n", len(prefix) - PREFIX_CHARS)
        prefix = prefix[start + 1 :] if start >= 0 else prefix[-PREFIX_CHARS:]
    if len(suffix) > SUFFIX_CHARS:
        end = suffix.rfind("\n", 0, SUFFIX_CHARS)
        suffix = suffix[: end + 1] if end >= 0 else suffix[:SUFFIX_CHARS]
    return dataclasses.replace(hole, prefix=prefix, suffix=suffix)


def with_context(index: Any, hole: Any, count_tokens: Any) -> tuple[Any, ...]:
    """The repository context of ``hole``, looked up with its whole file (the imports at its top name
    the files it uses), within ``REPO_TOKENS``."""
    found = index.context_files(
        hole.file, hole.prefix, hole.suffix, max_tokens=REPO_TOKENS, count_tokens=count_tokens
    )
    return tuple(found)


# --- the trained checkpoint ----------------------------------------------------------------------


def fim_examples(
    tokenizer: Any, repos: list[Path], per_repo: int, log: Any
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, middle ids + ``<|endoftext|>``) of holes cut from ``repos``: PSM or SPM, with
    repository context or without, each prompt built by this package as the evaluation builds it."""
    from langchain_starcoder.evaluation import cut_holes
    from langchain_starcoder.fim import FIMRequest, build_fim_prompt
    from langchain_starcoder.repo import RepoIndex

    rng = random.Random(0)

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    examples = []
    for repo in repos:
        index = RepoIndex(repo)
        holes = cut_holes(index, kinds=("line", "cross_file"), n=per_repo, seed=0)
        for whole in holes:
            files = with_context(index, whole, count) if rng.random() < 0.7 else ()
            hole = windowed(whole)
            request = FIMRequest(
                hole.prefix,
                hole.suffix,
                context_files=files,
                file_path=hole.file,
                mode=rng.choice(("psm", "spm")),
                max_prompt_tokens=MAX_PROMPT_TOKENS,
            )
            prompt = build_fim_prompt(tokenizer, request).token_ids
            examples.append((prompt, [*tokenizer.encode(hole.truth, add_special_tokens=False).ids, 0]))
        log(f"    {repo.name}: {len(holes)} holes")
    rng.shuffle(examples)
    return examples


def build_fim_copier(
    workdir: Path,
    seconds: tuple[float, float],
    log: Any = print,
    *,
    packages: tuple[str, ...] = TRAIN_PACKAGES,
    per_package: int = HOLES_PER_PACKAGE,
) -> tuple[Path, dict]:
    """The speculative benchmark's copier (``seconds[0]`` CPU s of copying) trained ``seconds[1]`` CPU s
    more on FIM prompts with and without repository context (cached in ``workdir``)."""
    import torch
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer
    from transformers import Starcoder2Config, Starcoder2ForCausalLM

    from .speculative import build_copier

    copier, copied = build_copier(workdir, seconds[0], log)
    recipe = [copier.name, float(seconds[1]), packages, FIM_LR, PROMPT_WEIGHT, BATCH, per_package]
    recipe += [PREFIX_CHARS, SUFFIX_CHARS, REPO_TOKENS, MAX_PROMPT_TOKENS, 1]
    key = hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:12]
    folder = Path(workdir) / f"fim-copier-{key}"
    done = folder / "training.json"
    if done.exists():
        return folder, json.loads(done.read_text())
    log(f"  training the copier on FIM prompts for {seconds[1]:.0f} CPU s -> {folder}")
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(copier, tmp)
    tokenizer = Tokenizer.from_file(str(tmp / "tokenizer.json"))
    repos = [stdlib_repo(name, Path(workdir) / "stdlib-repos") for name in packages]
    examples = fim_examples(tokenizer, repos, per_package, log)
    config = json.loads((tmp / "config.json").read_text())
    hf_config = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Starcoder2ForCausalLM(Starcoder2Config(**hf_config))
    model.load_state_dict(load_file(str(tmp / "model.safetensors")))
    optimizer = torch.optim.AdamW(model.parameters(), lr=FIM_LR, betas=(0.9, 0.98), weight_decay=0.0)
    started, steps, losses = time.process_time(), 0, []
    while (spent := time.process_time() - started) < seconds[1]:
        batch = [examples[(steps * BATCH + k) % len(examples)] for k in range(BATCH)]
        schedule(optimizer, FIM_LR, steps, spent / seconds[1], warmup=50)
        losses.append(optimize(model, optimizer, _fim_loss(model, batch)))
        steps += 1
        if steps % 200 == 0:
            log(f"    step {steps}: loss {statistics.mean(losses[-100:]):.3f}")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
    info = {
        "copier": copied,
        "steps": steps,
        "examples": len(examples),
        "epochs": round(steps * BATCH / len(examples), 2),
        "cpu_seconds": round(time.process_time() - started, 1),
        "final_loss": round(statistics.mean(losses[-100:]), 4),
    }
    (tmp / "training.json").write_text(json.dumps(info))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder, info


def _fim_loss(model: Any, batch: list[tuple[list[int], list[int]]]) -> Any:
    """Cross-entropy on each example's middle, plus ``PROMPT_WEIGHT`` of it on its prompt (rows padded
    on the right: a causal model's earlier positions never see the padding)."""
    import torch

    rows = [prompt + middle for prompt, middle in batch]
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    weight = torch.zeros((len(rows), width - 1))
    for k, ((prompt, middle), row) in enumerate(zip(batch, rows, strict=True)):
        ids[k, : len(row)] = torch.tensor(row)
        weight[k, : len(prompt) - 1] = PROMPT_WEIGHT / max(1, len(prompt) - 1) * len(middle)
        weight[k, len(prompt) - 1 : len(row) - 1] = 1.0
    logits = model(input_ids=ids[:, :-1]).logits
    losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return (losses * weight).sum() / weight.sum()


# --- measuring -----------------------------------------------------------------------------------


def effect(folder: Path, workdir: Path, packages: tuple[str, ...], n: int, log: Any) -> dict[str, Any]:
    """``cross_file`` holes of each package under ``CONFIGS``: repository context against none, per
    package and pooled (paired differences with bootstrap 95% intervals)."""
    from langchain_starcoder.evaluation import EvalReport

    reports = {name: package_effect(folder, workdir, name, n, log) for name in packages}
    pooled = EvalReport([r for report in reports.values() for r in report.records])
    out: dict[str, Any] = {}
    for name, report in [*reports.items(), ("pooled", pooled)]:
        out[name] = {
            "summary": report.summary("config"),
            "with_context": {mode: _comparison(report, f"{mode}+repo", mode) for mode in ("psm", "spm")},
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
    key = hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:12]
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
    seconds = (5.0, 5.0) if tiny else (COPY_SECONDS, FIM_SECONDS)
    packages, per_package = (("json",), 20) if tiny else (TRAIN_PACKAGES, HOLES_PER_PACKAGE)
    folder, training = build_fim_copier(workdir, seconds, log, packages=packages, per_package=per_package)
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
    shape = "tiny shape, 4 layers, trained here (copying, then FIM)"
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
        notes.append(
            f"{name} ({next(iter(found['with_context'].values()))['em']['n']} holes): " + "; ".join(parts)
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
    notes.append(
        f"Checkpoint: the copier ({tr['copier'].get('steps')} steps) then {tr['steps']} FIM steps "
        f"({tr['examples']} prompts from {len(TRAIN_PACKAGES)} standard-library packages, "
        f"{tr['epochs']} epochs, {tr['cpu_seconds']} CPU s, final loss {tr['final_loss']})."
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
