"""Fine-tune a StarCoder2 checkpoint on a repository through mlx-lm's tuner: its LoRA and DoRA layers
(``linear_to_lora_layers``), its optimizer and training loop (``train``, ``evaluate``), its adapter files.

What is ours: the data (:mod:`.split`, :mod:`.data`), the held-out loss before, during and after, a
progress bar with the loss, and checkpoints that resume exactly (:mod:`.checkpoints`: mlx-lm's keep the
weights only). The trainable model and its adapter config are :mod:`.model`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, InvalidParameterError
from .checkpoints import STATE_FILE, has_checkpoint, load_checkpoint, save_checkpoint
from .log import LOG_FILE, plot_losses, write_log
from .model import checkpointed, load_trainable, write_adapter_config
from .settings import DEFAULTS, METHODS

#: Settings that may change on --resume: how long, how often to measure and save, and memory for time.
_MAY_CHANGE = ("steps", "save_every", "eval_every", "grad_checkpoint")


@dataclass
class FinetuneResult:
    """What a run did: where its adapter is, the steps reached, the held-out loss before and after, the
    loss per step and the held-out loss where measured, and the training speed."""

    out: Path
    steps: int
    held_out_loss_before: float
    held_out_loss_after: float
    losses: list[dict[str, Any]]
    held_out_losses: list[dict[str, Any]]
    tokens_per_second: float
    train_files: list[str]
    held_out_files: list[str]
    settings: dict[str, Any]
    plot: Path | None = None

    @property
    def log(self) -> Path:
        """The run's ``finetune.json``."""
        return self.out / LOG_FILE


@dataclass
class _Data:
    """The run's examples and the files they come from."""

    train: list[tuple[list[int], int]]
    held_out: list[tuple[list[int], int]]
    train_files: list[str]
    held_out_files: list[str]
    digest: str = field(default="")


def finetune(
    repo: str | os.PathLike[str],
    *,
    model: str | os.PathLike[str],
    out: str | os.PathLike[str],
    method: str = DEFAULTS.method,
    steps: int = DEFAULTS.steps,
    rank: int = DEFAULTS.rank,
    num_layers: int | None = DEFAULTS.num_layers,
    grad_checkpoint: bool = DEFAULTS.grad_checkpoint,
    held_out: float = DEFAULTS.held_out,
    since: str | None = None,
    fim_rate: float = DEFAULTS.fim_rate,
    spm_rate: float = DEFAULTS.spm_rate,
    resume: bool = False,
    batch_size: int = DEFAULTS.batch_size,
    learning_rate: float = DEFAULTS.learning_rate,
    max_tokens: int = DEFAULTS.max_tokens,
    save_every: int = DEFAULTS.save_every,
    eval_every: int = DEFAULTS.eval_every,
    eval_batches: int | None = DEFAULTS.eval_batches,
    seed: int = DEFAULTS.seed,
    callback: Any = None,
) -> FinetuneResult:
    """Fine-tune ``model`` on the code of ``repo`` and write the adapter to ``out``.

    ``out`` gets mlx-lm's ``adapters.safetensors`` and ``adapter_config.json`` (``mlx_lm.generate
    --adapter-path`` and ``mlx_lm.fuse`` read them), ``finetune.json`` (settings, files, losses, speed),
    ``loss.png`` and the resume state. ``method``: "lora", "dora" or "full" (all the layers' weights);
    ``rank``: the LoRA rank; ``num_layers``: how many of the last layers are adapted or trained (None:
    all; mlx_lm.lora's ``--num-layers``); ``grad_checkpoint``: recompute each layer's activations in
    the backward pass (mlx-lm's gradient checkpointing: less memory, more time); ``held_out``: the
    fraction of files kept out of training to measure on
    (with ``since``: the files changed after that git revision); ``fim_rate``/``spm_rate``: the
    share of fill-in-the-middle examples and, of those, in SPM order. A checkpoint every ``save_every``
    steps, the held-out loss every ``eval_every`` (over ``eval_batches`` batches of the held-out
    examples, the same each time; None: all); ``resume`` continues from the last checkpoint as
    if the run had not stopped (same settings; ``steps`` may grow). Ctrl-C saves a checkpoint of the
    step reached, then raises ``KeyboardInterrupt``. ``callback``: an mlx-lm ``TrainingCallback``
    also told of every step.
    """
    settings = _settings(locals())
    out_dir = _check(repo, out, settings, resume)
    data = _data(Path(repo), settings)
    state = load_checkpoint(out_dir) if resume else None
    if state is not None:
        _check_resumable(state, settings, data, out_dir)
    settings["data_digest"] = data.digest
    run = _Run.start(settings, data, out_dir, state, callback)
    return run.train()


def _settings(arguments: dict[str, Any]) -> dict[str, Any]:
    """The run's settings as recorded (in finetune.json and the checkpoint), the model as a path."""
    names = ("method", "steps", "rank", "num_layers", "grad_checkpoint", "held_out", "since")
    names += ("fim_rate", "spm_rate", "batch_size", "learning_rate", "max_tokens", "save_every")
    names += ("eval_every", "eval_batches", "seed")
    return {"model": os.fspath(arguments["model"]), **{k: arguments[k] for k in names}}


def _check(repo: Any, out: Any, s: dict[str, Any], resume: bool) -> Path:
    """Every setting checked before anything loads; the output folder."""
    if s["method"] not in METHODS:
        msg = f"method must be one of {', '.join(METHODS)}; not {s['method']!r}."
        raise InvalidParameterError(msg)
    for name in ("steps", "rank", "batch_size", "max_tokens", "save_every", "eval_every"):
        if isinstance(s[name], bool) or not isinstance(s[name], int) or s[name] < 1:
            msg = f"{name} must be a positive integer; not {s[name]!r}."
            raise InvalidParameterError(msg)
    for name in ("eval_batches", "num_layers"):
        if s[name] is not None and (isinstance(s[name], bool) or not isinstance(s[name], int) or s[name] < 1):
            msg = f"{name} must be a positive integer, or None for all; not {s[name]!r}."
            raise InvalidParameterError(msg)
    if not 0 < s["held_out"] < 1:
        msg = (
            "held_out is the fraction of files kept out of training, between 0 and 1 (e.g. 0.1); "
            f"not {s['held_out']!r}."
        )
        raise InvalidParameterError(msg)
    for name in ("fim_rate", "spm_rate"):
        if not 0 <= s[name] <= 1:
            msg = f"{name} is a share of the examples, from 0 to 1; not {s[name]!r}."
            raise InvalidParameterError(msg)
    if not (s["learning_rate"] > 0 and math.isfinite(s["learning_rate"])):
        msg = f"learning_rate must be a positive number; not {s['learning_rate']!r}."
        raise InvalidParameterError(msg)
    if not Path(repo).is_dir():
        msg = f"{os.fspath(repo)} is not a folder: give the repository's root folder."
        raise InvalidParameterError(msg)
    path = Path(out)
    if path.exists() and not path.is_dir():
        msg = f"out={os.fspath(out)!r} is a file; give a folder for the adapter (it is made if missing)."
        raise InvalidParameterError(msg)
    if not resume and has_checkpoint(path):
        msg = (
            f"{path} holds a run's checkpoint ({STATE_FILE}): continue it with --resume (resume=True), "
            "or give another --out folder."
        )
        raise InvalidParameterError(msg)
    return path


def _data(repo: Path, s: dict[str, Any]) -> _Data:
    """The files split into train and held-out, and the examples of each (held-out: no FIM order is
    favoured, the same rates)."""
    from ..loading import load_tokenizer, read_config, resolve_model_path
    from .data import build_dataset
    from .split import split_files

    split = split_files(repo, held_out=s["held_out"], since=s["since"], seed=s["seed"])
    path = resolve_model_path(s["model"])
    tokenizer = load_tokenizer(path, read_config(path))
    rates = {"fim_rate": s["fim_rate"], "spm_rate": s["spm_rate"], "max_tokens": s["max_tokens"]}
    train = list(build_dataset(repo, split.train, tokenizer, **rates, seed=s["seed"]))
    held_out = list(build_dataset(repo, split.held_out, tokenizer, **rates, seed=s["seed"] + 1))
    if len(train) < s["batch_size"]:
        msg = (
            f"The {len(split.train)} training files of {repo} make {len(train)} examples, fewer than "
            f"batch_size={s['batch_size']}: lower the batch size or train on a bigger repository."
        )
        raise InvalidParameterError(msg)
    if not held_out:
        msg = f"The held-out files of {repo} ({split.held_out}) make no examples: hold out more files."
        raise InvalidParameterError(msg)
    digest = hashlib.sha256(json.dumps([train, held_out]).encode()).hexdigest()[:16]
    return _Data(train, held_out, list(split.train), list(split.held_out), digest)


def _check_resumable(state: Any, settings: dict[str, Any], data: _Data, out: Path) -> None:
    """A checkpoint resumes only with the settings and data it was trained with, and short of ``steps``."""
    saved = state.settings
    differ = [k for k in settings if k not in _MAY_CHANGE and saved.get(k) != settings[k]]
    if differ:
        what = ", ".join(f"{k}={saved.get(k)!r} there, {settings[k]!r} now" for k in differ)
        msg = f"The checkpoint in {out} was trained with other settings ({what}): resume with the same."
        raise CheckpointError(msg)
    if saved.get("data_digest") != data.digest:
        msg = (
            f"The repository's training examples differ from those the checkpoint in {out} was trained "
            "on (files changed since): resuming would not continue the same run. Start afresh in "
            "another --out folder."
        )
        raise CheckpointError(msg)
    if state.step >= settings["steps"]:
        msg = (
            f"The checkpoint in {out} is at step {state.step}, and steps={settings['steps']}: nothing "
            "to resume. Pass more steps to train on."
        )
        raise CheckpointError(msg)


def batches(start: int = 0, seed: int = 0) -> Any:
    """mlx-lm's ``iterate_batches`` with an order of its own: examples sorted by length into batches
    (as mlx-lm does), batches shuffled each epoch by a generator seeded with ``seed`` and the epoch, the
    first ``start`` skipped. mlx-lm's order comes from numpy's global generator, which its evaluation
    also draws from, so it could not be replayed on resume. An evaluation (no ``loop``) sees the
    batches in the same order every time, its last short batch kept."""
    import numpy as np
    from mlx_lm.tuner.trainer import iterate_batches

    def iterate(
        dataset: Sequence[Any],
        batch_size: int,
        max_seq_length: int,
        loop: bool = False,
        comm_group: Any = None,
    ) -> Iterator[Any]:
        order = sorted(range(len(dataset)), key=lambda i: len(dataset[i][0]))
        groups = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        if loop:
            groups = [g for g in groups if len(g) == batch_size]
        done = 0
        for epoch in itertools.count():
            for g in np.random.default_rng([seed, epoch]).permutation(len(groups)):
                if done >= start:
                    items = [dataset[j] for j in groups[g]]
                    yield next(iterate_batches(items, len(items), max_seq_length, comm_group=comm_group))
                done += 1
            if not loop:
                return

    return iterate


class _Run:
    """One run: the model with its adapter, the optimizer, the data, the history; mlx-lm's trainer
    calls :meth:`on_step` after every step (through :func:`_reporter`)."""

    def __init__(self, settings: dict[str, Any], data: _Data, out: Path, model: Any, optimizer: Any) -> None:
        self.settings, self.data, self.out = settings, data, out
        self.model, self.optimizer = model, optimizer
        self.start_step, self.step = 0, 0
        self.saved: int | None = None  # the step of the last checkpoint this run wrote
        self.history: dict[str, Any] = {
            "losses": [],
            "held_out": [],
            "trained_tokens": 0,
            "train_seconds": 0.0,
        }
        self.callback: Any = None
        self.bar: Any = None
        self.tokens_before = 0  # trained tokens before this call's training (on resume)
        self.aside = 0.0  # seconds in evaluations and checkpoints during training: not training time

    @classmethod
    def start(cls, settings: dict[str, Any], data: _Data, out: Path, state: Any, callback: Any) -> _Run:
        """The model loaded with its adapter (and the checkpoint's weights and optimizer on resume)."""
        import mlx.core as mx
        import mlx.optimizers as optim

        from .checkpoints import restore

        mx.random.seed(settings["seed"])  # LoRA's initial weights, as mlx_lm.lora seeds them
        model = load_trainable(settings)
        out.mkdir(parents=True, exist_ok=True)  # only now: a bad setting, repository or model leaves nothing
        optimizer = optim.Adam(learning_rate=settings["learning_rate"])
        run = cls(settings, data, out, model, optimizer)
        run.callback = callback
        write_adapter_config(out, settings, model)
        if state is not None:
            restore(state, model, optimizer, out)
            run.start_step = run.step = state.step
            run.history = state.history
        return run

    def train(self) -> FinetuneResult:
        """Held-out loss before; mlx-lm's ``train`` to ``steps``; held-out loss after; the files."""
        from .._progress import progress_bar

        if not self.history["held_out"]:
            self.history["held_out"].append({"step": 0, "loss": self.held_out_loss()})
        self.bar = progress_bar(self.settings["steps"], "Fine-tuning", "step")
        self.bar.update(self.step)
        try:
            self._train()
            self.bar.close()
            if self.history["held_out"][-1]["step"] != self.step:
                self.history["held_out"].append({"step": self.step, "loss": self.held_out_loss()})
            self.checkpoint()
        except KeyboardInterrupt:
            self._save_interrupted()
            raise
        finally:
            self.bar.close()
        return self.finish()

    def _train(self) -> None:
        """mlx-lm's loop, told of every step (our progress, evaluations and checkpoints), its own saving
        off (ours are atomic and resumable) and its console quiet (our bar shows the loss)."""
        from mlx_lm.cli_ui import make_console
        from mlx_lm.tuner.trainer import TrainingArgs, train

        s, iters = self.settings, self.settings["steps"] - self.step
        scratch = (
            self.out / f".mlx_lm_final.{os.getpid()}.safetensors"
        )  # its end-of-run save: ours is the checkpoint
        args = TrainingArgs(
            batch_size=s["batch_size"],
            iters=iters,
            steps_per_report=1,
            steps_per_eval=iters + 1,
            steps_per_save=iters + 1,
            max_seq_length=s["max_tokens"],
            adapter_file=str(scratch),
        )
        self.tokens_before = self.history["trained_tokens"]
        console = make_console()
        quiet, console.quiet = console.quiet, True
        tic = time.perf_counter()
        try:
            with checkpointed(self.model if s["grad_checkpoint"] else None):
                train(
                    self.model,
                    self.optimizer,
                    self.data.train,
                    args=args,
                    iterate_batches=batches(self.step, s["seed"]),
                    training_callback=_reporter(self),
                )
        finally:
            console.quiet = quiet
            self.history["train_seconds"] += time.perf_counter() - tic - self.aside
            self.aside = 0.0
            with contextlib.suppress(OSError):
                scratch.unlink()

    def held_out_loss(self) -> float:
        """The mean loss per masked-in token over every held-out example (mlx-lm's ``evaluate``)."""
        from mlx_lm.tuner.trainer import evaluate

        s = self.settings
        loss = evaluate(
            self.model,
            self.data.held_out,
            s["batch_size"],
            num_batches=s["eval_batches"] or -1,
            max_seq_length=s["max_tokens"],
            iterate_batches=batches(),
        )
        self.model.train()
        return float(loss)

    def on_step(self, info: dict[str, Any]) -> None:
        """After step ``info["iteration"]`` of this call: the loss recorded and shown; the held-out loss
        and a checkpoint when due; then the caller's callback."""
        s = self.settings
        self.step = self.start_step + info["iteration"]
        loss = float(info["train_loss"])
        self.history["losses"].append({"step": self.step, "loss": loss})
        self.history["trained_tokens"] = self.tokens_before + int(info["trained_tokens"])
        tic = time.perf_counter()
        if self.step % s["eval_every"] == 0 and self.step < s["steps"]:
            self.history["held_out"].append({"step": self.step, "loss": self.held_out_loss()})
        if self.step % s["save_every"] == 0 and self.step < s["steps"]:
            self.checkpoint()
        self.aside += time.perf_counter() - tic
        held = self.history["held_out"][-1]["loss"]
        self.bar.set_postfix_str(f"loss {loss:.3f}, held-out {held:.3f}", refresh=False)
        self.bar.update(1)
        if self.callback is not None:
            self.callback.on_train_loss_report({**info, "iteration": self.step})

    def checkpoint(self) -> None:
        """The resume state and the adapter at this step, and the log to match."""
        save_checkpoint(self.out, self.step, self.model, self.optimizer, self.settings, self.history)
        write_log(self.out, self.record())
        self.saved = self.step

    def _save_interrupted(self) -> None:
        """Ctrl-C: a checkpoint of the last step done (the optimizer's count: a step is whole once
        its update is), unless the last checkpoint is of it."""
        import mlx.core as mx

        mx.eval(self.model.parameters(), self.optimizer.state)
        self.step = int(self.optimizer.step.item())  # restored on resume: the run's count
        self.history["losses"] = [r for r in self.history["losses"] if r["step"] <= self.step]
        if self.saved != self.step:
            self.checkpoint()

    def record(self) -> dict[str, Any]:
        """finetune.json: the settings, the files, the losses, the speed."""
        h = self.history
        seconds = h["train_seconds"]
        return {
            "settings": {k: v for k, v in self.settings.items() if k != "data_digest"},
            "step": self.step,
            "train_files": self.data.train_files,
            "held_out_files": self.data.held_out_files,
            "train_examples": len(self.data.train),
            "held_out_examples": len(self.data.held_out),
            "held_out_loss_before": h["held_out"][0]["loss"],
            "held_out_loss_after": h["held_out"][-1]["loss"]
            if h["held_out"][-1]["step"] == self.step
            else None,
            "losses": h["losses"],
            "held_out_losses": h["held_out"],
            "trained_tokens": h["trained_tokens"],
            "train_seconds": seconds,
            "tokens_per_second": h["trained_tokens"] / seconds if seconds > 0 else None,
        }

    def finish(self) -> FinetuneResult:
        """The loss curve drawn; the result."""
        record = self.record()
        plot = plot_losses(self.out, record["losses"], record["held_out_losses"])
        return FinetuneResult(
            out=self.out,
            steps=self.step,
            held_out_loss_before=record["held_out_loss_before"],
            held_out_loss_after=record["held_out_loss_after"],
            losses=record["losses"],
            held_out_losses=record["held_out_losses"],
            tokens_per_second=record["tokens_per_second"] or 0.0,
            train_files=self.data.train_files,
            held_out_files=self.data.held_out_files,
            settings=record["settings"],
            plot=plot,
        )


def _reporter(run: _Run) -> Any:
    """An mlx-lm ``TrainingCallback`` passing each step's report to ``run``."""
    from mlx_lm.tuner.callbacks import TrainingCallback

    class Reporter(TrainingCallback):
        def on_train_loss_report(self, train_info: dict[str, Any]) -> None:
            run.on_step(train_info)

    return Reporter()
