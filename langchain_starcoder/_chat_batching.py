"""One engine batch for a LangChain chat batch (ChatStarCoder's ``batch`` and ``generate``).

LangChain's chat ``batch`` runs one ``invoke`` per input, and ``generate`` one ``_generate`` per message
list. So ``batch`` goes through ``generate`` when the inputs share one config, and ``generate`` first runs
all its prompts as one engine batch; each ``_generate`` then takes its answer from :data:`BATCHED`
(LangChain still does the callbacks, tracing and output per list).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.outputs import LLMResult
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import get_config_list

from ._base import RUN_ARGS
from .types import Completion

BATCHED: ContextVar[dict[tuple[int, ...], deque[Completion]] | None] = ContextVar(
    "starcoder_chat_batch", default=None
)


def take_batched(ids: list[int]) -> Completion | None:
    answers = (BATCHED.get() or {}).get(tuple(ids))
    return answers.popleft() if answers else None


def by_prompt(prompts: list[list[int]], completions: Sequence[Completion]) -> dict:
    answers: dict[tuple[int, ...], deque[Completion]] = defaultdict(deque)
    for ids, completion in zip(prompts, completions, strict=True):
        answers[tuple(ids)].append(completion)
    return answers


SHARED_CONFIG_KEYS = ("callbacks", "tags", "metadata", "run_name", "max_concurrency")


def shared_config(
    inputs: list[Any], config: RunnableConfig | list[RunnableConfig] | None, return_exceptions: bool
) -> RunnableConfig | None:
    """The one config of a batch that can run as ``generate`` calls, else None."""
    if return_exceptions or len(inputs) < 2:
        return None
    configs = get_config_list(config, len(inputs))
    first = configs[0]
    if any(c.get("run_id") for c in configs):
        return None
    if any(c.get(k) != first.get(k) for c in configs[1:] for k in SHARED_CONFIG_KEYS):
        return None
    return first


def groups(inputs: list[Any], config: RunnableConfig) -> Iterator[list[Any]]:
    size = config.get("max_concurrency") or len(inputs)
    return (inputs[start : start + size] for start in range(0, len(inputs), size))


def generate_args(config: RunnableConfig, kwargs: dict[str, Any]) -> dict[str, Any]:
    return {key: config.get(key) for key in ("callbacks", "tags", "metadata", "run_name")} | kwargs


def messages_of(result: LLMResult) -> list[AIMessage]:
    return [g[0].message for g in result.generations]  # type: ignore[attr-defined]


def settings_of(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The generation keywords among ``generate``'s arguments (not callbacks, tags...)."""
    return {k: v for k, v in kwargs.items() if k not in RUN_ARGS and k != "ls_structured_output_format"}
