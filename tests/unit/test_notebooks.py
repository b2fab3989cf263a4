"""The notebooks: stored without outputs, and each runs top to bottom on a built checkpoint."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))

# What each notebook must show when run: text its outputs contain, and how many pictures.
EXPECTED = {
    "01_langchain_quickstart.ipynb": (["cached_tokens", "finish_reason", "tokens/s"], 1),
    "02_fill_in_the_middle.ipynb": (
        ["<fim_prefix>", "<file_sep>", "context files kept", "cached,", "files indexed", "--- shop/"],
        1,
    ),
    "03_llama_index_retrieval.ipynb": (["chunks", "sources:", "pricing.py"], 0),
    "04_notebook_context.ipynb": (
        [
            "<jupyter_start><jupyter_text># Prices",
            "<jupyter_output>SyntaxError",
            "cells kept",
            "starcoder offers: ['pri",
        ],
        0,
    ),
}


def test_the_notebooks_are_there():
    assert sorted(p.name for p in NOTEBOOKS) == sorted(EXPECTED)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert code
    for cell in code:
        assert cell.outputs == []
        assert cell.execution_count is None
    # $LANGCHAIN_STARCODER_MODEL, else the hub, else an offline stand-in: as in the examples.
    assert "from langchain_starcoder.testing import model_or_offline\n" in code[0].source
    assert "\nMODEL = model_or_offline()\n" in code[0].source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_says_how_to_install_and_start_jupyter(path: Path):
    intro = nbformat.read(path, as_version=4).cells[0]
    assert intro.cell_type == "markdown"
    assert 'pip install -e ".[examples]"\njupyter lab notebooks/\n' in intro.source


def outputs_text(nb: nbformat.NotebookNode) -> tuple[str, int]:
    """All text the executed notebook printed or displayed, and the number of images."""
    texts, images = [], 0
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                texts.append(output.text)
            elif output.output_type in ("execute_result", "display_data"):
                texts.append(output.data.get("text/plain", ""))
                images += "image/png" in output.data
    return "".join(texts), images


def execute(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> nbformat.NotebookNode:
    """Run the notebook offline in a fresh kernel from notebooks/, as Jupyter does; return it with outputs."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))  # no history in the real home
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS_DIR)}}
    )
    client.execute()  # raises CellExecutionError, with the cell and traceback, if any cell fails
    return nb


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path: Path, tiny_path: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("LANGCHAIN_STARCODER_MODEL", str(tiny_path))
    nb = execute(path, tmp_path, monkeypatch)
    text, images = outputs_text(nb)
    assert f"model: {tiny_path}" in text  # the notebook ran on the checkpoint the variable names
    must_show, pictures = EXPECTED[path.name]
    for needle in must_show:
        assert needle in text, f"{path.name} should show {needle!r}"
    assert images >= pictures
    if path.name == "02_fill_in_the_middle.ipynb":
        rows = [tuple(map(int, m)) for m in re.findall(r"(\d+) prompt tokens:\s+(\d+) cached", text)]
        assert len(rows) == 4
        # Every repeated infill reused the cached part of the prompt, and prefilled the rest.
        assert all(0 < cached < prompt for prompt, cached in rows)
    # Running it must not have written outputs into the stored file.
    assert all(c.outputs == [] for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_falls_back_offline_like_the_examples(path: Path, tmp_path: Path, monkeypatch):
    """No variable and no hub: the notebook says so and runs on the examples' offline checkpoint."""
    monkeypatch.delenv("LANGCHAIN_STARCODER_MODEL", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # an empty hub cache, and the stand-in built under it
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    nb = execute(path, tmp_path, monkeypatch)
    text, _ = outputs_text(nb)
    offline = tmp_path / ".cache" / "langchain-starcoder" / "offline-tiny"
    assert "Could not download 'mlx-community/starcoder2-3b-4bit'" in text
    assert f"-> Using an offline checkpoint with random weights at {offline}." in text
    assert f"model: {offline}" in text and (offline / "config.json").is_file()
