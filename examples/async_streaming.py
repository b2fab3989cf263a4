"""Stream several completions at once from async code, with LangChain's ``StarCoderLLM.astream``.

    python examples/async_streaming.py                      # mlx-community/starcoder2-3b-4bit from the hub
    python examples/async_streaming.py --model ./my-ckpt    # a local checkpoint folder

Each request is an ``astream`` task; ``asyncio.gather`` runs them together and every chunk is
printed as it arrives, labelled with its request. The model runs on the engine's own thread, so
the event loop stays free while tokens are computed: a heartbeat task keeps ticking throughout.
(The engine serves streaming requests in arrival order; ``await llm.abatch(prompts)`` runs
several prompts in one batched pass instead.)

With no hub access it says so and runs on a small checkpoint with random weights, built offline
(its output is nonsense, but every step is real): see ``langchain_starcoder.testing.model_or_offline``.

Install what the examples need, from the checkout: ``pip install -e ".[examples]"``.
"""

from __future__ import annotations

import argparse
import asyncio

from langchain_starcoder import StarCoderLLM
from langchain_starcoder.testing import model_or_offline

DEFAULT_MODEL = "mlx-community/starcoder2-3b-4bit"

REQUESTS = {
    "fib": "def fibonacci(n):\n    ",
    "sort": "def quicksort(items: list[int]) -> list[int]:\n    ",
    "stack": "class Stack:\n    def __init__(self):\n        ",
}


def make_llm(model: str, max_tokens: int) -> StarCoderLLM:
    """The LLM, its weights loaded now (they load on first use otherwise), offline if need be."""
    llm = StarCoderLLM(model=model_or_offline(model), max_tokens=max_tokens, stop=["\ndef ", "\nclass "])
    llm.engine  # noqa: B018 - loads the shared engine before the event loop starts
    return llm


async def stream_one(llm: StarCoderLLM, label: str, prompt: str) -> str:
    """Stream one completion, printing each chunk with the request's label; return the whole text."""
    pieces = []
    async for chunk in llm.astream(prompt):
        pieces.append(chunk)
        if chunk:
            print(f"[{label:>5}] {chunk!r}", flush=True)
    return "".join(pieces)


async def heartbeat(interval: float = 0.05) -> int:
    """Count ticks until cancelled: proof that the event loop was never blocked."""
    ticks = 0
    try:
        while True:
            await asyncio.sleep(interval)
            ticks += 1
    except asyncio.CancelledError:
        return ticks


async def run(llm: StarCoderLLM) -> dict[str, str]:
    ticker = asyncio.create_task(heartbeat())
    texts = await asyncio.gather(*(stream_one(llm, label, prompt) for label, prompt in REQUESTS.items()))
    ticker.cancel()
    ticks = await ticker
    print(f"\nThe event loop ticked {ticks} times while the requests streamed.")
    return dict(zip(REQUESTS, texts, strict=True))


def main(argv: list[str] | None = None) -> dict[str, str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL, help="hub id or local checkpoint folder")
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args(argv)

    llm = make_llm(args.model, args.max_tokens)
    texts = asyncio.run(run(llm))
    for label, text in texts.items():
        print(f"\n=== {label} ===\n{REQUESTS[label]}{text}")
    return texts


if __name__ == "__main__":
    main()
