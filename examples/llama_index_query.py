"""Ask questions about a folder of code with LlamaIndex and StarCoder2, fully offline.

Retrieval uses LlamaIndex's BM25 retriever (``llama-index-retrievers-bm25``): keyword scoring over
the code, so no embedding model is downloaded. The answer streams from ``StarCoder`` through a
LlamaIndex ``RetrieverQueryEngine``.

    python examples/llama_index_query.py --question "Where is the bulk discount applied?"
    python examples/llama_index_query.py --model path/to/checkpoint --folder my_repo

``--model`` takes a hub id (default ``mlx-community/starcoder2-3b-4bit``, downloaded once) or a
local checkpoint folder, e.g. one made with ``langchain_starcoder.testing.build_starcoder2`` (random
weights: the pipeline runs, the answer is nonsense).

With no hub access it says so and runs on a small checkpoint with random weights, built offline
(its output is nonsense, but every step is real): see ``langchain_starcoder.testing.model_or_offline``.

Install what the examples need, from the checkout: ``pip install -e ".[examples]"``
(``llama-index-retrievers-bm25`` is in it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llama_index.core import SimpleDirectoryReader
from llama_index.core.node_parser import SentenceSplitter
from llama_index.core.prompts import PromptTemplate
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.retrievers.bm25 import BM25Retriever

from langchain_starcoder.llama_index import DEFAULT_MODEL, StarCoder
from langchain_starcoder.testing import model_or_offline

CODE_EXTENSIONS = [".py", ".js", ".ts", ".rs", ".go", ".java", ".c", ".h", ".cpp", ".md", ".toml", ".txt"]

# A base code model continues text rather than following instructions, so the question is
# posed as a comment after the retrieved code, and the answer is the comment that follows.
CODE_QA_TEMPLATE = PromptTemplate(
    "# Code from the repository:\n{context_str}\n\n# Question: {query_str}\n# Answer (one comment):\n#"
)


def build_query_engine(folder: Path, llm: StarCoder, top_k: int = 2) -> RetrieverQueryEngine:
    """A streaming query engine over the code files in ``folder``, retrieving with BM25."""
    documents = SimpleDirectoryReader(str(folder), recursive=True, required_exts=CODE_EXTENSIONS).load_data()
    nodes = SentenceSplitter(chunk_size=256, chunk_overlap=32).get_nodes_from_documents(documents)
    # Split identifiers at underscores too, so "discounts" finds apply_discounts.
    retriever = BM25Retriever.from_defaults(
        nodes=nodes, similarity_top_k=min(top_k, len(nodes)), token_pattern=r"(?u)[^\W_]{2,}"
    )
    return RetrieverQueryEngine.from_args(
        retriever, llm=llm, streaming=True, text_qa_template=CODE_QA_TEMPLATE
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="hub id or local checkpoint folder")
    parser.add_argument(
        "--folder",
        type=Path,
        default=Path(__file__).parent / "sample_repo",
        help="folder of code to search (default: examples/sample_repo)",
    )
    parser.add_argument("--question", default="How is the member discount computed?")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--top-k", type=int, default=2, help="code chunks to retrieve")
    args = parser.parse_args(argv)

    # The prompt holds retrieved files: parse_special_tokens=False keeps every character of it data,
    # so a file that contains "<|endoftext|>" or "<file_sep>" cannot end or reshape the prompt.
    llm = StarCoder(
        model=model_or_offline(args.model, DEFAULT_MODEL),
        max_tokens=args.max_tokens,
        stop=["\n# Question:"],
        parse_special_tokens=False,
    )
    query_engine = build_query_engine(args.folder, llm, args.top_k)
    response = query_engine.query(args.question)

    print("Retrieved:")
    for source in response.source_nodes:
        print(f"  {source.node.metadata.get('file_path', '?')} (BM25 score {source.score:.2f})")
    print("Answer:", end="", flush=True)
    for delta in response.response_gen:
        print(delta, end="", flush=True)
    print()


if __name__ == "__main__":
    main()
