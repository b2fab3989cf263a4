"""LlamaIndex integration: ``StarCoder``, a LlamaIndex LLM over the shared StarCoder2 engine."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from .errors import LLAMA_INDEX_MISSING

try:
    import llama_index.core  # noqa: F401  (the llama-index extra)
except ImportError as err:
    raise ImportError(LLAMA_INDEX_MISSING) from err

from llama_index.core.base.llms.generic_utils import messages_to_prompt as generic_messages_to_prompt
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import ConfigDict, ValidationError
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM

from ._base import StarCoderSettings
from ._chat import resolve_chat_template, template_roles, tool_chat_prompt_ids
from ._llama_index_responses import astream_responses, chat_answer, completion_response, stream_responses
from ._llama_index_tools import TOOL_KEYS, ToolsAndStructure, turns
from ._registry import DEFAULT_MODEL
from ._tools import ToolPlan, constrained, plan_of
from .engine import StarCoderEngine
from .errors import InvalidParameterError, UnsupportedModelError
from .fim.request import FIMRequest
from .retrievers.llama_index import RepoNodeRetriever

dispatcher = get_dispatcher(__name__)

__all__ = ["DEFAULT_MODEL", "RepoNodeRetriever", "StarCoder"]


class StarCoder(StarCoderSettings, ToolsAndStructure, FunctionCallingLLM):
    """StarCoder2 code models on Apple MLX, as a LlamaIndex LLM.

    Setup:
        .. code-block:: bash

            pip install -e .  # in a checkout of this repository: the package is not on PyPI yet

    Key init args — loading:
        model: str
            Hub id (default ``mlx-community/starcoder2-3b-4bit``) or a local checkpoint folder.
        quantize: int | None
            4 or 8 to quantize a full-precision checkpoint while loading.
        dtype: str
            "auto" (float32 on the CPU, the checkpoint's dtype on a GPU), "float32", "float16",
            "bfloat16".
        kv_bits: int | None
            4 or 8 to keep the KV cache quantized.
        prompt_cache_dir: str | None
            A folder that keeps long prompt caches across restarts (docs/prompt-cache.md).
        adapter_path: str | None
            A fine-tuning adapter's folder (``langchain-starcoder finetune``'s), applied on load.
        engine: StarCoderEngine | None
            An engine you loaded yourself; by default the shared engine for these settings is
            loaded on first use (never on construction).

    Key init args — generation:
        max_tokens: int
            Most tokens to generate (default 256).
        temperature: float
            0 (the default) is greedy.
        stop: list[str] | None
            Strings that end the generation (not included in the text).
        top_p, top_k, min_p, repetition_penalty, seed:
            Sampling settings, as in :meth:`StarCoderEngine.generate`.
        prompt_lookup_num_tokens:
            Prompt-lookup speculative decoding (greedy; same output): None where it pays, 0 off.
            ``raw`` reports ``accepted_draft_tokens`` and ``draft_tokens``.

        parse_special_tokens: bool
            False encodes prompts as data: control-token strings in a retrieved file stay text
            (query engines put retrieved text into the prompt; prefer False there).

    Key init args — chat:
        chat_template: str | None
            A Jinja chat template instead of the checkpoint's. Without one (a base model), chat
            raises an error naming it; ``messages_to_prompt=`` (LlamaIndex's own hook) is used
            when given.

    Instantiate:
        .. code-block:: python

            from langchain_starcoder.llama_index import StarCoder

            llm = StarCoder(model="mlx-community/starcoder2-3b-4bit", max_tokens=64, stop=["\\ndef "])

    Invoke:
        .. code-block:: python

            response = llm.complete("def fibonacci(n):")
            print(response.text, response.additional_kwargs["completion_tokens"])

    Stream:
        .. code-block:: python

            for response in llm.stream_complete("def quicksort(items):"):
                print(response.delta, end="", flush=True)

    Async:
        .. code-block:: python

            response = await llm.acomplete("def add(a, b):")
            async for response in await llm.astream_complete("class Stack:"):
                print(response.delta, end="")

    Fill in the middle:
        .. code-block:: python

            from langchain_starcoder.fim import ContextFile

            response = llm.infill(
                "def area(r):\\n    return ",
                "\\n\\nprint(area(2))\\n",
                context_files=[ContextFile("geometry/consts.py", "PI = 3.14159\\n")],
                repo_name="geometry",
                file_path="geometry/area.py",
            )
            print(response.text)  # the middle only

            for response in llm.stream_infill("def mean(xs):\\n    ", "\\n"):
                print(response.delta, end="")

    Chat (instruct checkpoints with a chat template):
        .. code-block:: python

            from llama_index.core.llms import ChatMessage

            llm = StarCoder(model="path/to/starcoder2-15b-instruct")
            print(llm.chat([ChatMessage(role="user", content="Write a bubble sort.")]).message.content)

    Tools (function calling; decoding holds each call to its tool's argument schema):
        .. code-block:: python

            from llama_index.core.tools import FunctionTool

            add = FunctionTool.from_defaults(fn=lambda a, b: a + b, name="add", description="Add a and b.")
            response = llm.chat_with_tools([add], user_msg="What is 1 + 2?", tool_required=True)
            llm.get_tool_calls_from_response(response)  # [ToolSelection(tool_name='add', ...)]

    Structured prediction (decoding follows the model's JSON schema):
        .. code-block:: python

            from pydantic import BaseModel
            from llama_index.core.prompts import PromptTemplate


            class Point(BaseModel):
                x: int
                y: int


            llm.structured_predict(Point, PromptTemplate("A point near {place}."), place="the origin")
            llm.as_structured_llm(Point).chat([ChatMessage(role="user", content="A point.")])

    In a query engine:
        .. code-block:: python

            from llama_index.retrievers.bm25 import BM25Retriever
            from llama_index.core.query_engine import RetrieverQueryEngine

            engine = RetrieverQueryEngine.from_args(
                BM25Retriever.from_defaults(nodes=nodes), llm=llm, streaming=True
            )
            engine.query("How is the cache trimmed?").print_response_stream()

    Responses carry ``prompt_tokens``, ``cached_tokens``, ``completion_tokens``,
    ``finish_reason`` and ``stop_sequence`` in ``additional_kwargs``, and the same plus the
    generated token ids, timings and an OpenAI-style ``usage`` dict in ``raw`` (LlamaIndex's
    ``TokenCountingHandler`` reads the real counts from it). Streamed responses carry them on the
    last response. Async methods never block the event loop: generation runs on the engine's
    worker thread.
    """

    # A misspelt setting (``max_token=``) is an error rather than silently ignored.
    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid", protected_namespaces=())

    chat_template: str | None = None
    """A Jinja chat template to use instead of the checkpoint's (for chat on a checkpoint that
    lacks one, or to change its format)."""

    def __init__(self, **kwargs: Any) -> None:
        try:
            super().__init__(**kwargs)
        except ValidationError as e:  # LlamaIndex users get this package's own error type
            raise InvalidParameterError(str(e)) from None

    @classmethod
    def class_name(cls) -> str:
        return "StarCoder"

    # --- the engine ------------------------------------------------------------------------------

    def get_engine(self) -> StarCoderEngine:
        """The engine this LLM runs on: the one given, or the shared one (loaded on first use).

        The shared one comes from the registry on every call, so after
        ``registry.release_engines()`` the next call loads the checkpoint again.
        """
        return self.engine

    async def aget_engine(self) -> StarCoderEngine:
        """:meth:`get_engine` for async code: a first load runs in a thread, off the event loop.

        LlamaIndex's own async paths (``apredict``, query engines) read :attr:`metadata` first,
        which loads on the loop; ``await llm.aget_engine()`` once beforehand avoids that.
        """
        return await self._aengine_for(None)

    def to_payload(self) -> dict[str, Any]:
        """What callbacks and instrumentation events record: the metadata and the settings.

        Unlike the default it never loads the model (an async call's events must not block the
        event loop), so before the first load the checkpoint's own fields are left out.
        """
        if self._loaded_engine() is not None:
            meta = self.metadata.model_dump()
        else:
            meta = {
                "model_name": self.model,
                "num_output": self.max_tokens,
                "is_function_calling_model": False,
            }
        return {"class_name": self.class_name(), **meta, **self._identifying_settings()}

    @property
    def metadata(self) -> LLMMetadata:
        """Context window and chat support of the real checkpoint (loads it on first use)."""
        engine = self.get_engine()
        return LLMMetadata(
            context_window=engine.context_window,
            num_output=self.max_tokens,
            is_chat_model=(chat := resolve_chat_template(engine, self.chat_template) is not None),
            is_function_calling_model=chat,  # tools go through chat
            model_name=engine.name,
        )

    # --- completion --------------------------------------------------------------------------------

    def _prompt(self, prompt: str, formatted: bool) -> str:
        return prompt if formatted else self.completion_to_prompt(prompt)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Complete ``prompt``; keyword arguments override the generation settings for this call."""
        settings = self._generation(kwargs)
        completion = self.get_engine().generate(self._prompt(prompt, formatted), **settings)
        return completion_response(completion)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        """Stream a completion: each response has the text so far and the new ``delta``."""
        settings = self._generation(kwargs)
        return stream_responses(self.get_engine().stream(self._prompt(prompt, formatted), **settings))

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Async :meth:`complete`; the event loop stays free while the model runs."""
        settings = self._generation(kwargs)
        engine = await self.aget_engine()
        completion = await engine.agenerate(self._prompt(prompt, formatted), **settings)
        return completion_response(completion)

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        """Async :meth:`stream_complete`; the event loop stays free while the model runs."""
        settings = self._generation(kwargs)
        engine = await self.aget_engine()
        return astream_responses(engine.astream(self._prompt(prompt, formatted), **settings))

    # --- chat ----------------------------------------------------------------------------------------

    def _chat_prompt(
        self, engine: StarCoderEngine, messages: Sequence[ChatMessage], plan: ToolPlan | None = None
    ) -> str | list[int]:
        """The prompt for ``messages``: the chat template's control text as tokens, contents as data;
        with tools, what the plan tells the model about them."""
        if self.chat_template is None and self.messages_to_prompt is not generic_messages_to_prompt:
            if plan is not None and plan.mode != "none":
                messages = [ChatMessage(role=MessageRole.SYSTEM, content=plan.instructions()), *messages]
            return self.messages_to_prompt(messages)
        template = resolve_chat_template(engine, self.chat_template)
        if template is None:
            msg = (
                f"The checkpoint {engine.name} has no chat template, so chat messages cannot be "
                "formatted. Set chat_template=... (a Jinja chat template) or messages_to_prompt=... "
                "on StarCoder, or use an instruct checkpoint; for a base model use complete()."
            )
            raise UnsupportedModelError(msg)
        return tool_chat_prompt_ids(engine, turns(messages, template_roles(template)), template, plan)

    def _chat_call(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], ToolPlan | None]:
        """The engine keywords and the tool plan (None without tools) of one chat call."""
        plan = plan_of(kwargs.get("tools"), kwargs.get("tool_choice"), kwargs.get("parallel_tool_calls"))
        settings = self._generation({k: v for k, v in kwargs.items() if k not in TOOL_KEYS})
        return constrained(settings, plan), plan

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Answer ``messages`` through the checkpoint's chat template (``tools=``, ``tool_choice=``:
        see :meth:`chat_with_tools`)."""
        settings, plan = self._chat_call(kwargs)
        engine = self.get_engine()
        completion = engine.generate(self._chat_prompt(engine, messages, plan), **settings)
        return chat_answer(completion, plan)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        """Stream the answer to ``messages``; each response has the message so far and ``delta`` (and
        the tool calls complete so far)."""
        settings, plan = self._chat_call(kwargs)
        engine = self.get_engine()
        chunks = engine.stream(self._chat_prompt(engine, messages, plan), **settings)
        return stream_responses(chunks, chat=True, plan=plan)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Async :meth:`chat`; the event loop stays free while the model runs."""
        settings, plan = self._chat_call(kwargs)
        engine = await self.aget_engine()
        prompt = await asyncio.to_thread(self._chat_prompt, engine, messages, plan)
        completion = await engine.agenerate(prompt, **settings)
        return chat_answer(completion, plan)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        """Async :meth:`stream_chat`; the event loop stays free while the model runs."""
        settings, plan = self._chat_call(kwargs)
        engine = await self.aget_engine()
        prompt = await asyncio.to_thread(self._chat_prompt, engine, messages, plan)
        return astream_responses(engine.astream(prompt, **settings), chat=True, plan=plan)

    # --- fill in the middle --------------------------------------------------------------------------
    # The callback decorators need the prompt positional: callbacks see ``prefix`` as the prompt.

    @dispatcher.span
    def infill(self, prefix: str | FIMRequest, suffix: str = "", **kwargs: Any) -> CompletionResponse:
        """Fill the hole between ``prefix`` and ``suffix``; the response text is the middle only.

        Takes a :class:`~langchain_starcoder.fim.request.FIMRequest` or its fields, as
        :meth:`StarCoderEngine.infill` does: ``context_files`` (other files of the repository, as
        ``ContextFile(path, text)``), ``repo_name`` and ``file_path`` (StarCoder2's repository
        layout), ``mode`` ("psm" or "spm"), ``max_prompt_tokens`` (the budget the prompt is cut
        to), ``trim_suffix_overlap`` (drop an end of the middle that repeats the suffix), ``end``
        ("auto" by default: decoding stops where the code says the middle is complete); other
        keyword arguments override the generation settings. File text is data: a literal
        ``<file_sep>`` in a file cannot reshape the prompt. The response carries the counts as
        :meth:`complete`'s does.
        """
        return self._call_infill(self._infill, prefix, suffix, kwargs)

    @llm_completion_callback()
    def _infill(self, prefix: str, *, request: FIMRequest, settings: dict) -> CompletionResponse:
        return completion_response(self.get_engine().infill(request, **settings))

    @dispatcher.span
    def stream_infill(
        self, prefix: str | FIMRequest, suffix: str = "", **kwargs: Any
    ) -> CompletionResponseGen:
        """Stream :meth:`infill`: each response has the middle so far and the new ``delta``."""
        return self._call_infill(self._stream_infill, prefix, suffix, kwargs)

    @llm_completion_callback()
    def _stream_infill(self, prefix: str, *, request: FIMRequest, settings: dict) -> CompletionResponseGen:
        return stream_responses(self.get_engine().stream_infill(request, **settings))

    @dispatcher.span
    async def ainfill(self, prefix: str | FIMRequest, suffix: str = "", **kwargs: Any) -> CompletionResponse:
        """Async :meth:`infill`; the event loop stays free while the model runs."""
        return await self._call_infill(self._ainfill, prefix, suffix, kwargs)

    @llm_completion_callback()
    async def _ainfill(self, prefix: str, *, request: FIMRequest, settings: dict) -> CompletionResponse:
        engine = await self.aget_engine()
        return completion_response(await engine.ainfill(request, **settings))

    @dispatcher.span
    async def astream_infill(
        self, prefix: str | FIMRequest, suffix: str = "", **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        """Async :meth:`stream_infill` (``async for r in await llm.astream_infill(...)``)."""
        return await self._call_infill(self._astream_infill, prefix, suffix, kwargs)

    @llm_completion_callback()
    async def _astream_infill(
        self, prefix: str, *, request: FIMRequest, settings: dict
    ) -> CompletionResponseAsyncGen:
        engine = await self.aget_engine()
        return astream_responses(engine.astream_infill(request, **settings))

    def _call_infill(self, method: Any, prefix: str | FIMRequest, suffix: str, kwargs: dict[str, Any]) -> Any:
        """``method`` (one of the callback-wrapped ``_infill``s) on the request and the generation
        settings of an infill call; its prefix goes first, as the callbacks' prompt."""
        from .prompts import fim_value

        value, rest = fim_value(prefix, suffix, dict(kwargs))
        settings = self._generation(rest)
        settings.pop("parse_special_tokens")  # FIM parts are always data
        request = value.request()
        return method(request.prefix, request=request, settings=settings)
