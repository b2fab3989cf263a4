"""A retrieval-augmented code assistant: fill a hole in a file, with related code of the repo as context.

1. Index the repository with ``RepoIndex`` (``.gitignore`` respected; definitions and imports from
   tree-sitter; kept fresh as files change).
2. Give the engine the index: it picks the code the hole's file needs (what it imports, the
   definitions of names used near the hole, matching windows) within the token budget the hole
   leaves (docs/repository-context.md).
3. The prompt is StarCoder2's repository-level FIM layout
   (``<repo_name>...<file_sep>path\\ncode...<file_sep><fim_prefix>...``); the middle is streamed.

Run (the first run downloads the model from the Hugging Face hub):

    python examples/rag_code_assistant.py
    python examples/rag_code_assistant.py --file shop/reports.py --marker "def best_sellers("
    python examples/rag_code_assistant.py --position 12:0 --model ./my-local-checkpoint

By default the hole is the body of ``Order.total`` in ``shop/orders.py``: the lines after the line
holding ``--marker`` up to the next blank line are cut out, and the model writes them again.

With no hub access it says so and runs on a small checkpoint with random weights, built offline
(its output is nonsense, but every step is real): see ``langchain_starcoder.testing.model_or_offline``.

Install what the examples need, from the checkout: ``pip install -e ".[examples]"`` (this one needs
nothing beyond the package itself).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from langchain_starcoder import FIMRequest, RepoIndex, StarCoderEngine
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
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--max-prompt-tokens", type=int, default=None, help="default: the context window")
    args = parser.parse_args()
    model = model_or_offline(args.model)

    index = RepoIndex(args.repo)  # scanned once; every lookup sees edited, added and deleted files
    hole = make_hole((args.repo / args.file).read_text(encoding="utf-8"), args.marker, args.position)
    engine = StarCoderEngine.load(model)
    request = FIMRequest(
        hole.prefix,
        hole.suffix,
        repo=index,
        repo_name=args.repo.resolve().name,
        file_path=args.file,
        max_prompt_tokens=args.max_prompt_tokens,
    )
    prompt = engine.fim_prompt(request, args.max_tokens)  # what stream_infill below builds too
    print(f"Repository context for {args.file} ({len(index.files)} files indexed):")
    seen: set[str] = set()
    for file in prompt.files_kept:
        # The context has two parts (docs/repository-context.md): an outline that stays put while the
        # cursor moves inside its definition (so the KV cache does), then code near the cursor: a file
        # may be in both.
        again = "  (again: lines the code near the cursor asks for)" if file.path in seen else ""
        seen.add(file.path)
        tokens, lines = engine.count_tokens(file.text), len(file.text.splitlines())
        print(f"  {file.path}  {tokens} tokens, {lines} lines{again}")
    print(f"Prompt: {len(prompt.token_ids)} tokens")
    if hole.removed:
        print("--- original ---")
        print(hole.removed, end="" if hole.removed.endswith("\n") else "\n")
    print("--- middle ---")
    last = None
    for chunk in engine.stream_infill(request, max_tokens=args.max_tokens):
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
