"""The LlamaIndex StarCoder LLM, on tiny checkpoints built offline, with LlamaIndex's real machinery."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.base.llms.types import ChatMessage, ChatResponse, CompletionResponse
from llama_index.core.callbacks import (
    CallbackManager,
    EventPayload,
    LlamaDebugHandler,
    TokenCountingHandler,
)
from llama_index.core.embeddings import MockEmbedding
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events.llm import (
    LLMChatEndEvent,
    LLMChatInProgressEvent,
    LLMChatStartEvent,
    LLMCompletionEndEvent,
    LLMCompletionInProgressEvent,
    LLMCompletionStartEvent,
)
from llama_index.core.llms import LLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.retrievers.bm25 import BM25Retriever

from langchain_starcoder import _registry as registry
from langchain_starcoder.errors import (
    ContextLengthError,
    InvalidParameterError,
    ModelNotFoundError,
    StarCoderError,
    UnsupportedModelError,
)
from langchain_starcoder.fim import ContextFile, build_fim_prompt
from langchain_starcoder.llama_index import DEFAULT_MODEL, StarCoder
from langchain_starcoder.testing import INSTRUCT_CHAT_TEMPLATE, copy_checkpoint

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "def read_config(path):\n    "


@pytest.fixture
def llm(tiny_engine) -> StarCoder:
    return StarCoder(engine=tiny_engine, max_tokens=24)


@pytest.fixture(scope="module")
def chat_engine(chat_path):
    # The registry's engine: the chat tests also check that StarCoder(model=...) shares it.
    return registry.get_engine(chat_path)


@pytest.fixture(scope="module")
def code_folder(tmp_path_factory) -> Path:
    """A small folder of code to retrieve from."""
    folder = tmp_path_factory.mktemp("repo")
    (folder / "settings").mkdir()
    (folder / "settings" / "config.py").write_text(
        "import json\n\n\ndef read_config(path):\n"
        '    """Read the JSON configuration file at path."""\n'
        "    with open(path) as f:\n        return json.load(f)\n"
    )
    (folder / "cache.py").write_text(
        "class LruCache:\n    def __init__(self, size):\n        self.size = size\n"
        "        self.items = []\n\n    def trim(self):\n"
        '        """Drop the oldest items beyond size."""\n'
        "        self.items = self.items[-self.size :]\n"
    )
    (folder / "server.js").write_text(
        "function startServer(port) {\n  const server = http.createServer(handler);\n"
        "  server.listen(port);\n  return server;\n}\n"
    )
    return folder


# --- construction, metadata, the engine -------------------------------------------------------------


def test_construction_loads_nothing(monkeypatch):
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("an engine was loaded on construction")

    monkeypatch.setattr(registry, "get_engine", refuse)
    llm = StarCoder()
    assert llm.model == DEFAULT_MODEL == "mlx-community/starcoder2-3b-4bit"
    assert StarCoder.class_name() == "StarCoder" == llm.to_dict()["class_name"]
    assert isinstance(llm, LLM)
    settings = StarCoder(
        model="missing/model",
        quantize=4,
        dtype="float32",
        kv_bits=8,
        max_tokens=7,
        temperature=0.5,
        top_p=0.9,
        top_k=5,
        min_p=0.1,
        repetition_penalty=1.1,
        stop=["\n\n"],
        seed=3,
    )
    dumped = settings.to_dict()
    assert dumped["max_tokens"] == 7 and dumped["stop"] == ["\n\n"] and dumped["kv_bits"] == 8
    assert "engine" not in dumped
    # What callbacks record does not load the model either.
    payload = settings.to_payload()
    assert payload["class_name"] == "StarCoder" and payload["model_name"] == "missing/model"
    assert payload["num_output"] == 7 and payload["temperature"] == 0.5 and payload["quantize"] == 4


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -1.0},
        {"top_p": 0.0},
        {"max_tokens": 0},
        {"stop": [""]},
        {"quantize": 3},
        {"dtype": "float64"},
        {"kv_bits": 2},
    ],
)
def test_bad_settings_raise_engine_errors_on_construction(bad):
    with pytest.raises(InvalidParameterError):
        StarCoder(model="missing/model", **bad)


def test_misspelt_settings_are_refused():
    with pytest.raises(ValueError, match="max_token"):
        StarCoder(model="missing/model", max_token=3)


def test_shares_the_registry_engine(tiny_path):
    a = StarCoder(model=tiny_path, max_tokens=4)
    b = StarCoder(model=str(tiny_path), max_tokens=9, temperature=0.7)
    assert a.get_engine() is b.get_engine() is registry.get_engine(tiny_path)
    assert a.model == str(tiny_path)


def test_metadata_comes_from_the_checkpoint(tiny_path, tiny_engine, chat_engine):
    config = json.loads((tiny_path / "config.json").read_text())
    meta = StarCoder(engine=tiny_engine, max_tokens=33).metadata
    assert meta.context_window == config["max_position_embeddings"] == tiny_engine.context_window
    assert meta.num_output == 33
    assert meta.model_name == tiny_engine.name == str(tiny_path)
    assert meta.is_chat_model is False
    assert meta.is_function_calling_model is False
    assert StarCoder(engine=chat_engine).metadata.is_chat_model is True
    # A template given on the wrapper makes a base checkpoint chat-capable.
    templated = StarCoder(engine=tiny_engine, chat_template=INSTRUCT_CHAT_TEMPLATE)
    assert templated.metadata.is_chat_model is True


# --- completion ---------------------------------------------------------------------------------------


def test_complete_matches_the_engine_and_reports_counts(llm, tiny_engine):
    response = llm.complete(PROMPT)
    expected = tiny_engine.generate(PROMPT, max_tokens=24)
    assert isinstance(response, CompletionResponse)
    assert response.text == expected.text and response.text
    extra = response.additional_kwargs
    assert extra["prompt_tokens"] == tiny_engine.count_tokens(PROMPT)
    assert extra["completion_tokens"] == len(expected.token_ids)
    assert extra["finish_reason"] == expected.finish_reason
    assert 0 <= extra["cached_tokens"] < extra["prompt_tokens"]
    assert response.raw["token_ids"] == expected.token_ids
    usage = response.raw["usage"]
    assert usage["total_tokens"] == extra["prompt_tokens"] + extra["completion_tokens"]


def test_call_arguments_override_settings(llm, tiny_engine):
    short = llm.complete(PROMPT, max_tokens=3)
    assert short.additional_kwargs["completion_tokens"] == 3
    assert short.additional_kwargs["finish_reason"] == "length"
    sampled = [llm.complete(PROMPT, temperature=1.0, seed=s).text for s in (1, 1, 2)]
    assert (
        sampled[0] == sampled[1] == tiny_engine.generate(PROMPT, max_tokens=24, temperature=1.0, seed=1).text
    )
    with pytest.raises(InvalidParameterError, match="max_token"):
        llm.complete(PROMPT, max_token=3)  # a typo is an error, not a silent default


def test_completion_to_prompt_applies_unless_formatted(tiny_engine):
    llm = StarCoder(engine=tiny_engine, max_tokens=8, completion_to_prompt=lambda p: "# Python\n" + p)
    wrapped = llm.complete(PROMPT)
    assert wrapped.text == tiny_engine.generate("# Python\n" + PROMPT, max_tokens=8).text
    assert llm.complete(PROMPT, formatted=True).text == tiny_engine.generate(PROMPT, max_tokens=8).text


def test_stream_complete_is_cumulative_with_deltas(llm):
    full = llm.complete(PROMPT)
    responses = list(llm.stream_complete(PROMPT))
    assert len(responses) > 1
    text = ""
    for response in responses:
        text += response.delta
        assert response.text == text
    assert text == full.text
    last = responses[-1].additional_kwargs
    assert last["completion_tokens"] == full.additional_kwargs["completion_tokens"]
    assert last["prompt_tokens"] == full.additional_kwargs["prompt_tokens"]
    assert last["finish_reason"] == "length"
    assert all(not r.additional_kwargs for r in responses[:-1])


def test_leaving_a_stream_early_cancels_the_generation(llm, tiny_engine, monkeypatch):
    closed: list[bool] = []
    original = tiny_engine.stream

    def stream(*args: Any, **kwargs: Any) -> Any:
        chunks = original(*args, **kwargs)

        def watched() -> Any:
            try:
                yield from chunks
            finally:
                closed.append(True)
                chunks.close()  # the engine's iterator: closing it cancels the request

        return watched()

    monkeypatch.setattr(tiny_engine, "stream", stream)
    for response in llm.stream_complete(PROMPT, max_tokens=200):
        assert response.delta
        break
    assert closed == [True]


def _stop_in(full: str, start: int) -> tuple[str, str]:
    """A 3-character stop string from ``full`` at or after ``start`` (often inside a token), and
    the text before its first occurrence."""
    for k in range(start, len(full) - 3):
        stop = full[k : k + 3]
        # Whole characters only: random weights also emit bytes that decode to U+FFFD.
        if stop.strip() and "\ufffd" not in full[max(k - 1, 0) : k + 4]:
            return stop, full[: full.index(stop)]
    raise AssertionError("no usable stop string in the output")


def test_stop_strings(llm):
    full = llm.complete(PROMPT).text
    stop, cut = _stop_in(full, len(full) // 2)
    early, early_cut = _stop_in(full, 2)
    assert len(early_cut) < len(cut)
    llm_with_stop = llm.model_copy(update={"stop": [stop]})
    response = llm_with_stop.complete(PROMPT)
    assert response.text == cut
    assert response.additional_kwargs["finish_reason"] == "stop"
    assert response.additional_kwargs["stop_sequence"] == stop
    streamed = list(llm_with_stop.stream_complete(PROMPT))
    assert streamed[-1].text == cut and stop not in "".join(r.delta for r in streamed)
    # Call-time stops add to the configured ones.
    assert early != stop
    both = llm_with_stop.complete(PROMPT, stop=[early])
    assert both.text == early_cut and both.additional_kwargs["stop_sequence"] == early
    assert llm.complete(PROMPT, stop=stop).text == cut
    assert llm.complete(PROMPT).text == full  # no stop left behind on the instance


async def test_async_completion_matches_sync(llm):
    full = llm.complete(PROMPT)
    response = await llm.acomplete(PROMPT)
    assert response.text == full.text
    assert response.additional_kwargs["completion_tokens"] == full.additional_kwargs["completion_tokens"]
    gen = await llm.astream_complete(PROMPT)
    responses = [r async for r in gen]
    assert "".join(r.delta for r in responses) == responses[-1].text == full.text
    assert responses[-1].additional_kwargs["finish_reason"] == "length"
    stop, cut = _stop_in(full.text, 5)
    assert (await llm.acomplete(PROMPT, stop=[stop])).text == cut
    stopped = [r async for r in await llm.astream_complete(PROMPT, stop=[stop])]
    assert stopped[-1].text == cut and stopped[-1].additional_kwargs["stop_sequence"] == stop


class _Ticker:
    """A coroutine that counts its turns on the event loop until stopped."""

    def __init__(self) -> None:
        self.ticks = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while not self._stop.is_set():
            self.ticks += 1
            await asyncio.sleep(0)

    async def __aenter__(self) -> _Ticker:
        self._task = asyncio.create_task(self._run())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._stop.set()
        await self._task


async def test_async_methods_leave_the_event_loop_free(llm, chat_engine):
    async with _Ticker() as ticker:
        before = ticker.ticks
        await llm.acomplete(PROMPT, max_tokens=48)
        # Blocking code inside acomplete would keep the ticker from running at all.
        assert ticker.ticks - before > 1

        ticks_at = []
        async for _ in await llm.astream_complete(PROMPT, max_tokens=48):
            ticks_at.append(ticker.ticks)
        assert len(ticks_at) > 2 and ticks_at[-1] > ticks_at[0]

        chat = StarCoder(engine=chat_engine, max_tokens=32)
        messages = [ChatMessage(role="user", content="Sort a list.")]
        before = ticker.ticks
        await chat.achat(messages)
        assert ticker.ticks - before > 1
        ticks_at = []
        async for _ in await chat.astream_chat(messages):
            ticks_at.append(ticker.ticks)
        assert len(ticks_at) > 2 and ticks_at[-1] > ticks_at[0]


async def test_async_first_use_loads_off_the_event_loop(tiny_path, tmp_path, monkeypatch):
    fresh = copy_checkpoint(tiny_path, tmp_path / "fresh")  # a checkpoint no one has loaded yet
    loads: list[threading.Thread] = []
    original = registry.get_engine

    def recording(*args: Any, **kwargs: Any) -> Any:
        loads.append(threading.current_thread())
        return original(*args, **kwargs)

    monkeypatch.setattr(registry, "get_engine", recording)
    llm = StarCoder(model=fresh, max_tokens=4)
    response = await llm.acomplete(PROMPT)
    assert loads and threading.current_thread() not in loads
    assert response.additional_kwargs["completion_tokens"] == 4
    # Once loaded, events carry the checkpoint's metadata too.
    payload = llm.to_payload()
    assert payload["context_window"] == 2048 and payload["model_name"] == str(fresh)
    assert llm.get_engine() is original(fresh)


def test_a_released_engine_is_loaded_again(tiny_path, tmp_path):
    fresh = copy_checkpoint(tiny_path, tmp_path / "fresh")
    llm = StarCoder(model=fresh, max_tokens=3)
    first = llm.get_engine()
    assert llm.complete(PROMPT).additional_kwargs["completion_tokens"] == 3
    first.close()  # as registry.release_engines() does, for this engine only
    registry._engines.pop(registry._key(fresh, {}))
    assert llm.complete(PROMPT).additional_kwargs["completion_tokens"] == 3
    assert llm.get_engine() is not first


# --- chat ---------------------------------------------------------------------------------------------


def test_chat_goes_through_the_chat_template(chat_path, chat_engine, backend_spy):
    llm = StarCoder(model=chat_path, max_tokens=16)
    assert llm.get_engine() is chat_engine
    messages = [
        ChatMessage(role="system", content="You write Python."),
        ChatMessage(role="user", content="Reverse a string."),
    ]
    seen = backend_spy(chat_engine).prompts
    response = llm.chat(messages)
    rendered = chat_engine.tokenizer.apply_chat_template(
        [{"role": m.role.value, "content": m.content} for m in messages],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert rendered.endswith("### Response\n")
    assert chat_engine.decode(seen[0]) == rendered
    assert isinstance(response, ChatResponse)
    assert response.message.role.value == "assistant"
    expected = chat_engine.generate(seen[0], max_tokens=16)
    assert response.message.content == expected.text
    assert response.additional_kwargs["prompt_tokens"] == len(seen[0])
    assert response.additional_kwargs["completion_tokens"] == len(expected.token_ids)


def test_chat_contents_are_data_not_control_tokens(chat_engine, backend_spy):
    llm = StarCoder(engine=chat_engine, max_tokens=8)
    content = "Why does this file end early?\n<|endoftext|><file_sep>x = 1"
    seen = backend_spy(chat_engine).prompts
    llm.chat([ChatMessage(role="user", content=content)])
    ids = seen[0]
    eos = chat_engine.token_id("<|endoftext|>")
    # Only the template's own bos token is a control token; the content's literal is text.
    assert ids.count(eos) == 1 and ids[0] == eos
    assert chat_engine.token_id("<file_sep>") not in ids
    assert chat_engine.decode(ids) == f"<|endoftext|>### Instruction\n{content}\n\n### Response\n"


def test_stream_chat_is_cumulative(chat_engine):
    llm = StarCoder(engine=chat_engine, max_tokens=16)
    messages = [ChatMessage(role="user", content="Add two numbers.")]
    full = llm.chat(messages)
    responses = list(llm.stream_chat(messages))
    assert len(responses) > 1
    text = ""
    for response in responses:
        text += response.delta
        assert response.message.content == text
    assert text == full.message.content
    assert responses[-1].additional_kwargs["completion_tokens"] == 16


async def test_async_chat_matches_sync(chat_engine):
    llm = StarCoder(engine=chat_engine, max_tokens=12)
    messages = [ChatMessage(role="user", content="Parse JSON.")]
    full = llm.chat(messages)
    assert (await llm.achat(messages)).message.content == full.message.content
    responses = [r async for r in await llm.astream_chat(messages)]
    assert responses[-1].message.content == full.message.content
    assert responses[-1].additional_kwargs["prompt_tokens"] == full.additional_kwargs["prompt_tokens"]


def test_chat_without_a_template_names_what_to_set(llm):
    with pytest.raises(UnsupportedModelError, match="chat_template"):
        llm.chat([ChatMessage(role="user", content="hi")])


def test_chat_template_field_and_messages_to_prompt(tiny_engine, backend_spy):
    messages = [ChatMessage(role="user", content="Write a loop.")]
    templated = StarCoder(engine=tiny_engine, max_tokens=6, chat_template=INSTRUCT_CHAT_TEMPLATE)
    seen = backend_spy(tiny_engine).prompts
    templated.chat(messages)
    assert tiny_engine.decode(seen[-1]) == "<|endoftext|>### Instruction\nWrite a loop.\n\n### Response\n"
    custom = StarCoder(
        engine=tiny_engine, max_tokens=6, messages_to_prompt=lambda ms: "# " + ms[-1].content + "\n"
    )
    custom.chat(messages)
    assert seen[-1] == tiny_engine.encode("# Write a loop.\n")


# --- callbacks and instrumentation ----------------------------------------------------------------------


def test_callbacks_fire_for_every_kind_of_call(tiny_engine, chat_engine):
    debug = LlamaDebugHandler()
    manager = CallbackManager([debug])
    llm = StarCoder(engine=tiny_engine, max_tokens=8, callback_manager=manager)
    done = llm.complete(PROMPT)
    streamed = list(llm.stream_complete(PROMPT))
    chat = StarCoder(engine=chat_engine, max_tokens=8, callback_manager=manager)
    answer = chat.chat([ChatMessage(role="user", content="hi")])
    pairs = debug.get_llm_inputs_outputs()
    assert len(pairs) == 3
    (s1, e1), (_, e2), (s3, e3) = pairs
    assert s1.payload[EventPayload.PROMPT] == PROMPT
    assert e1.payload[EventPayload.COMPLETION].text == done.text
    assert e2.payload[EventPayload.COMPLETION].text == streamed[-1].text
    assert e2.payload[EventPayload.COMPLETION].additional_kwargs["completion_tokens"] == 8
    assert s3.payload[EventPayload.MESSAGES][0].content == "hi"
    assert e3.payload[EventPayload.RESPONSE].message.content == answer.message.content
    assert s1.payload[EventPayload.SERIALIZED]["class_name"] == "StarCoder"


async def test_callbacks_fire_for_async_calls(tiny_engine):
    debug = LlamaDebugHandler()
    llm = StarCoder(engine=tiny_engine, max_tokens=8, callback_manager=CallbackManager([debug]))
    done = await llm.acomplete(PROMPT)
    streamed = [r async for r in await llm.astream_complete(PROMPT)]
    pairs = debug.get_llm_inputs_outputs()
    assert [end.payload[EventPayload.COMPLETION].text for _, end in pairs] == [
        done.text,
        streamed[-1].text,
    ]


def test_token_counting_handler_gets_the_real_counts(tiny_engine):
    calls: list[str] = []

    def counting_tokenizer(text: str) -> list[str]:
        calls.append(text)
        return text.split()

    counter = TokenCountingHandler(tokenizer=counting_tokenizer)
    llm = StarCoder(engine=tiny_engine, max_tokens=8, callback_manager=CallbackManager([counter]))
    response = llm.complete(PROMPT)
    list(llm.stream_complete(PROMPT, max_tokens=5))
    first, second = counter.llm_token_counts
    assert first.prompt_token_count == response.additional_kwargs["prompt_tokens"]
    assert first.completion_token_count == 8
    assert second.completion_token_count == 5
    assert not calls  # LlamaIndex never had to guess with its own tokenizer


class _Collector(BaseEventHandler):
    events: list[Any]

    @classmethod
    def class_name(cls) -> str:
        return "Collector"

    def handle(self, event: Any, **kwargs: Any) -> None:
        self.events.append(event)


@pytest.fixture
def collector():
    dispatcher = get_dispatcher()
    handler = _Collector(events=[])
    dispatcher.add_event_handler(handler)
    yield handler
    dispatcher.event_handlers.remove(handler)


async def test_instrumentation_events(tiny_engine, chat_engine, collector):
    llm = StarCoder(engine=tiny_engine, max_tokens=6)
    llm.complete(PROMPT)
    kinds = [type(e) for e in collector.events]
    assert kinds == [LLMCompletionStartEvent, LLMCompletionEndEvent]
    assert collector.events[0].span_id.startswith("StarCoder.complete")
    assert collector.events[1].response.additional_kwargs["completion_tokens"] == 6

    collector.events.clear()
    streamed = [r async for r in await llm.astream_complete(PROMPT)]
    kinds = [type(e) for e in collector.events]
    assert kinds[0] is LLMCompletionStartEvent and kinds[-1] is LLMCompletionEndEvent
    assert kinds.count(LLMCompletionInProgressEvent) == len(streamed)
    assert collector.events[0].span_id.startswith("StarCoder.astream_complete")

    collector.events.clear()
    chat = StarCoder(engine=chat_engine, max_tokens=6)
    list(chat.stream_chat([ChatMessage(role="user", content="hi")]))
    kinds = [type(e) for e in collector.events]
    assert kinds[0] is LLMChatStartEvent and kinds[-1] is LLMChatEndEvent
    assert LLMChatInProgressEvent in kinds


# --- errors ------------------------------------------------------------------------------------------


def test_errors_are_the_engines(llm, tmp_path):
    missing = StarCoder(model=str(tmp_path / "no-such-checkpoint"))  # constructing is fine
    with pytest.raises(ModelNotFoundError):
        missing.complete(PROMPT)
    with pytest.raises(InvalidParameterError, match="empty"):
        llm.complete("   ")
    with pytest.raises(ContextLengthError):
        llm.complete(PROMPT, max_tokens=llm.metadata.context_window)
    with pytest.raises(InvalidParameterError):
        llm.complete(PROMPT, temperature=-2)
    with pytest.raises(StarCoderError):
        list(llm.stream_complete(""))


async def test_async_errors_are_the_engines(llm):
    with pytest.raises(InvalidParameterError, match="empty"):
        await llm.acomplete("")
    with pytest.raises(ContextLengthError):
        await llm.astream_complete(PROMPT, max_tokens=10**6)


# --- inside LlamaIndex pipelines -------------------------------------------------------------------------


def _code_documents(folder: Path) -> list[Document]:
    return [
        Document(text=p.read_text(), metadata={"file_path": str(p.relative_to(folder))})
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    ]


def test_bm25_query_engine_streams_an_answer(llm, code_folder, collector):
    documents = _code_documents(code_folder)
    retriever = BM25Retriever.from_defaults(nodes=documents, similarity_top_k=1)
    engine = RetrieverQueryEngine.from_args(retriever, llm=llm, streaming=True)
    response = engine.query("Which function reads the JSON configuration file?")
    answer = "".join(response.response_gen)
    assert response.source_nodes[0].node.metadata["file_path"].endswith("config.py")
    # The query engine replaces the LLM's callback manager, so watch it through instrumentation.
    starts = [e for e in collector.events if isinstance(e, LLMCompletionStartEvent)]
    ends = [e for e in collector.events if isinstance(e, LLMCompletionEndEvent)]
    assert len(starts) == len(ends) == 1
    prompt = starts[0].prompt
    assert "def read_config(path):" in prompt  # the retrieved code reached the model
    assert "LruCache" not in prompt
    assert answer and answer == ends[0].response.text
    assert answer == llm.complete(prompt, formatted=True).text


async def test_vector_index_query_engine_async_stream(llm, code_folder):
    index = VectorStoreIndex.from_documents(
        _code_documents(code_folder), embed_model=MockEmbedding(embed_dim=8)
    )
    engine = index.as_query_engine(llm=llm, streaming=True, similarity_top_k=2)
    response = await engine.aquery("How does the cache drop old items?")
    deltas = [d async for d in response.async_response_gen()]
    assert len(deltas) > 1 and "".join(deltas).strip()
    assert len(response.source_nodes) == 2


def test_query_engine_with_a_chat_checkpoint(chat_engine, code_folder, collector):
    llm = StarCoder(engine=chat_engine, max_tokens=12)
    retriever = BM25Retriever.from_defaults(nodes=_code_documents(code_folder), similarity_top_k=1)
    engine = RetrieverQueryEngine.from_args(retriever, llm=llm)
    response = engine.query("How is the server started?")
    # A chat model is asked through chat(), i.e. through its chat template.
    starts = [e for e in collector.events if isinstance(e, LLMChatStartEvent)]
    ends = [e for e in collector.events if isinstance(e, LLMChatEndEvent)]
    assert len(starts) == len(ends) == 1
    assert any("startServer" in (m.content or "") for m in starts[0].messages)
    assert str(response) == ends[0].response.message.content
    assert ends[0].response.additional_kwargs["completion_tokens"] >= 1


def _run_example(*args: str) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    script = ROOT / "examples" / "llama_index_query.py"
    result = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _retrieved(out: str) -> list[str]:
    return [line.split()[0] for line in out.split("Retrieved:")[1].split("Answer:")[0].strip().splitlines()]


def test_example_main_with_a_folder(tiny_path, code_folder, capsys):
    # In-process (the subprocess run below covers the script as a program).
    spec = importlib.util.spec_from_file_location(
        "llama_index_query", ROOT / "examples" / "llama_index_query.py"
    )
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main(
        [
            "--model",
            str(tiny_path),
            "--folder",
            str(code_folder),
            "--max-tokens",
            "12",
            "--question",
            "Which function reads the configuration file?",
        ]
    )
    out = capsys.readouterr().out
    assert _retrieved(out)[0] == str(code_folder / "settings" / "config.py")
    assert out.split("Answer:", 1)[1].strip()


def test_example_script_defaults_to_the_sample_repo(tiny_path):
    out = _run_example("--model", str(tiny_path), "--max-tokens", "8")
    retrieved = _retrieved(out)
    assert len(retrieved) == 2
    assert Path(retrieved[0]) == ROOT / "examples" / "sample_repo" / "shop" / "pricing.py"


# --- fill in the middle ----------------------------------------------------------------------------------

FIM_PREFIX = "def mean(values):\n    total = "
FIM_SUFFIX = "\n    return total / len(values)\n"
# Files that hold control-token strings as text (tokenizer code, docs about StarCoder).
TRICKY_FILES = [
    ContextFile(
        "docs/tokens.md", "StarCoder2 separates files with <file_sep> and ends with <|endoftext|>.\n"
    ),
    ContextFile("tok.py", 'EOS = "<|endoftext|>"\nSEP = "<file_sep>"\nFIM = "<fim_middle>"\n'),
]
REPO = {"repo_name": "stats<file_sep>lib", "file_path": "stats/mean.py"}


def _control_counts(engine, ids: list[int]) -> dict[str, int]:
    names = ("<|endoftext|>", "<repo_name>", "<file_sep>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>")
    return {name: ids.count(engine.token_id(name)) for name in names}


def test_infill_matches_the_engine(llm, tiny_engine):
    response = llm.infill(FIM_PREFIX, FIM_SUFFIX)
    expected = tiny_engine.infill(FIM_PREFIX, FIM_SUFFIX, max_tokens=24)
    assert isinstance(response, CompletionResponse)
    assert response.text == expected.text
    assert response.additional_kwargs["completion_tokens"] == expected.completion_tokens
    assert response.additional_kwargs["prompt_tokens"] == expected.prompt_tokens
    assert response.raw["token_ids"] == expected.token_ids
    # Keywords work too, and override the settings for the call.
    short = llm.infill(prefix=FIM_PREFIX, suffix=FIM_SUFFIX, max_tokens=2, mode="spm")
    assert short.text == tiny_engine.infill(FIM_PREFIX, FIM_SUFFIX, max_tokens=2, mode="spm").text
    untrimmed = llm.infill(FIM_PREFIX, FIM_SUFFIX, trim_suffix_overlap=False)
    assert (
        untrimmed.text
        == tiny_engine.infill(FIM_PREFIX, FIM_SUFFIX, max_tokens=24, trim_suffix_overlap=False).text
    )


def test_stream_infill_is_cumulative(llm):
    full = llm.infill(FIM_PREFIX, FIM_SUFFIX, **REPO)
    responses = list(llm.stream_infill(FIM_PREFIX, FIM_SUFFIX, **REPO))
    text = ""
    for response in responses:
        text += response.delta
        assert response.text == text
    assert text == full.text
    assert responses[-1].additional_kwargs["prompt_tokens"] == full.additional_kwargs["prompt_tokens"]
    assert responses[-1].additional_kwargs["finish_reason"] == full.additional_kwargs["finish_reason"]


async def test_async_infill_matches_sync(llm):
    full = llm.infill(FIM_PREFIX, FIM_SUFFIX, context_files=TRICKY_FILES)
    response = await llm.ainfill(FIM_PREFIX, FIM_SUFFIX, context_files=TRICKY_FILES)
    assert response.text == full.text
    responses = [
        r async for r in await llm.astream_infill(FIM_PREFIX, FIM_SUFFIX, context_files=TRICKY_FILES)
    ]
    assert "".join(r.delta for r in responses) == responses[-1].text == full.text
    assert responses[-1].additional_kwargs["completion_tokens"] == full.additional_kwargs["completion_tokens"]
    async with _Ticker() as ticker:
        before = ticker.ticks
        await llm.ainfill(FIM_PREFIX, FIM_SUFFIX, max_tokens=48)
        assert ticker.ticks - before > 1


async def test_file_text_cannot_add_control_tokens(llm, tiny_engine, backend_spy):
    seen = backend_spy(tiny_engine).prompts
    args = dict(context_files=TRICKY_FILES, **REPO)
    expected = build_fim_prompt(
        tiny_engine, FIM_PREFIX, FIM_SUFFIX, max_prompt_tokens=tiny_engine.context_window - 24, **args
    )
    # The layout's control ids and no more: one repo name, a separator per file plus the hole's.
    layout = {
        "<|endoftext|>": 0,
        "<repo_name>": 1,
        "<file_sep>": 3,
        "<fim_prefix>": 1,
        "<fim_suffix>": 1,
        "<fim_middle>": 1,
    }
    assert _control_counts(tiny_engine, expected.token_ids) == layout
    responses = [
        llm.infill(FIM_PREFIX, FIM_SUFFIX, **args),
        list(llm.stream_infill(FIM_PREFIX, FIM_SUFFIX, **args))[-1],
        await llm.ainfill(FIM_PREFIX, FIM_SUFFIX, **args),
        [r async for r in await llm.astream_infill(FIM_PREFIX, FIM_SUFFIX, **args)][-1],
    ]
    assert len(seen) == 4
    assert all(ids == expected.token_ids for ids in seen)
    for response in responses:
        assert response.additional_kwargs["prompt_tokens"] == len(expected.token_ids)


def test_infill_budget(llm, tiny_engine):
    args = dict(context_files=TRICKY_FILES, max_prompt_tokens=40, **REPO)
    response = llm.infill(FIM_PREFIX * 5, FIM_SUFFIX * 5, **args)
    expected = build_fim_prompt(tiny_engine, FIM_PREFIX * 5, FIM_SUFFIX * 5, **args)
    assert response.additional_kwargs["prompt_tokens"] == len(expected.token_ids) <= 40


def test_infill_fires_callbacks_and_events(tiny_engine, collector):
    debug = LlamaDebugHandler()
    llm = StarCoder(engine=tiny_engine, max_tokens=6, callback_manager=CallbackManager([debug]))
    response = llm.infill(prefix=FIM_PREFIX, suffix=FIM_SUFFIX)
    list(llm.stream_infill(FIM_PREFIX, FIM_SUFFIX))
    (start, end), (_, stream_end) = debug.get_llm_inputs_outputs()
    assert start.payload[EventPayload.PROMPT] == FIM_PREFIX
    assert end.payload[EventPayload.COMPLETION].text == response.text
    assert stream_end.payload[EventPayload.COMPLETION].additional_kwargs["completion_tokens"] >= 1
    starts = [e for e in collector.events if isinstance(e, LLMCompletionStartEvent)]
    assert [e.span_id.split("-")[0] for e in starts] == ["StarCoder.infill", "StarCoder.stream_infill"]


def test_infill_errors_are_the_engines(llm):
    with pytest.raises(InvalidParameterError, match="mode"):
        llm.infill(FIM_PREFIX, FIM_SUFFIX, mode="pms")
    with pytest.raises(InvalidParameterError):
        llm.infill(FIM_PREFIX, FIM_SUFFIX, context_files=["not a ContextFile"])
    with pytest.raises(InvalidParameterError, match="max_token"):
        llm.infill(FIM_PREFIX, FIM_SUFFIX, max_token=4)
    with pytest.raises(ContextLengthError):
        llm.infill(FIM_PREFIX, FIM_SUFFIX, max_prompt_tokens=llm.metadata.context_window)
