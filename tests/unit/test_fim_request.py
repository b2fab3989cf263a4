"""FIMRequest's ``repo`` and ``notebook`` fields: typed (a RepoIndex, a NotebookContext) and checked on
construction, with an error that names the type given; the engine stays usable after a refusal."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from langchain_starcoder import FIMRequest, InvalidParameterError, NotebookContext, RepoIndex, StarCoderEngine
from langchain_starcoder.fim.request import RepoContext
from langchain_starcoder.notebook import NotebookCell

NOTEBOOK = {
    "nbformat": 4,
    "nbformat_minor": 5,
    "metadata": {},
    "cells": [
        {"cell_type": "code", "source": "x = 1", "metadata": {}, "outputs": [], "execution_count": None}
    ],
}


class LooksLikeANotebook:
    """Has what the old duck test asked of a notebook (a ``from_notebook``), and nothing else."""

    @classmethod
    def from_notebook(cls, notebook: object, cell: int) -> LooksLikeANotebook:
        return cls()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "util.py").write_text("def helper(x):\n    return x * 2\n")
    return tmp_path


def test_the_fields_are_typed() -> None:
    hints = typing.get_type_hints(FIMRequest)
    assert hints["repo"] == RepoContext | None
    assert hints["notebook"] == NotebookContext | None


@pytest.mark.parametrize(
    ("notebook", "given"),
    [
        (NOTEBOOK, "dict"),  # the nbformat JSON, not a context built from it
        ("analysis.ipynb", "str"),
        (NotebookCell("code", "x = 1"), "NotebookCell"),
        (LooksLikeANotebook(), "LooksLikeANotebook"),
    ],
)
def test_a_wrong_notebook_is_refused_naming_its_type(tiny_engine: StarCoderEngine, notebook, given) -> None:
    with pytest.raises(InvalidParameterError, match=rf"notebook must be a NotebookContext .*, not {given}\."):
        FIMRequest("a", "b", notebook=notebook)
    with pytest.raises(InvalidParameterError, match=rf"not {given}\."):
        tiny_engine.infill("a", "b", notebook=notebook, max_tokens=2)
    context = NotebookContext.from_notebook(NOTEBOOK, 0)
    assert FIMRequest("x = ", "", notebook=context).notebook is context
    assert tiny_engine.infill("x = ", "", notebook=context, max_tokens=2).completion_tokens > 0


@pytest.mark.parametrize(
    ("make", "given"),
    [
        (str, "str"),
        (Path, "PosixPath"),
        (lambda root: NotebookContext.from_notebook(NOTEBOOK, 0), "NotebookContext"),
    ],
)
def test_a_wrong_repo_is_refused_naming_its_type(
    tiny_engine: StarCoderEngine, repo: Path, make, given
) -> None:
    with pytest.raises(InvalidParameterError, match=rf"repo must be a RepoIndex .*, not {given}\."):
        FIMRequest("a", "b", repo=make(repo), file_path="main.py")
    with pytest.raises(InvalidParameterError, match=rf"not {given}\."):
        tiny_engine.infill("a", "b", repo=make(repo), file_path="main.py", max_tokens=2)
    index = RepoIndex(repo)
    assert isinstance(index, RepoContext)  # the protocol fim names is what a RepoIndex is
    assert FIMRequest("a", "b", repo=index, file_path="main.py").repo is index
    assert (
        tiny_engine.infill("helper(", ")", repo=index, file_path="main.py", max_tokens=2).completion_tokens
        > 0
    )
