"""A Jupyter notebook as the cells StarCoder2 was trained on: text, code, and each code cell's output.

The format is BigCode's structured notebooks (bigcode-project/bigcode-dataset,
``preprocessing/jupyter-structured``; the-stack-v2 ``Jupyter_notebooks`` uses the same pipeline): a
notebook is ``<jupyter_start>`` then, per cell, ``<jupyter_text>{markdown}`` or
``<jupyter_code>{code}<jupyter_output>{output}``, each part stripped, ``<empty_output>`` where a cell
printed nothing and an output over 1,000 characters cut with ``[...]``. docs/jupyter.md has the
worked example and what we changed (every output kind rendered, cuts keep the end too).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidParameterError

#: Outputs longer than this are cut to their start and end around :data:`CUT_MARKER` (the training
#: data kept the first 1,000 characters; the end of an output, a traceback's last line or a
#: DataFrame's shape, is often what matters).
MAX_OUTPUT_CHARS = 1000
OUTPUT_HEAD_CHARS = 700
CUT_MARKER = "[...]"

# Terminal colours (IPython's tracebacks) and other CSI / OSC escape sequences.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


@dataclass(frozen=True)
class NotebookCell:
    """One markdown or code cell, as the model sees it."""

    kind: str
    """"markdown" or "code"."""
    source: str
    """The cell's text, stripped of surrounding whitespace (as in training)."""
    output: str = ""
    """A code cell's outputs rendered as text ("" when it printed nothing: ``<empty_output>``)."""


@dataclass(frozen=True)
class NotebookContext:
    """The cells around the one that holds the hole, for notebook-aware fill-in-the-middle.

    Pass it as ``notebook=`` to ``engine.infill`` (and its stream, async and batch forms),
    :class:`~langchain_starcoder.fim.request.FIMRequest`, ``engine.fim_prompt`` and the wrappers' ``infill``,
    with the hole cell's live text (before and after the cursor) as prefix and suffix.

    Instantiate:
        .. code-block:: python

            from langchain_starcoder import NotebookContext

            ctx = NotebookContext.from_notebook("analysis.ipynb", cell=3)
            engine.infill("df.groupby(", ")", notebook=ctx)
    """

    cells: tuple[NotebookCell, ...]
    """The notebook's markdown and code cells (raw cells left out), in order."""
    cell: int
    """The index in :attr:`cells` of the code cell that holds the hole."""
    path: str | None = None
    """The notebook's path, when it came from a file (or was given)."""
    language: str = "python"
    """The kernel's language, from the notebook's metadata."""
    hole_output: str = ""
    """The hole cell's saved output (its last run), shown after the cell: an error it raised."""

    def __post_init__(self) -> None:
        if not 0 <= self.cell < len(self.cells) or self.cells[self.cell].kind != "code":
            msg = f"cell={self.cell} is not the index of a code cell of this notebook."
            raise InvalidParameterError(msg)

    def code_around(self, prefix: str, suffix: str) -> tuple[str, str]:
        """The notebook's code cells as one script around the hole's live text (what a repository
        index reads for the modules the notebook imports)."""
        before = "".join(c.source + "\n\n" for c in self.cells[: self.cell] if c.kind == "code")
        after = "".join("\n\n" + c.source for c in self.cells[self.cell + 1 :] if c.kind == "code")
        return before + prefix, suffix + after

    @classmethod
    def from_notebook(
        cls, notebook: str | os.PathLike[str] | Mapping[str, Any], cell: int, *, path: str | None = None
    ) -> NotebookContext:
        """The context of code cell ``cell`` (its index in the notebook's ``cells``) of ``notebook``:
        a path to an ``.ipynb``, its JSON as a dict, or an ``nbformat`` v4 node.

        Raises:
            InvalidParameterError: not a notebook of format 4, or ``cell`` is not a code cell.
            FileNotFoundError: no file at the path.
        """
        if isinstance(notebook, str | os.PathLike):
            file = Path(notebook)
            try:
                data = json.loads(file.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                msg = f"{file} is not a notebook (.ipynb JSON): {e}"
                raise InvalidParameterError(msg) from e
            path = path if path is not None else os.fspath(notebook)
        else:
            data = notebook
        raw_cells = _cells_of(data)
        if isinstance(cell, bool) or not isinstance(cell, int) or not 0 <= cell < len(raw_cells):
            last = len(raw_cells) - 1
            msg = f"cell must be the index of a cell of this notebook (0 to {last}), not {cell!r}."
            raise InvalidParameterError(msg)
        cells: list[NotebookCell] = []
        index = hole_output = None
        for i, raw in enumerate(raw_cells):
            if not isinstance(raw, Mapping):
                msg = f"cells[{i}] must be a cell (an object), not {type(raw).__name__}."
                raise InvalidParameterError(msg)
            kind = raw.get("cell_type")
            if i == cell and kind != "code":
                msg = f"cell {cell} is a {_shown(kind)} cell; the hole must be in a code cell."
                raise InvalidParameterError(msg)
            if kind not in ("markdown", "code"):
                continue  # raw cells were not in the training data
            output = render_outputs(_outputs_of(raw, i)) if kind == "code" else ""
            if i == cell:
                index, hole_output = len(cells), output
            cells.append(NotebookCell(kind, _text(raw.get("source", "")).strip(), output))
        assert index is not None and hole_output is not None
        return cls(tuple(cells), index, path, _language(data), hole_output)


def _cells_of(data: Any) -> list[Any]:
    if not isinstance(data, Mapping):
        msg = f"notebook must be a path, a dict or an nbformat node, not {type(data).__name__}."
        raise InvalidParameterError(msg)
    major = data.get("nbformat")
    if major != 4 or not isinstance(data.get("cells"), list):
        msg = (
            f"Only notebooks of format 4 are read (this one: {major!r}); convert it with "
            "nbformat.convert(nbformat.read(path, as_version=nbformat.NO_CONVERT), 4)."
        )
        raise InvalidParameterError(msg)
    return data["cells"]


def _language(data: Mapping[str, Any]) -> str:
    """The kernel's language from ``metadata.language_info.name`` ("python" when not said)."""
    metadata = data.get("metadata", {})
    if not isinstance(metadata, Mapping):
        msg = f"the notebook's metadata must be an object, not {type(metadata).__name__}."
        raise InvalidParameterError(msg)
    info = metadata.get("language_info", {})
    if not isinstance(info, Mapping):
        msg = f"metadata.language_info must be an object, not {type(info).__name__}."
        raise InvalidParameterError(msg)
    name = info.get("name")
    return name if isinstance(name, str) and name else "python"


def _outputs_of(raw: Mapping[str, Any], i: int) -> list[Any]:
    """A code cell's outputs: a list of objects (nbformat's), each checked."""
    outputs = raw.get("outputs")
    if outputs is None:
        return []
    if not isinstance(outputs, list):
        msg = f"cells[{i}].outputs must be a list, not {type(outputs).__name__}."
        raise InvalidParameterError(msg)
    for j, output in enumerate(outputs):
        if not isinstance(output, Mapping):
            msg = f"cells[{i}].outputs[{j}] must be an output (an object), not {type(output).__name__}."
            raise InvalidParameterError(msg)
        data = output.get("data")
        if data is not None and not isinstance(data, Mapping):
            kind = type(data).__name__
            msg = f"cells[{i}].outputs[{j}].data must be an object (MIME type: value), not {kind}."
            raise InvalidParameterError(msg)
    return outputs


def _shown(value: Any) -> str:
    """A field's value in a message: a string as it is (cut), anything else by its type."""
    return value[:40] if isinstance(value, str) else type(value).__name__


def _text(value: Any) -> str:
    """A notebook string field: one string, or a list of lines (nbformat's multiline form)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence):
        return "".join(v for v in value if isinstance(v, str))
    return ""


def render_outputs(outputs: Sequence[Any]) -> str:
    """A code cell's outputs as one text: stream text, ``text/plain`` results, an error's name and
    message (ANSI codes stripped), a short marker for images and other rich outputs; cut to its
    start and end when over :data:`MAX_OUTPUT_CHARS`."""
    texts = [text for output in outputs if isinstance(output, Mapping) and (text := _render(output))]
    return cut_output(_ANSI.sub("", "\n".join(texts)).strip())


def _render(output: Mapping[str, Any]) -> str:
    kind = output.get("output_type")
    if kind == "stream":
        return _text(output.get("text", "")).strip("\n")
    if kind == "error":
        return f"{_text(output.get('ename', 'Error'))}: {_text(output.get('evalue', ''))}".rstrip(": ")
    if kind in ("execute_result", "display_data"):
        data = output.get("data")
        if not isinstance(data, Mapping):
            return ""  # checked by the reader of a notebook; a caller's own outputs may be anything
        if "text/plain" in data:
            return _text(data["text/plain"]).strip("\n")
        rich = next((mime for mime in data if isinstance(mime, str)), None)
        return f"[{rich} output]" if rich else ""
    return ""


def cut_output(text: str, limit: int = MAX_OUTPUT_CHARS) -> str:
    """``text``, or its start and end around :data:`CUT_MARKER` when longer than ``limit``."""
    if len(text) <= limit:
        return text
    head = limit * OUTPUT_HEAD_CHARS // MAX_OUTPUT_CHARS
    return text[:head] + CUT_MARKER + text[len(text) - (limit - head) :]


def render_text(ctx: NotebookContext) -> tuple[str, str]:
    """The notebook around the hole as plain text, unbudgeted (for tracers): what goes before the
    hole cell's prefix (``<jupyter_start>`` ... ``<jupyter_code>``) and after its suffix."""

    def cell_text(cell: NotebookCell) -> str:
        if cell.kind == "markdown":
            return f"<jupyter_text>{cell.source}"
        return f"<jupyter_code>{cell.source}{output_text(cell.output)}"

    def output_text(output: str) -> str:
        return f"<jupyter_output>{output or '<empty_output>'}"

    before = "".join(cell_text(c) for c in ctx.cells[: ctx.cell])
    after = "".join(cell_text(c) for c in ctx.cells[ctx.cell + 1 :])
    return f"<jupyter_start>{before}<jupyter_code>", output_text(ctx.hole_output) + after
