"""The LlamaIndex retriever over a :class:`~langchain_starcoder.RepoIndex` (its own module: importing
LlamaIndex is only paid by those who use it)."""

from __future__ import annotations

import asyncio
from typing import Any

from ..errors import LLAMA_INDEX_MISSING

try:
    import llama_index.core  # noqa: F401  (the llama-index extra)
except ImportError as err:
    raise ImportError(LLAMA_INDEX_MISSING) from err

from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from . import check_search, estimate_tokens, metadata, search_by


class RepoNodeRetriever(BaseRetriever):
    """A LlamaIndex retriever over a :class:`~langchain_starcoder.RepoIndex`: ``NodeWithScore``\\ s of
    ``TextNode``\\ s holding a file's related code, with metadata ``path`` (relative to the index's
    root), ``kind`` ("file", "excerpt" or "outline") and ``rank`` (0 is the most related; the index
    ranks, it does not score, so ``score`` is None). A query maps onto the index as
    :mod:`langchain_starcoder.retrievers` says.

    Example::

        retriever = RepoNodeRetriever(RepoIndex("path/to/repo"), k=4, max_tokens=1024)
        nodes = retriever.retrieve("apply_discount(order, code)")
    """

    def __init__(
        self,
        index: Any,
        *,
        k: int = 4,
        max_tokens: int = 1024,
        count_tokens: Any = None,
        file_path: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_search(index, k, max_tokens, file_path)  # bad arguments fail here, not at the first query
        self.index, self.k, self.max_tokens = index, k, max_tokens
        self.count_tokens, self.file_path = count_tokens or estimate_tokens, file_path

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        found = search_by(self, query_bundle.query_str)
        return [
            NodeWithScore(
                node=TextNode(text=e.text, id_=f"{e.path}#{e.rank}", metadata=metadata(e)), score=None
            )
            for e in found
        ]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return await asyncio.to_thread(self._retrieve, query_bundle)  # the lookup stays off the loop


__all__ = ["RepoNodeRetriever"]
