"""StarCoder2 in LangChain chains (LCEL): prompt | llm | parser, streaming, batching, fill-in-the-middle.

    python examples/lcel_chain.py                      # mlx-community/starcoder2-3b-4bit from the hub
    python examples/lcel_chain.py --model ./my-ckpt    # a local checkpoint folder

With no hub access it says so and runs on a small checkpoint with random weights, built offline
(its output is nonsense, but every step is real): see ``langchain_starcoder.testing.model_or_offline``.

Install what the examples need, from the checkout: ``pip install -e ".[examples]"``.
"""

from __future__ import annotations

import argparse

from langchain_core.output_parsers import StrOutputParser

from langchain_starcoder import FIMPromptTemplate, StarCoderLLM, StarCoderPromptTemplate
from langchain_starcoder.testing import model_or_offline

# StarCoderPromptTemplate is LangChain's PromptTemplate, except that the variables stay data: a
# docstring that quotes "<|endoftext|>" cannot end the prompt.
PROMPT = StarCoderPromptTemplate.from_template('def {name}({args}):\n    """{doc}"""\n')
TASKS = [
    {"name": "slugify", "args": "title: str", "doc": "Lowercase the title and join its words with dashes."},
    {"name": "mean", "args": "values: list[float]", "doc": "The arithmetic mean of values."},
]
HOLE = {
    "prefix": "def area(radius):\n    return ",
    "suffix": "\n\n\nprint(area(2.0))\n",
    "context_files": [("constants.py", "PI = 3.141592653589793\n")],
    "file_path": "geometry.py",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlx-community/starcoder2-3b-4bit")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()

    # Nothing loads here; the weights load once, on first use, and all three chains share them.
    llm = StarCoderLLM(
        model=model_or_offline(args.model), max_tokens=args.max_tokens, stop=["\ndef ", "\nclass "]
    )
    chain = PROMPT | llm | StrOutputParser()

    print("== stream ==")
    for piece in chain.stream(TASKS[0]):
        print(piece, end="", flush=True)
    print()

    print("== batch ==")  # one batched generation for both prompts
    for task, body in zip(TASKS, chain.batch(TASKS), strict=True):
        print(f"-- {task['name']} --\n{body}")

    print("== fill in the middle ==")  # the prompt's parts stay data: only the middle comes back
    infill = FIMPromptTemplate() | llm | StrOutputParser()
    print(infill.invoke(HOLE))


if __name__ == "__main__":
    main()
