"""A fine-tuning run's checkpoint in its output folder: what ``--resume`` continues from, written so that
a failed write (a full disk, Ctrl-C) keeps the previous one.

mlx-lm's trainer saves the trained weights only (``adapters.safetensors``, written in place): resuming
from them restarts the optimizer's moments, its step (the schedule) and the data order, so a resumed run
would differ from an uninterrupted one. Ours adds the optimizer's state, the step and the run's history in
``training_state.safetensors``, and writes every file beside its place, then renames it over.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from ..errors import CheckpointError

#: mlx-lm's names: ``mlx_lm.generate --adapter-path DIR`` and ``mlx_lm.fuse`` read these two.
ADAPTER_FILE = "adapters.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
#: Ours: what the adapter file lacks to resume exactly.
STATE_FILE = "training_state.safetensors"


@dataclass
class TrainingState:
    """A checkpoint as read back: the step reached, the trainable weights and the optimizer's state
    (flat names), the settings it was trained with, and the run's history up to the step."""

    step: int
    weights: dict[str, mx.array]
    optimizer: dict[str, mx.array]
    settings: dict[str, Any]
    history: dict[str, Any]


def write_atomically(path: Path, write: Any) -> None:
    """``write(partial)`` to a file beside ``path`` (ending as ``path`` does: mlx adds a missing
    ``.safetensors``), synced, then renamed over ``path``; on any failure the partial file is removed
    and ``path`` is as it was."""
    partial = path.with_name(f".{path.stem}.{os.getpid()}.partial{path.suffix}")
    try:
        write(partial)
        with open(partial, "rb") as f:
            os.fsync(f.fileno())
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def save_arrays(path: Path, arrays: dict[str, mx.array], metadata: dict[str, str] | None = None) -> None:
    """mlx's safetensors writer (the one place this package writes a checkpoint's tensors)."""
    mx.save_safetensors(str(path), arrays, metadata=metadata or {})


def save_checkpoint(
    out: Path,
    step: int,
    model: Any,
    optimizer: Any,
    settings: dict[str, Any],
    history: dict[str, Any],
) -> None:
    """The resume state, then mlx-lm's adapter file, each written atomically. A write that fails (a
    full disk) raises :class:`CheckpointError` naming the step kept."""
    weights = dict(tree_flatten(model.trainable_parameters()))
    arrays = {f"model.{k}": v for k, v in weights.items()}
    arrays |= {f"optimizer.{k}": v for k, v in tree_flatten(optimizer.state)}
    metadata = {"step": str(step), "settings": json.dumps(settings), "history": json.dumps(history)}
    try:
        write_atomically(out / STATE_FILE, lambda p: save_arrays(p, arrays, metadata))
        write_atomically(out / ADAPTER_FILE, lambda p: save_arrays(p, weights))
    except (OSError, RuntimeError) as e:
        kept = _kept_step(out)
        previous = f"the checkpoint of step {kept} is kept" if kept else "no earlier checkpoint is there"
        msg = (
            f"Could not write the checkpoint of step {step} to {out}: {getattr(e, 'strerror', None) or e}; "
            f"{previous}. Free some space and run again with --resume (resume=True)."
        )
        raise CheckpointError(msg) from e


def _kept_step(out: Path) -> int | None:
    try:
        return load_checkpoint(out).step
    except CheckpointError:
        return None


def has_checkpoint(out: Path) -> bool:
    """Whether ``out`` holds a run's resume state."""
    return (out / STATE_FILE).is_file()


def load_checkpoint(out: Path) -> TrainingState:
    """The resume state in ``out``; a missing or damaged file: :class:`CheckpointError` saying what to do."""
    path = out / STATE_FILE
    if not path.is_file():
        msg = (
            f"Nothing to resume in {out}: it has no {STATE_FILE} (a run writes one at every checkpoint). "
            "Run without --resume (resume=False) to start afresh."
        )
        raise CheckpointError(msg)
    try:
        arrays, metadata = mx.load(str(path), return_metadata=True)
        step = int(metadata["step"])
        settings, history = json.loads(metadata["settings"]), json.loads(metadata["history"])
    except (RuntimeError, ValueError, KeyError, OSError) as e:
        msg = (
            f"The checkpoint {path} is damaged ({e}). Restore it, or delete it and run without "
            "--resume to start afresh."
        )
        raise CheckpointError(msg) from e
    weights = {k.removeprefix("model."): v for k, v in arrays.items() if k.startswith("model.")}
    optimizer = {k.removeprefix("optimizer."): v for k, v in arrays.items() if k.startswith("optimizer.")}
    return TrainingState(step, weights, optimizer, settings, history)


def restore(state: TrainingState, model: Any, optimizer: Any, path: Path) -> None:
    """Put the checkpoint's weights into ``model`` and its moments and step into ``optimizer``; weights
    that do not fit the model (another method, rank or base) raise :class:`CheckpointError`."""
    expected = dict(tree_flatten(model.trainable_parameters()))
    wrong = sorted(set(expected) ^ set(state.weights))
    wrong += [k for k in expected if k in state.weights and state.weights[k].shape != expected[k].shape]
    if wrong:
        msg = (
            f"The checkpoint in {path} does not fit this model and method ({len(wrong)} tensors differ, "
            f"e.g. {wrong[:3]}): resume with the model and settings it was trained with."
        )
        raise CheckpointError(msg)
    model.load_weights(list(state.weights.items()), strict=False)
    optimizer.state = tree_unflatten(list(state.optimizer.items()))
    optimizer.init(model.trainable_parameters())
    mx.eval(model.parameters(), optimizer.state)
