"""A repository's code as LlamaIndex nodes (``RepoNodeRetriever``), where LlamaIndex's retrievers live.

``pip install -e ".[llama-index]"`` (in a checkout), then
``from llama_index.retrievers.starcoder import RepoNodeRetriever``.
"""

from langchain_starcoder.retrievers.llama_index import RepoNodeRetriever

__all__ = ["RepoNodeRetriever"]
