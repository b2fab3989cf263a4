"""A retrieval-augmented code assistant: fill a hole in a file, with related files of the repo as context.

1. Index the repository's Python files with BM25 (the ``bm25s`` package; no model, no download).
2. Query it with the code around the hole, to find the files the edited one depends on.
3. Build a StarCoder2 repository-level FIM prompt from the hole and the retrieved files
   (``<repo_name>...<file_sep>path\\ncode...<file_sep><fim_prefix>...``) and stream the middle.

Run (the first run downloads the model from the Hugging Face hub):

    python examples/rag_code_assistant.py
    python examples/rag_code_assistant.py --file shop/reports.py --marker "def best_sellers("
    python examples/rag_code_assistant.py --position 12:0 --model ./my-local-checkpoint

By default the hole is the body of ``Order.total`` in ``shop/orders.py``: the lines after the line
holding ``--marker`` up to the next blank line are cut out, and the model writes them again.

With no hub access it says so and runs on a small checkpoint with random weights, built offline
(its output is nonsense, but every step is real): see ``langchain_starcoder.testing.model_or_offline``.

Install what the examples need, from the checkout: ``pip install -e ".[examples]"``
(``bm25s`` is in it).
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import bm25s
import numpy as np

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.fim import ContextFile, build_fim_prompt
from langchain_starcoder.testing import model_or_offline

SAMPLE_REPO = Path(__file__).resolve().parent / "sample_repo"


@dataclass
class Hole:
    prefix: str
    suffix: str
    removed: str
    """The original code that the hole replaced (empty with ``--position``)."""


def make_hole(text: str, marker: str | None, position: str | None) -> Hole:
    """Split a file at ``LINE:COL`` (1-based line), or cut the block after the line holding ``marker``."""
    if position:
        line, col = (int(x) for x in position.split(":"))
        lines = text.splitlines(keepends=True)
        offset = sum(len(x) for x in lines[: line - 1]) + col
        return Hole(text[:offset], text[offset:], "")
    start = text.find(marker or "")
    if start < 0:
        sys.exit(f"The marker {marker!r} is not in the file.")
    line_end = text.find("\n", start) + 1 or len(text)
    block_end = text.find("\n\n", line_end)
    block_end = len(text) if block_end < 0 else block_end + 1
    return Hole(text[:line_end], text[block_end:], text[line_end:block_end])


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PART = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def code_tokens(text: str) -> list[str]:
    """Identifiers and their parts (``place_order`` -> place_order, place, order), no keywords."""
    out = []
    for word in _WORD.findall(text):
        if keyword.iskeyword(word) or len(word) < 2:
            continue
        out.append(word.lower())
        parts = [p.lower() for p in _PART.findall(word)]
        if len(parts) > 1:
            out.extend(p for p in parts if len(p) > 1)
    return out


def retrieve(repo: Path, edited: Path, query: str, top_k: int) -> list[tuple[ContextFile, float]]:
    """The ``top_k`` files of ``repo`` (other than ``edited``) most related to ``query``, by BM25.

    Each file is one document: the sample files are short. For a big repository, index chunks
    (functions or windows of lines) and keep the best chunks instead.
    """
    files = [p for p in sorted(repo.rglob("*.py")) if p.resolve() != edited.resolve()]
    docs = [ContextFile(p.relative_to(repo).as_posix(), p.read_text(encoding="utf-8")) for p in files]
    corpus = [code_tokens(f"{d.path}\n{d.text}") for d in docs]
    retriever = bm25s.BM25()
    retriever.index(corpus, show_progress=False)
    ids, scores = retriever.retrieve([code_tokens(query)], k=min(top_k, len(docs)), show_progress=False)
    return [(docs[i], float(s)) for i, s in zip(np.ravel(ids), np.ravel(scores), strict=True) if s > 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlx-community/starcoder2-3b-4bit", help="hub id or folder")
    parser.add_argument("--repo", type=Path, default=SAMPLE_REPO, help="the code folder to index")
    parser.add_argument("--file", default="shop/orders.py", help="the file being edited, in --repo")
    parser.add_argument(
        "--marker",
        default='"""What the customer pays',
        help="the hole replaces the block after the line holding this text",
    )
    parser.add_argument("--position", help="LINE:COL: put the hole there instead (nothing removed)")
    parser.add_argument("--top-k", type=int, default=3, help="how many related files to retrieve")
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--max-prompt-tokens", type=int, default=None)
    args = parser.parse_args()
    model = model_or_offline(args.model)

    edited = args.repo / args.file
    hole = make_hole(edited.read_text(encoding="utf-8"), args.marker, args.position)
    # The query: the file's imports (what it depends on) and the code around the hole.
    text = hole.prefix + hole.suffix
    imports = [line for line in text.splitlines() if line.startswith(("import ", "from "))]
    query = "\n".join(imports + hole.prefix.splitlines()[-12:] + hole.suffix.splitlines()[:8])
    related = retrieve(args.repo, edited, query, args.top_k)
    print(f"Retrieved for {args.file} (BM25):")
    for file, score in related:
        print(f"  {file.path}  score={score:.2f}")

    engine = StarCoderEngine.load(model)
    options = dict(
        context_files=[file for file, _ in related],
        repo_name=args.repo.resolve().name,
        file_path=args.file,
        max_prompt_tokens=args.max_prompt_tokens or engine.context_window - args.max_tokens,
    )
    prompt = build_fim_prompt(engine, hole.prefix, hole.suffix, **options)
    kept = ", ".join(f.path for f in prompt.files_kept) or "none"
    print(f"Prompt: {len(prompt.token_ids)} tokens; context files kept: {kept}")
    if hole.removed:
        print("--- original ---")
        print(hole.removed, end="" if hole.removed.endswith("\n") else "\n")
    print("--- middle ---")
    last = None
    for chunk in engine.stream_infill(hole.prefix, hole.suffix, max_tokens=args.max_tokens, **options):
        print(chunk.text, end="", flush=True)
        last = chunk
    print("\n--- end ---")
    if last is not None:
        print(
            f"finish_reason={last.finish_reason} prompt_tokens={last.prompt_tokens} "
            f"cached_tokens={last.cached_tokens} completion_tokens={last.completion_tokens}"
        )
    engine.close()


if __name__ == "__main__":
    main()
