"""Fill-in-the-middle with explicit repository context (StarCoder2's repository-level format).

The hole is in ``shop/reports.py``; the files it uses go in as context, so the model can see what
``Order`` and ``Inventory`` offer. Run:

    python examples/infill_repo_context.py
    python examples/infill_repo_context.py --model ./my-local-checkpoint --show-prompt

With no hub access it says so and runs on a small checkpoint with random weights, built offline
(its output is nonsense, but every step is real): see ``langchain_starcoder.testing.model_or_offline``.

Install what the examples need, from the checkout: ``pip install -e ".[examples]"``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.fim import ContextFile, build_fim_prompt
from langchain_starcoder.testing import model_or_offline

REPO = Path(__file__).resolve().parent / "sample_repo"

PREFIX = '''"""Summaries for the back office."""

from decimal import Decimal

from .orders import Order


def average_order_value(orders: list[Order]) -> Decimal:
    """Mean total of the placed and shipped orders, 0 when there are none."""
    '''
SUFFIX = """

def open_orders(orders: list[Order]) -> list[Order]:
    return [order for order in orders if order.status == "open"]
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlx-community/starcoder2-3b-4bit", help="hub id or folder")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--show-prompt", action="store_true", help="print the prompt's layout")
    args = parser.parse_args()

    # Most relevant first: if the budget is short, the last files are cut or dropped first.
    context = [
        ContextFile(path, (REPO / path).read_text(encoding="utf-8"))
        for path in ("shop/orders.py", "shop/models.py")
    ]
    options = dict(context_files=context, repo_name="sample_repo", file_path="shop/reports.py")
    engine = StarCoderEngine.load(model_or_offline(args.model))
    prompt = build_fim_prompt(
        engine, PREFIX, SUFFIX, max_prompt_tokens=engine.context_window - args.max_tokens, **options
    )
    print(f"Context files: {', '.join(f.path for f in prompt.files_kept) or 'none'}")
    print(f"Prompt: {len(prompt.token_ids)} tokens")
    if args.show_prompt:
        print(prompt.text)
    completion = engine.infill(PREFIX, SUFFIX, max_tokens=args.max_tokens, **options)
    print("--- middle ---")
    print(completion.text)
    print("--- end ---")
    print(f"finish_reason={completion.finish_reason} completion_tokens={completion.completion_tokens}")
    engine.close()


if __name__ == "__main__":
    main()
