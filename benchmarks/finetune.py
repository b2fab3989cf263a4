"""Training speed of ``finetune`` against ``mlx_lm.lora`` itself (issue 41: goal >= 0.95x), side by side.

The same model, data and settings on both sides, in one process, interleaved over several rounds:

- The model: the "tiny" preset, or (``--shape 3b``) a StarCoder2 of the 3b shape cut to 2 layers
  (random weights, float32, built once in the work folder).
- The data: the repository is a copy of the standard library's ``json``, ``email`` and ``http``
  packages (code no one here wrote); the examples are ours (``finetune.build_dataset`` of the training
  files, StarCoder2's layout with FIM), given to both sides as the same list.
- Ours: ``finetune(..., method, rank, batch_size, learning_rate, max_tokens, steps)`` with no held-out
  evaluation or checkpoint inside the run (both every ``steps + 1``; before and after, one batch); its
  training seconds are the wall time of mlx-lm's ``train`` call as finetune.json records it (the
  progress bar and per-step log included, the held-out loss before and after and the checkpoint not).
- mlx-lm: ``mlx_lm.lora.train_model`` (its LoRA layers, Adam, ``train``; no validation set, saving
  every ``steps + 1``) on the model ``mlx_lm.load`` loads, timed around the call (its layer swap and
  config write included); its tokens are those its trainer reports.
- Tokens/s: trained tokens (the tokens the loss is over, as mlx-lm counts them) over those seconds;
  the best round of each side is kept (the machine is shared). FIM is off by default (``--fim-rate``):
  a FIM example's loss is over its middle only, and the two sides draw the batches in different
  orders, so with FIM their counts would differ by the batches drawn rather than by speed.

Run: ``python -m benchmarks.finetune [--shape tiny|3b] [--steps N] [--rounds N] [--max-tokens N]
[--batch-size N] [--workdir DIR]``; on the 3b shape set ``LANGCHAIN_STARCODER_BLAS=openblas`` first.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sysconfig
import tempfile
import time
import types
from pathlib import Path
from typing import Any

PACKAGES = ("json", "email", "http")


def build(workdir: Path, shape: str) -> tuple[Path, Path]:
    """The checkpoint and the repository, made once in ``workdir``."""
    from langchain_starcoder.testing import build_starcoder2

    model = workdir / ("3b-2layers" if shape == "3b" else "tiny")
    if not (model / "config.json").is_file():
        if shape == "3b":
            build_starcoder2(model, preset="3b", num_layers=2)
        else:
            build_starcoder2(model)
    repo = workdir / "stdlib-repo"
    if not repo.is_dir():
        stdlib = Path(sysconfig.get_paths()["stdlib"])
        for name in PACKAGES:
            shutil.copytree(stdlib / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    return model, repo


def ours(repo: Path, model: Path, out: Path, settings: dict[str, Any]) -> tuple[int, float]:
    """One run of ``finetune``: its trained tokens and training seconds (from finetune.json)."""
    from langchain_starcoder.finetune.train import finetune

    shutil.rmtree(out, ignore_errors=True)
    never = settings["steps"] + 1
    finetune(repo, model=model, out=out, save_every=never, eval_every=never, eval_batches=1, **settings)
    log = json.loads((out / "finetune.json").read_text())
    return log["trained_tokens"], log["train_seconds"]


class _Examples(list):
    """Our examples as mlx-lm's CacheDataset takes a dataset (``process``: an item as it is)."""

    def process(self, item: Any) -> Any:
        return item


def theirs(model: Path, out: Path, examples: list[Any], settings: dict[str, Any]) -> tuple[int, float]:
    """One run of ``mlx_lm.lora.train_model`` on ``examples``: its trained tokens and seconds."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.lora import CONFIG_DEFAULTS, train_model
    from mlx_lm.tuner.callbacks import TrainingCallback

    shutil.rmtree(out, ignore_errors=True)
    mlx_model, _ = load(str(model))
    mx.eval(mlx_model.parameters())
    lora = {"rank": settings["rank"], "dropout": 0.0, "scale": 20.0}
    args = types.SimpleNamespace(
        **{
            **CONFIG_DEFAULTS,
            "model": str(model),
            "train": True,
            "fine_tune_type": settings["method"],
            "num_layers": -1,
            "batch_size": settings["batch_size"],
            "iters": settings["steps"],
            "learning_rate": settings["learning_rate"],
            "steps_per_report": settings["steps"],
            "steps_per_eval": settings["steps"] + 1,
            "save_every": settings["steps"] + 1,
            "adapter_path": str(out),
            "max_seq_length": settings["max_tokens"],
            "lora_parameters": lora,
            "seed": settings["seed"],
        }
    )
    tokens: list[int] = []

    class Count(TrainingCallback):
        def on_train_loss_report(self, train_info: dict[str, Any]) -> None:
            tokens.append(int(train_info["trained_tokens"]))

    tic = time.perf_counter()
    train_model(args, mlx_model, _Examples(examples), _Examples(), Count())
    return tokens[-1], time.perf_counter() - tic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("tiny", "3b"), default="tiny")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "finetune-bench")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--method", choices=("lora", "dora", "full"), default="lora")
    parser.add_argument("--fim-rate", type=float, default=0.0)
    args = parser.parse_args()

    from langchain_starcoder.finetune import build_dataset, split_files
    from langchain_starcoder.loading import load_tokenizer, read_config

    args.workdir.mkdir(parents=True, exist_ok=True)
    model, repo = build(args.workdir, args.shape)
    settings = {"method": args.method, "rank": 8, "batch_size": args.batch_size, "learning_rate": 1e-5}
    settings |= {"max_tokens": args.max_tokens, "steps": args.steps, "seed": 0, "fim_rate": args.fim_rate}
    split = split_files(repo, held_out=0.1, seed=0)
    tokenizer = load_tokenizer(model, read_config(model))
    rates = {"fim_rate": args.fim_rate, "max_tokens": args.max_tokens}
    examples = list(build_dataset(repo, split.train, tokenizer, **rates, seed=0))
    speeds: dict[str, list[float]] = {"ours": [], "mlx_lm.lora": []}
    for _ in range(args.rounds):
        for name in speeds:
            if name == "ours":
                done, seconds = ours(repo, model, args.workdir / "ours", settings)
            else:
                done, seconds = theirs(model, args.workdir / "theirs", examples, settings)
            speeds[name].append(done / seconds)
    best = {name: max(r) for name, r in speeds.items()}
    print(
        f"{args.shape} shape, {args.method} rank 8, batch {args.batch_size}, "
        f"{args.max_tokens} tokens at most, FIM rate {args.fim_rate}, {args.steps} steps; "
        f"{len(examples)} training examples from {', '.join(PACKAGES)}"
    )
    for name, r in speeds.items():
        print(f"{name:12s} tokens/s per round: {', '.join(f'{x:.1f}' for x in r)}; best {best[name]:.1f}")
    print(f"ours / mlx_lm.lora: {best['ours'] / best['mlx_lm.lora']:.3f}x (goal >= 0.95x)")


if __name__ == "__main__":
    main()
