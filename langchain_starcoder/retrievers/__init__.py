"""Retrieval over a :class:`~langchain_starcoder.RepoIndex` for RAG chains: a LangChain retriever here,
the LlamaIndex one (:class:`langchain_starcoder.retrievers.llama_index.RepoNodeRetriever`) on the
same search.

A text query is read as code a cursor sits after, in a file of its own (or in ``file_path``, whose
imports and neighbours then count and which is left out): the index returns the definitions of the
names the query mentions, outlines of related files and the 20-line windows sharing its rarest words,
packed into ``max_tokens``; the most related file comes first, each file once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, model_validator

from ..errors import InvalidParameterError
from ..fim.request import ContextFile
from ..repo import GAP_MARKER, RepoIndex
from ..repo.chunks import split_lines
from ..repo.files import relative_path
from ..types import is_int

if TYPE_CHECKING:
    from typing_extensions import Self

#: What a query costs when no tokenizer is given: code averages 3 to 4 characters a token.
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """A tokenizer-free token count (``len(text) / 4``, rounded up)."""
    return -(-len(text) // CHARS_PER_TOKEN)


@dataclass(frozen=True)
class Excerpt:
    """One file's part of a search's answer."""

    path: str
    """The file, relative to the index's root."""
    text: str
    """The file's own lines, in their order."""
    kind: str
    """"file" (the whole file), "excerpt" (consecutive lines of it) or "outline" (chosen lines, such
    as signatures, with a ``⋮`` line where lines next to an excerpt were left out)."""
    rank: int
    """0 for the most related file, then 1, 2..."""


def search(
    index: RepoIndex,
    query: str,
    *,
    k: int,
    max_tokens: int,
    count_tokens: Callable[[str], int] | None = None,
    file_path: str | None = None,
) -> list[Excerpt]:
    """The at most ``k`` files of ``index`` most related to ``query``, best first, each once, whose parts
    fit ``max_tokens`` together (as the index counts a prompt's context files)."""
    if not isinstance(query, str):
        msg = f"A repository query is text, not {type(query).__name__}."
        raise InvalidParameterError(msg)
    path = check_search(index, k, max_tokens, file_path)
    count = count_tokens or estimate_tokens
    files = index.context_files(path, query, "", max_tokens=max_tokens, count_tokens=count, one_per_file=True)
    best_first = files[::-1][:k]  # prompt order puts the most related file last, next to the hole
    return [Excerpt(f.path, f.text, _kind(index, f), rank) for rank, f in enumerate(best_first)]


def search_by(retriever: Any, query: str, k: int | None = None) -> list[Excerpt]:
    """:func:`search` with a retriever's settings (``index``, ``k``, ``max_tokens``, ``count_tokens``,
    ``file_path``: the LangChain and LlamaIndex retrievers have the same), ``k`` overriding its own."""
    return search(
        retriever.index,
        query,
        k=retriever.k if k is None else k,
        max_tokens=retriever.max_tokens,
        count_tokens=retriever.count_tokens,
        file_path=retriever.file_path,
    )


def check_search(index: Any, k: Any, max_tokens: Any, file_path: str | None) -> str:
    """Refuse bad search arguments; the file's path relative to the index ("" for none)."""
    if not isinstance(index, RepoIndex):
        msg = f"index must be a RepoIndex (RepoIndex(folder)), not {type(index).__name__}."
        raise InvalidParameterError(msg)
    if not is_int(k) or k < 1:
        msg = f"k must be a positive integer (how many files to return), not {k!r}."
        raise InvalidParameterError(msg)
    if not is_int(max_tokens) or max_tokens < 0:
        msg = f"max_tokens must be an integer >= 0, not {max_tokens!r}."
        raise InvalidParameterError(msg)
    return "" if file_path is None else relative_path(index.root, file_path)


def _kind(index: RepoIndex, file: ContextFile) -> str:
    text = index.text(file.path)  # the indexed text: nothing read again, nothing outside the root
    whole = None if text is None else "\n".join(split_lines(text))  # the lines excerpts are made of
    if whole is not None and file.text.strip("\n") == whole.strip("\n"):
        return "file"
    lines = file.text.split("\n")
    if whole is not None and GAP_MARKER not in lines and f"\n{file.text}\n" in f"\n{whole}\n":
        return "excerpt"
    return "outline"


def metadata(excerpt: Excerpt) -> dict[str, Any]:
    return {"path": excerpt.path, "kind": excerpt.kind, "rank": excerpt.rank}


class RepoRetriever(BaseRetriever):
    """A LangChain retriever over a :class:`~langchain_starcoder.RepoIndex`: ``Document``\\ s whose
    ``page_content`` is a file's related code and whose metadata holds ``path`` (relative to the
    index's root), ``kind`` ("file", "excerpt" or "outline") and ``rank`` (0 is the most related).

    How a text query maps onto the index: see :mod:`langchain_starcoder.retrievers`. The documents
    feed ``FIMPromptTemplate``'s ``context_files`` (it reads ``metadata["path"]``) or any RAG prompt.

    Instantiate:
        .. code-block:: python

            from langchain_starcoder import RepoIndex, RepoRetriever

            retriever = RepoRetriever(index=RepoIndex("path/to/repo"), k=4, max_tokens=1024)

    Invoke:
        .. code-block:: python

            docs = retriever.invoke("apply_discount(order, code)")
            docs = retriever.invoke("class Inventory", k=2)
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    index: Any
    """The :class:`~langchain_starcoder.RepoIndex` searched."""
    k: int = Field(default=4, ge=1)
    """The most documents (files) returned; ``invoke(query, k=...)`` overrides it."""
    max_tokens: int = Field(default=1024, ge=0)
    """The budget the documents' paths and texts fit together."""
    count_tokens: Callable[[str], int] | None = None
    """Measures ``max_tokens`` (e.g. ``engine.count_tokens``); None: about 4 characters a token."""
    file_path: str | None = None
    """The file being worked on, if any: its imports rank higher and it is never returned."""

    @model_validator(mode="after")
    def _checked(self) -> Self:
        check_search(self.index, self.k, self.max_tokens, self.file_path)
        return self

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, k: int | None = None
    ) -> list[Document]:
        found = search_by(self, query, k)
        return [Document(page_content=e.text, metadata=metadata(e)) for e in found]


__all__ = ["Excerpt", "RepoRetriever", "estimate_tokens", "search"]
