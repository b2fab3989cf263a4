"""Progress bars for long work: a checkpoint converted to GGUF, a built checkpoint's weights, a long prefill.

Shown on the command line (the ``langchain-starcoder`` command turns them on) and in a Jupyter notebook
(tqdm draws a widget there); a library call anywhere else prints nothing unless asked:
``show_progress(True)``. One setting for the whole process, read by every thread: a prefill runs on an
engine's worker thread, not the caller's.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

_setting: bool | None = None  # None: shown in Jupyter only


class show_progress:  # lower case: called as a function, or a ``with`` block (as torch's set_grad_enabled)
    """Show (True) or hide (False) the progress of long work from now on: ``show_progress()``; or until a
    block ends: ``with show_progress(): ...``. None goes back to the default, shown in a Jupyter notebook
    and nowhere else."""

    def __init__(self, on: bool | None = True) -> None:
        global _setting
        self._previous, _setting = _setting, on

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        global _setting
        _setting = self._previous


def progress_shown() -> bool:
    """Whether long work shows its progress now."""
    return _in_jupyter() if _setting is None else _setting


def progress_bar(total: int, description: str, unit: str = "it", *, leave: bool = True) -> Any:
    """A tqdm bar of ``total`` steps (bytes when ``unit`` is "B"), drawn on stderr or as a notebook
    widget when progress is shown; otherwise a disabled one, whose ``update`` does nothing."""
    from tqdm.auto import tqdm

    scale = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {}
    return tqdm(
        total=total,
        desc=description,
        unit=unit,
        leave=leave,
        disable=not progress_shown(),
        dynamic_ncols=True,
        **scale,
    )


def prefill_bar(tokens: int, step: int) -> Any:
    """A bar over a prefill of ``tokens`` in more than one ``step`` when progress is shown, updated once a
    step (a long prompt on a big model prefills for minutes on a CPU); else None, and no work at all."""
    if tokens <= step or not progress_shown():
        return None
    return progress_bar(tokens, "Prefill", "token", leave=False)


def prefill_steps(tokens: int, step: int, *, shown: bool = True) -> Iterator[int]:
    """Where each prefill step over ``tokens`` starts; each step done advances a :func:`prefill_bar`
    (when ``shown`` and there is one), closed when the steps end or stop."""
    bar = prefill_bar(tokens, step) if shown else None
    try:
        for start in range(0, tokens, step):
            yield start
            if bar is not None:
                bar.update(min(step, tokens - start))
    finally:
        if bar is not None:
            bar.close()


def advance_to(bar: Any, done: int) -> Any:
    """Move ``bar`` to ``done`` steps; at its total it is closed and None returned (nothing more to draw)."""
    bar.update(done - bar.n)
    if done < bar.total:
        return bar
    bar.close()
    return None


def _in_jupyter() -> bool:
    """A Jupyter kernel runs this process (as tqdm.auto tells notebooks from terminals)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})
