"""Chat with an instruct StarCoder2 checkpoint through LangChain's ``ChatStarCoder``.

    python examples/chat_instruct.py                 # mlx-community/starcoder2-15b-instruct-v0.1-4bit
    python examples/chat_instruct.py --model ./ckpt  # any checkpoint with a chat template
    python examples/chat_instruct.py --model mlx-community/starcoder2-3b-4bit --chat-template t.jinja

Two turns, each streamed as it is generated. The second turn's prompt starts with the whole
first exchange, which the engine's prompt cache already holds: its usage shows those tokens as
``cache_read`` instead of computing them again. A base checkpoint (no chat template) needs
``--chat-template FILE``; an instruct one answers far better.

With no hub access it says so and runs on a small instruct-shaped checkpoint with random weights,
built offline (its answers are nonsense, but every step is real): see
``langchain_starcoder.testing.model_or_offline``.

Install what the examples need, from the checkout: ``pip install -e ".[examples]"``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, SystemMessage

from langchain_starcoder import ChatStarCoder
from langchain_starcoder.chat_models import DEFAULT_CHAT_MODEL
from langchain_starcoder.testing import model_or_offline

SYSTEM = "You are a careful Python programmer. Answer with short, working code."
QUESTIONS = (
    "Write a function `is_palindrome(text)` that ignores case and spaces.",
    "Now add type hints and a docstring.",
)


def make_chat(model: str, max_tokens: int, chat_template: str | None) -> ChatStarCoder:
    """The chat model, its weights loaded now (they load on first use otherwise), offline if need be."""
    model = model_or_offline(model, DEFAULT_CHAT_MODEL, instruct=True)
    chat = ChatStarCoder(model=model, max_tokens=max_tokens, chat_template=chat_template)
    chat.engine  # noqa: B018 - loads the shared engine
    return chat


def ask(chat: ChatStarCoder, messages: list[BaseMessage]) -> AIMessageChunk:
    """Stream one answer to the terminal; return it whole (content and usage)."""
    answer: AIMessageChunk | None = None
    for chunk in chat.stream(messages):
        print(chunk.text, end="", flush=True)
        answer = chunk if answer is None else answer + chunk
    assert answer is not None
    usage = answer.usage_metadata or {}
    cached = usage.get("input_token_details", {}).get("cache_read", 0)
    print(
        f"\n[{usage.get('input_tokens')} prompt tokens ({cached} from the prompt cache), "
        f"{usage.get('output_tokens')} generated]"
    )
    return answer


def main(argv: list[str] | None = None) -> list[AIMessageChunk]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_CHAT_MODEL, help="hub id or local checkpoint folder")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--chat-template", type=Path, help="a Jinja chat template file, for a base model")
    args = parser.parse_args(argv)

    template = args.chat_template.read_text(encoding="utf-8") if args.chat_template else None
    chat = make_chat(args.model, args.max_tokens, template)
    messages: list[BaseMessage] = [SystemMessage(SYSTEM)]
    answers = []
    for question in QUESTIONS:
        print(f"\n>>> {question}\n")
        messages.append(HumanMessage(question))
        answer = ask(chat, messages)
        answers.append(answer)
        messages.append(AIMessage(answer.content))
    return answers


if __name__ == "__main__":
    main()
