"""Does fine-tuning learn the repository? (issue 41) The held-out FIM loss and the evaluation's scores on
held-out files, before (the base) and after (the base with the adapter), paired on the same holes.

- The model: ``--model DIR``, a StarCoder2 checkpoint; by default the "tiny" preset (random weights,
  float32; ``langchain_starcoder.testing``), built once in the work folder. A random base knows nothing
  before training, so "before" is near zero by construction: what that measures is that the path
  (data, masking, trainer, adapter, engine) learns from the repository and that it carries to files it
  never saw, not how much a real model gains. A base that completes code (``benchmarks/fim_copier.py``'s
  FIM copier, ``/tmp/bw/fim-copier-*``) can show exact match move.
- The repository: a copy of an installed pure-Python package (``click`` by default; code no one here
  wrote), ``git init``-ed. ``finetune`` holds out a share of its files, by file.
- Training: ``finetune(method=...)`` (LoRA, DoRA or all weights) with the settings given (a learning
  rate well above mlx-lm's 1e-5 default: a tiny base barely moves with it in a few hundred steps).
- The holes: ``cut_holes`` over a copy of the held-out files only (line, span, block, call by default: a
  cross_file hole's answer is defined in another file, which a held-out copy lacks), completed
  under ``psm`` with no repository context, so each prompt is the hole's own file: one the adapter
  never trained on. ``--windowed`` cuts each hole's file as ``benchmarks/fim_copier.py`` does (1,200
  characters before the hole, 400 after): the prompts the FIM copier was trained on.
- The comparison: ``EvalReport.compare`` on the paired holes (its bootstrap 95% intervals).

Run: ``python -m benchmarks.finetune_effect [--model DIR] [--method lora|dora|full] [--steps N]
[--holes N] [--kinds line,span] [--windowed] [--config psm|spm] [--package click] [--workdir DIR]``; it
prints the table and writes ``effect.json`` (and the adapter, its loss.png and both reports) to the work
folder.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

KINDS = ("line", "span", "block", "call")
SHOWN = ("em", "es", "id_em", "id_f1")


def build(workdir: Path, package: str, model: Path | None = None) -> tuple[Path, Path]:
    """The checkpoint (``model``, or the tiny one) and the package's repository (a git repository), made
    once in ``workdir``."""
    from langchain_starcoder.testing import build_starcoder2

    if model is not None:
        if not (model / "config.json").is_file():
            msg = f"--model {model}: no config.json there; name a StarCoder2 checkpoint's folder."
            raise SystemExit(msg)
    else:
        model = workdir / "tiny"
        if not (model / "config.json").is_file():
            build_starcoder2(model)
    repo = workdir / f"{package}-repo"
    if not (repo / ".git").is_dir():
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            msg = f"{package!r} is not an installed package here: name one that is (click, jinja2...)."
            raise SystemExit(msg)
        source = Path(next(iter(spec.submodule_search_locations)))
        shutil.rmtree(repo, ignore_errors=True)
        shutil.copytree(source, repo / package, ignore=shutil.ignore_patterns("__pycache__"))
        git = ["git", "-C", str(repo), "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
        subprocess.run([*git, "init", "-q"], check=True)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-qm", f"{package} as installed"], check=True)
    return model, repo


def held_out_copy(repo: Path, files: list[str], dest: Path) -> Path:
    """A folder holding only the held-out files (so every hole is cut from a file not trained on)."""
    shutil.rmtree(dest, ignore_errors=True)
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, dest / rel)
    return dest


def completed(
    model: Path, adapter: Path | None, holes: list[Any], config: str, name: str, max_tokens: int
) -> Any:
    """The holes completed under ``config`` by the base (``adapter`` None) or the base with the adapter,
    as ``name``."""
    from langchain_starcoder import StarCoderEngine
    from langchain_starcoder.evaluation import evaluate

    engine = StarCoderEngine.load(model, adapter_path=adapter)
    try:
        report = evaluate(engine, holes, config, max_tokens=max_tokens)
    finally:
        engine.close()
    for record in report.records:
        record.config = name
    return report


def table(comparison: Any, loss: tuple[float, float]) -> str:
    """Markdown: held-out loss, then each metric's base, adapter, difference and 95% interval."""
    rows = [
        "| measure | base | base + adapter | difference [95% interval] |",
        "|---|---:|---:|---|",
        f"| held-out FIM loss (nats/token) | {loss[0]:.3f} | {loss[1]:.3f} | {loss[1] - loss[0]:+.3f} |",
    ]
    for name in SHOWN:
        d = comparison[name]
        pct = 1 if name == "es" else 100  # es is already 0-100; the others are shares
        mark = " (interval leaves out 0)" if d.significant else ""
        rows.append(
            f"| {name} (n={d.n}) | {pct * d.mean_b:.1f} | {pct * d.mean_a:.1f} | "
            f"{pct * d.diff:+.1f} [{pct * d.low:+.1f}, {pct * d.high:+.1f}]{mark} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="finetune-effect-"))
    workdir.mkdir(parents=True, exist_ok=True)
    model, repo = build(workdir, args.package, args.model)
    result = trained(args, model, repo, workdir / "adapter")
    holes = held_out_holes(args, repo, result.held_out_files, workdir / "held-out")
    before = completed(model, None, holes, args.config, "base", args.completion_tokens)
    after = completed(model, result.out, holes, args.config, "adapter", args.completion_tokens)
    before.save(workdir / "before.json")
    after.save(workdir / "after.json")
    text = summarized(args, workdir, model, result, before, after)
    print(
        f"{args.package}: {len(result.train_files)} files trained on, {len(result.held_out_files)} held out "
        f"({', '.join(result.held_out_files)}); {result.steps} {args.method} steps from {model}, "
        f"{len(holes)} holes in them"
    )
    print(text)
    print(f"Loss curve: {result.plot}; reports and effect.json in {workdir}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.finetune_effect", description=__doc__)
    p.add_argument("--model", type=Path, help="the base checkpoint (default: the tiny preset, random)")
    p.add_argument("--method", choices=("lora", "dora", "full"), default="lora")
    p.add_argument("--package", default="click", help="the installed package used as the repository")
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=512, help="tokens per training example")
    p.add_argument("--fim-rate", type=float, default=0.5, help="the share of FIM training examples")
    p.add_argument("--spm-rate", type=float, default=0.5, help="the share of FIM examples in SPM order")
    p.add_argument("--held-out", type=float, default=0.25)
    # Each held-out evaluation runs every held-out example: on a slow machine, as costly as many steps.
    p.add_argument("--eval-every", type=int, help="steps between held-out losses (default: steps / 8)")
    p.add_argument("--holes", type=int, default=120)
    p.add_argument("--kinds", default=",".join(KINDS), help="the holes' kinds, comma-separated")
    p.add_argument("--windowed", action="store_true", help="cut each hole's file as evaluation.py does")
    p.add_argument("--config", choices=("psm", "spm"), default="psm", help="the holes' FIM order")
    p.add_argument("--completion-tokens", type=int, default=32, help="per hole")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", type=Path, help="default: a new temporary folder")
    return p


def trained(args: argparse.Namespace, model: Path, repo: Path, out: Path) -> Any:
    """``finetune`` on ``repo`` with the settings given, into a fresh ``out``."""
    from langchain_starcoder.finetune import finetune

    shutil.rmtree(out, ignore_errors=True)
    return finetune(
        repo,
        model=model,
        out=out,
        method=args.method,
        steps=args.steps,
        rank=args.rank,
        held_out=args.held_out,
        fim_rate=args.fim_rate,
        spm_rate=args.spm_rate,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        max_tokens=args.max_tokens,
        save_every=args.steps,
        eval_every=args.eval_every or max(1, args.steps // 8),
        seed=args.seed,
    )


def held_out_holes(args: argparse.Namespace, repo: Path, files: list[str], dest: Path) -> list[Any]:
    """The holes cut from a copy of the held-out ``files`` only (windowed when asked)."""
    from langchain_starcoder.evaluation import cut_holes

    from .fim_copier import windowed

    held = held_out_copy(repo, files, dest)
    holes = cut_holes(held, kinds=tuple(args.kinds.split(",")), n=args.holes, seed=args.seed)
    return [windowed(h) for h in holes] if args.windowed else holes


def summarized(
    args: argparse.Namespace, workdir: Path, model: Path, result: Any, before: Any, after: Any
) -> str:
    """The paired comparison as a table, written with the run's settings and files to effect.json."""
    from langchain_starcoder.evaluation import EvalReport

    comparison = EvalReport(before.records + after.records, {"package": args.package}).compare(
        "adapter", "base"
    )
    loss = (result.held_out_loss_before, result.held_out_loss_after)
    text = table(comparison, loss)
    summary = {
        "settings": vars(args) | {"workdir": str(workdir), "model": str(model)},
        "train_files": result.train_files,
        "held_out_files": result.held_out_files,
        "held_out_loss": loss,
        "tokens_per_second": result.tokens_per_second,
        "train_seconds": json.loads(result.log.read_text())["train_seconds"],
        "compare": [vars(d) for d in comparison.rows],
        "table": text,
    }
    (workdir / "effect.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return text


if __name__ == "__main__":
    main()
