"""A fine-tuning run's record beside its adapter: ``finetune.json`` (settings, files, losses, speed) and
``loss.png`` (the loss curve; matplotlib is the ``finetune`` extra)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from .checkpoints import write_atomically

LOG_FILE = "finetune.json"
PLOT_FILE = "loss.png"
PLOT_HINT = "pip install 'langchain-starcoder[finetune]'"


class NoLossPlotNotice(UserWarning):
    """matplotlib is not installed, so no loss.png was drawn (finetune.json has the same figures)."""


def write_log(out: Path, record: dict[str, Any]) -> Path:
    """``record`` as ``out/finetune.json``, written beside and renamed over (never half a file)."""
    path = out / LOG_FILE
    text = json.dumps(record, indent=2)
    write_atomically(path, lambda p: Path(p).write_text(text, encoding="utf-8"))
    return path


def plot_losses(out: Path, losses: list[dict[str, Any]], held_out: list[dict[str, Any]]) -> Path | None:
    """The training loss per step and the held-out loss where it was measured, as ``out/loss.png``;
    None (and a :class:`NoLossPlotNotice`) when matplotlib is missing."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        msg = (
            f"No {PLOT_FILE}: drawing the loss curve needs matplotlib ({PLOT_HINT}); "
            f"{LOG_FILE} has the losses."
        )
        warnings.warn(msg, NoLossPlotNotice, stacklevel=2)
        return None
    # A Figure of its own (not pyplot): no global backend or window state in a library call.
    figure = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.plot([r["step"] for r in losses], [r["loss"] for r in losses], label="training loss", lw=1)
    axes.plot(
        [r["step"] for r in held_out], [r["loss"] for r in held_out], "o-", label="held-out loss", lw=1.5
    )
    axes.set_xlabel("step")
    axes.set_ylabel("loss (nats per token)")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path = out / PLOT_FILE
    write_atomically(path, lambda p: figure.savefig(p, format="png"))
    return path
