"""StarCoderLLM on tiny checkpoints built offline, with LangChain's real machinery.

LangChain has no standard test suite for plain LLMs; these are the equivalent: construction,
invoke / stream / batch and their async forms, stop strings, callbacks, token counting, tracing
params, the LLM cache and serialization.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.caches import InMemoryCache
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.language_models import BaseLLM
from langchain_core.load import dumpd, dumps, load, loads
from langchain_core.outputs import GenerationChunk
from langchain_core.prompts import PromptTemplate
from pydantic import ValidationError

from langchain_starcoder import ChatStarCoder, FIMPromptTemplate, StarCoderEngine, StarCoderLLM
from langchain_starcoder._registry import DEFAULT_MODEL
from langchain_starcoder.errors import ContextLengthError, InvalidParameterError
from langchain_starcoder.testing import copy_checkpoint
from langchain_starcoder.types import GENERATION_KEYS

PROMPTS = ["def add(a, b):\n    ", "class Stack:\n    def push(self, item):\n", "import os\n\n\ndef main():"]


@pytest.fixture
def llm(tiny_path: Path) -> StarCoderLLM:
    return StarCoderLLM(model=tiny_path, max_tokens=8)


class Recorder(BaseCallbackHandler):
    """Records what LangChain's callbacks report."""

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.chunks: list[Any] = []
        self.starts: list[list[str]] = []
        self.ends: list[Any] = []

    def on_llm_start(self, serialized: Any, prompts: list[str], **kwargs: Any) -> None:
        self.starts.append(prompts)

    def on_llm_new_token(self, token: str, *, chunk: Any = None, **kwargs: Any) -> None:
        self.tokens.append(token)
        self.chunks.append(chunk)

    def on_llm_end(self, response: Any, **kwargs: Any) -> None:
        self.ends.append(response)


def spy(monkeypatch: pytest.MonkeyPatch, engine: StarCoderEngine, name: str) -> list[Any]:
    """Record the prompts given to ``engine.<name>`` (still calling it)."""
    calls: list[Any] = []
    real = getattr(engine, name)

    def wrapper(prompt: Any, **kwargs: Any) -> Any:
        calls.append(prompt)
        return real(prompt, **kwargs)

    monkeypatch.setattr(engine, name, wrapper)
    return calls


# --- construction -------------------------------------------------------------------------------


def test_defaults_and_public_api() -> None:
    llm = StarCoderLLM()
    assert isinstance(llm, BaseLLM)
    assert llm.model == DEFAULT_MODEL == "mlx-community/starcoder2-3b-4bit"
    assert llm._llm_type == "starcoder-mlx"
    for field in ("quantize", "dtype", "kv_bits", "max_tokens", "temperature", "top_p", "top_k", "min_p"):
        assert field in StarCoderLLM.model_fields
    for field in ("repetition_penalty", "stop", "seed"):
        assert field in StarCoderLLM.model_fields
    assert all(f.description for name, f in StarCoderLLM.model_fields.items() if name in GENERATION_KEYS)


def test_unknown_and_bad_fields_are_errors(tiny_path: Path) -> None:
    with pytest.raises(ValidationError, match="max_token"):
        StarCoderLLM(model=tiny_path, max_token=5)
    with pytest.raises(ValidationError, match="temperature"):
        StarCoderLLM(model=tiny_path, temperature=-1)
    with pytest.raises(ValidationError, match="max_tokens"):
        StarCoderLLM(model=tiny_path, max_tokens=0)
    with pytest.raises(ValidationError):
        StarCoderLLM(model=tiny_path, quantize=3)
    with pytest.raises(ValidationError):
        StarCoderLLM(model=tiny_path, dtype="float64")


def test_construction_loads_nothing_and_chains_share_one_engine(
    tiny_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loads_: list[str] = []
    real = StarCoderEngine.load.__func__  # type: ignore[attr-defined]

    def counting(cls: type, model: Any, **kwargs: Any) -> StarCoderEngine:
        loads_.append(str(model))
        return real(cls, model, **kwargs)

    monkeypatch.setattr(StarCoderEngine, "load", classmethod(counting))
    # A fresh copy, so that no earlier test has loaded it into the registry.
    path = copy_checkpoint(tiny_path, tmp_path / "shared")
    chains = [
        PromptTemplate.from_template("# {task}\n") | StarCoderLLM(model=path, max_tokens=n) for n in (2, 3, 4)
    ]
    StarCoderLLM(model="no-such-owner/no-such-model")  # nothing is looked up either
    assert loads_ == []
    outputs = [chain.invoke({"task": "add two numbers"}) for chain in chains]
    assert loads_ == [str(path)]
    assert len({id(chain.last.engine) for chain in chains}) == 1
    assert all(isinstance(o, str) for o in outputs)
    # Other load settings are another engine.
    assert StarCoderLLM(model=path, dtype="float16").engine is not chains[0].last.engine
    assert len(loads_) == 2


def test_given_engine(tiny_engine: StarCoderEngine, tiny_path: Path, chat_path: Path) -> None:
    llm = StarCoderLLM(engine=tiny_engine, max_tokens=4)
    assert llm.engine is tiny_engine
    assert llm.model == tiny_engine.name
    assert StarCoderLLM(engine=tiny_engine, model=tiny_path).engine is tiny_engine
    with pytest.raises(ValidationError, match="another checkpoint"):
        StarCoderLLM(engine=tiny_engine, model=chat_path)
    assert llm.invoke(PROMPTS[0]) == tiny_engine.generate(PROMPTS[0], max_tokens=4).text


# --- invoke, stream, batch -------------------------------------------------------------------------


def test_invoke_equals_stream_and_engine(llm: StarCoderLLM) -> None:
    text = llm.invoke(PROMPTS[0])
    assert text == llm.engine.generate(PROMPTS[0], max_tokens=8).text
    chunks = list(llm.stream(PROMPTS[0]))
    assert len(chunks) > 1
    assert "".join(chunks) == text


def test_generation_info_and_llm_output(llm: StarCoderLLM) -> None:
    llm.invoke(PROMPTS[1])  # fills the prompt cache
    result = llm.generate([PROMPTS[1]])
    info = result.generations[0][0].generation_info
    prompt_tokens = llm.get_num_tokens(PROMPTS[1])
    assert info["finish_reason"] in ("stop", "length")
    assert info["prompt_tokens"] == prompt_tokens
    assert 0 < info["cached_tokens"] <= prompt_tokens  # the repeated prompt came from the KV cache
    assert info["completion_tokens"] == (
        8 if info["finish_reason"] == "length" else info["completion_tokens"]
    )
    usage = result.llm_output["token_usage"]
    assert usage["prompt_tokens"] == prompt_tokens
    assert usage["total_tokens"] == prompt_tokens + info["completion_tokens"]
    assert result.llm_output["model_name"] == llm.model


def test_batch_is_one_engine_batch_and_equals_invoke(
    llm: StarCoderLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    singles = [llm.invoke(p) for p in PROMPTS]
    batches = spy(monkeypatch, llm.engine, "generate_batch")
    generates = spy(monkeypatch, llm.engine, "generate")
    assert llm.batch(PROMPTS) == singles
    assert batches == [PROMPTS]
    assert generates == []
    # max_concurrency splits the batch into smaller engine batches (a batch of one runs alone).
    assert llm.batch(PROMPTS, config={"max_concurrency": 2}) == singles
    assert batches[1:] == [PROMPTS[:2], PROMPTS[2:]] and generates == []


def test_call_overrides_and_unknown_arguments(llm: StarCoderLLM, chat_path: Path) -> None:
    result = llm.generate([PROMPTS[0]], max_tokens=3)
    assert result.generations[0][0].generation_info["completion_tokens"] <= 3
    assert (
        llm.invoke(PROMPTS[0], max_tokens=3)
        == llm.invoke(PROMPTS[0])[: len(llm.invoke(PROMPTS[0], max_tokens=3))]
    )
    other = llm.generate([PROMPTS[0]], model=str(chat_path))
    assert other.llm_output["model_name"] == str(chat_path)
    assert other.generations[0][0].text == StarCoderLLM(model=chat_path, max_tokens=8).invoke(PROMPTS[0])
    with pytest.raises(InvalidParameterError, match="max_length"):
        llm.invoke(PROMPTS[0], max_length=3)
    with pytest.raises(InvalidParameterError, match="temperature"):
        llm.invoke(PROMPTS[0], temperature=-1.0)
    with pytest.raises(ContextLengthError):
        llm.invoke("x " * 1200, max_tokens=1000)


def test_sampling_settings_reach_the_engine(tiny_path: Path) -> None:
    sampled = StarCoderLLM(model=tiny_path, max_tokens=12, temperature=1.5, seed=7)
    first = sampled.invoke(PROMPTS[0])
    assert sampled.invoke(PROMPTS[0]) == first  # the seed makes it reproducible
    expected = sampled.engine.generate(PROMPTS[0], max_tokens=12, temperature=1.5, seed=7).text
    assert first == expected
    assert (
        sampled.invoke(PROMPTS[0], seed=8)
        == sampled.engine.generate(PROMPTS[0], max_tokens=12, temperature=1.5, seed=8).text
    )


def test_leaving_a_stream_early_frees_the_engine(llm: StarCoderLLM) -> None:
    for _ in llm.stream(PROMPTS[2], max_tokens=200):
        break
    assert llm.invoke(PROMPTS[2]) == llm.engine.generate(PROMPTS[2], max_tokens=8).text


def test_streaming_flag_reports_tokens_from_invoke(tiny_path: Path) -> None:
    recorder = Recorder()
    llm = StarCoderLLM(model=tiny_path, max_tokens=8, streaming=True)
    text = llm.invoke(PROMPTS[0], config={"callbacks": [recorder]})
    assert recorder.tokens and "".join(recorder.tokens) == text
    assert text == StarCoderLLM(model=tiny_path, max_tokens=8).invoke(PROMPTS[0])


# --- stop strings ---------------------------------------------------------------------------------


def _stops_from(llm: StarCoderLLM, prompt: str) -> tuple[str, str, str]:
    """The free-running text and two stop strings in it, each starting at a token boundary and
    occurring first there, the second later than the first."""
    completion = llm.engine.generate(prompt, max_tokens=24)
    text, ids = completion.text, completion.token_ids
    starts = []
    for k in range(1, len(ids)):
        head = llm.engine.decode(ids[:k])
        stop = text[len(head) : len(head) + 2]
        if text.startswith(head) and len(stop) == 2 and stop.strip() and text.index(stop) == len(head):
            starts.append(len(head))
    early = starts[0]
    late = next(i for i in starts if i >= early + 2)
    return text, text[early : early + 2], text[late : late + 2]


def test_stop_from_call_and_field_are_merged(tiny_path: Path) -> None:
    free, early, late = _stops_from(StarCoderLLM(model=tiny_path), PROMPTS[0])
    cut_early, cut_late = free[: free.index(early)], free[: free.index(late)]
    assert len(cut_early) < len(cut_late)
    with_field = StarCoderLLM(model=tiny_path, max_tokens=24, stop=[late])
    assert with_field.invoke(PROMPTS[0]) == cut_late
    assert with_field.invoke(PROMPTS[0], stop=[early]) == cut_early  # both apply: the first one wins
    assert (
        StarCoderLLM(model=tiny_path, max_tokens=24, stop=[early]).invoke(PROMPTS[0], stop=[late])
        == cut_early
    )
    assert "".join(with_field.stream(PROMPTS[0], stop=[early])) == cut_early
    assert with_field.batch([PROMPTS[0], PROMPTS[1]], stop=[early])[0] == cut_early
    info = with_field.generate([PROMPTS[0]], stop=[early]).generations[0][0].generation_info
    assert info["finish_reason"] == "stop" and info["stop_sequence"] == early
    assert with_field._get_ls_params(stop=[early])["ls_stop"] == [late, early]


def test_stop_inside_a_token_keeps_the_text_before_it(tiny_path: Path) -> None:
    llm = StarCoderLLM(model=tiny_path, max_tokens=24)
    completion = llm.engine.generate(PROMPTS[0], max_tokens=24)
    first = llm.engine.decode(completion.token_ids[:1])
    second = llm.engine.decode(completion.token_ids[1:2])
    assert len(second) >= 3 and completion.text.startswith(first + second)
    stop = second[1:3]  # starts one character into the second token
    expected = completion.text[: completion.text.index(stop)]
    assert llm.batch([PROMPTS[0], PROMPTS[1]], stop=[stop])[0] == expected
    assert llm.invoke(PROMPTS[0], stop=[stop]) == expected


# --- callbacks -------------------------------------------------------------------------------------


def test_callbacks_get_each_chunk_once(llm: StarCoderLLM) -> None:
    recorder = Recorder()
    pieces = list(llm.stream(PROMPTS[1], config={"callbacks": [recorder]}))
    assert recorder.tokens == pieces
    assert all(isinstance(c, GenerationChunk) for c in recorder.chunks)
    assert [c.text for c in recorder.chunks] == pieces
    assert recorder.chunks[-1].generation_info["finish_reason"] in ("stop", "length")
    assert recorder.starts == [[PROMPTS[1]]]
    assert recorder.ends[0].generations[0][0].text == "".join(pieces)


def test_batch_callbacks_one_run_per_prompt(llm: StarCoderLLM) -> None:
    recorder = Recorder()
    outputs = llm.batch(PROMPTS, config={"callbacks": [recorder]})
    assert sorted(p for start in recorder.starts for p in start) == sorted(PROMPTS)
    assert sorted(end.generations[0][0].text for end in recorder.ends) == sorted(outputs)


# --- async -----------------------------------------------------------------------------------------


async def test_async_paths_agree_with_sync(llm: StarCoderLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    singles = [llm.invoke(p) for p in PROMPTS]
    assert await llm.ainvoke(PROMPTS[0]) == singles[0]
    assert "".join([c async for c in llm.astream(PROMPTS[1])]) == singles[1]
    batches = spy(monkeypatch, llm.engine, "agenerate_batch")
    assert await llm.abatch(PROMPTS) == singles
    assert batches == [PROMPTS]


async def test_astream_keeps_the_event_loop_free(llm: StarCoderLLM) -> None:
    """A ticker coroutine keeps running between tokens, and no token hops threads: the one hop is
    the prompt's tokenizing (work that grows with the input stays off the loop)."""
    loop = asyncio.get_running_loop()
    hops: list[Any] = []
    real_run_in_executor = loop.run_in_executor

    def counting(*args: Any) -> Any:
        hops.append(args)
        return real_run_in_executor(*args)

    tokens_seen: list[int] = []
    ticks_at: list[int] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while not done.is_set():
            ticks_at.append(len(tokens_seen))
            await asyncio.sleep(0)

    llm.engine  # noqa: B018  (loaded: a first async call would load it in a thread, once)
    task = asyncio.create_task(ticker())
    loop.run_in_executor = counting  # type: ignore[method-assign]
    try:
        async for piece in llm.astream(PROMPTS[2], max_tokens=48):
            tokens_seen.append(len(piece))
    finally:
        loop.run_in_executor = real_run_in_executor  # type: ignore[method-assign]
        done.set()
        await task
    assert len(tokens_seen) > 2
    assert len(hops) == 1
    # The ticker ran while the generation was under way, after some tokens and before the last.
    assert any(0 < seen < len(tokens_seen) for seen in ticks_at)


async def test_first_async_call_loads_off_the_event_loop(
    tiny_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ticks = 0
    during_load: list[int] = []
    real = StarCoderEngine.load.__func__  # type: ignore[attr-defined]

    def load(cls: type, model: Any, **kwargs: Any) -> StarCoderEngine:
        during_load.append(ticks)
        engine = real(cls, model, **kwargs)
        during_load.append(ticks)
        return engine

    monkeypatch.setattr(StarCoderEngine, "load", classmethod(load))
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        llm = StarCoderLLM(model=copy_checkpoint(tiny_path, tmp_path / "fresh"), max_tokens=4)
        text = await llm.ainvoke(PROMPTS[0])
    finally:
        done.set()
        await task
    assert len(during_load) == 2 and during_load[1] > during_load[0]  # the loop ran while it loaded
    assert text == llm.invoke(PROMPTS[0])


async def test_async_callbacks_and_generate(llm: StarCoderLLM) -> None:
    class AsyncRecorder(AsyncCallbackHandler):
        def __init__(self) -> None:
            self.chunks: list[GenerationChunk] = []

        async def on_llm_new_token(self, token: str, *, chunk: Any = None, **kwargs: Any) -> None:
            self.chunks.append(chunk)

    recorder = AsyncRecorder()
    pieces = [c async for c in llm.astream(PROMPTS[0], config={"callbacks": [recorder]})]
    assert [c.text for c in recorder.chunks] == pieces
    result = await llm.agenerate([PROMPTS[0]])
    assert result.generations[0][0].text == "".join(pieces)
    assert result.generations[0][0].generation_info["prompt_tokens"] == llm.get_num_tokens(PROMPTS[0])


# --- tokens, params, cache, serialization -----------------------------------------------------------


def test_token_counting_uses_the_model_tokenizer(llm: StarCoderLLM) -> None:
    text = "def add(a, b):<fim_prefix>"
    assert llm.get_token_ids(text) == llm.engine.encode(text)
    assert llm.get_num_tokens(text) == len(llm.engine.encode(text))
    assert llm.get_token_ids("<fim_prefix>") == [llm.engine.token_id("<fim_prefix>")]  # GPT-2 splits it up


def test_identifying_and_langsmith_params(tiny_path: Path) -> None:
    llm = StarCoderLLM(model=tiny_path, max_tokens=9, temperature=0.3, stop=["\n\n"], seed=1, kv_bits=8)
    params = llm._identifying_params
    assert params["model"] == str(tiny_path)
    for key in (*GENERATION_KEYS, "quantize", "dtype", "kv_bits"):
        if key != "stop":  # under "default_stop": LangChain puts a call's stop under "stop"
            assert key in params and params[key] == getattr(llm, key)
    assert params["default_stop"] == ["\n\n"]
    ls = llm._get_ls_params(stop=["#"], max_tokens=5)
    assert ls == {
        "ls_provider": "mlx",
        "ls_model_name": str(tiny_path),
        "ls_model_type": "llm",
        "ls_temperature": 0.3,
        "ls_max_tokens": 5,
        "ls_stop": ["\n\n", "#"],
    }
    assert llm._get_ls_params(model="other/model")["ls_model_name"] == "other/model"


def test_llm_cache_key_covers_the_settings(tiny_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = InMemoryCache()
    llm = StarCoderLLM(model=tiny_path, max_tokens=6, cache=cache)
    calls = spy(monkeypatch, llm.engine, "generate_batch")
    first = llm.invoke(PROMPTS[0])
    assert llm.invoke(PROMPTS[0]) == first
    assert len(calls) == 1  # the second came from the cache
    for change in ({"max_tokens": 5}, {"temperature": 0.5}, {"top_k": 3}, {"stop": ["x"]}, {"seed": 3}):
        StarCoderLLM(model=tiny_path, cache=cache, **{"max_tokens": 6, **change}).invoke(PROMPTS[0])
    assert len(calls) == 6  # each setting is part of the key
    # ... and so is a setting given with the call, not only the fields.
    assert len(llm.invoke(PROMPTS[0], max_tokens=2)) <= len(first) and len(calls) == 7
    llm.invoke(PROMPTS[0], max_tokens=2)
    assert len(calls) == 7


def test_llm_cache_key_covers_every_fim_setting(tiny_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two FIM settings that render the same text are two cache entries (issue: a cached middle
    for another budget or trim was returned)."""
    cache = InMemoryCache()
    llm = StarCoderLLM(model=tiny_path, max_tokens=6, cache=cache)
    calls = spy(monkeypatch, llm.engine, "generate_batch")
    parts = {"prefix": "def total(xs):\n    ", "suffix": "\n    return t\n"}
    for template in (
        FIMPromptTemplate(),
        FIMPromptTemplate(max_prompt_tokens=12),
        FIMPromptTemplate(trim_suffix_overlap=False),
    ):
        (template | llm).invoke(parts)
        (template | llm).invoke(parts)  # the same again: from the cache
    assert len(calls) == 3
    assert len(cache._cache) == 3


@pytest.mark.filterwarnings("ignore::langchain_core._api.beta_decorator.LangChainBetaWarning")
def test_serialization_round_trip(tiny_path: Path, tiny_engine: StarCoderEngine) -> None:
    llm = StarCoderLLM(model=tiny_path, max_tokens=9, temperature=0.2, stop=["\n"], seed=3, kv_bits=4)
    data = dumpd(llm)
    assert data["id"] == ["langchain_starcoder", "llms", "StarCoderLLM"]
    for text in (None, dumps(llm)):
        restored = (
            loads(text, valid_namespaces=["langchain_starcoder"], allowed_objects=[StarCoderLLM])
            if text
            else load(data, valid_namespaces=["langchain_starcoder"], allowed_objects=[StarCoderLLM])
        )
        assert isinstance(restored, StarCoderLLM)
        assert restored._identifying_params == llm._identifying_params
    # A given engine is not part of the config: the restored LLM loads the checkpoint it names.
    given = dumpd(StarCoderLLM(engine=tiny_engine))
    assert "engine" not in given["kwargs"] and "given_engine" not in given["kwargs"]
    restored = load(given, valid_namespaces=["langchain_starcoder"], allowed_objects=[StarCoderLLM])
    assert restored.model == tiny_engine.name


def test_chat_model_shares_the_registry(chat_path: Path) -> None:
    llm = StarCoderLLM(model=chat_path)
    chat = ChatStarCoder(model=chat_path)
    assert llm.engine is chat.engine


def test_lcel_example_runs(tiny_path: Path) -> None:
    """examples/lcel_chain.py on a built checkpoint: its chains print what the same chains return here."""
    import importlib.util

    script = Path(__file__).resolve().parents[2] / "examples" / "lcel_chain.py"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(script), "--model", str(tiny_path), "--max-tokens", "8"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    spec = importlib.util.spec_from_file_location("lcel_chain", script)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)  # type: ignore[union-attr]
    llm = StarCoderLLM(model=tiny_path, max_tokens=8, stop=["\ndef ", "\nclass "])
    streamed = (example.PROMPT | llm).invoke(example.TASKS[0])
    bodies = (example.PROMPT | llm).batch(example.TASKS)
    middle = (FIMPromptTemplate() | llm).invoke(example.HOLE)
    out = done.stdout
    assert f"== stream ==\n{streamed}\n== batch ==" in out
    for task, body in zip(example.TASKS, bodies, strict=True):
        assert f"-- {task['name']} --\n{body}\n" in out
    assert out.endswith(f"== fill in the middle ==\n{middle}\n")


def test_streams_never_end_on_an_empty_piece(llm: StarCoderLLM) -> None:
    recorder = Recorder()
    pieces = list(llm.stream(PROMPTS[0], config={"callbacks": [recorder]}))
    assert pieces and all(pieces)
    assert "".join(pieces) == llm.invoke(PROMPTS[0])
    # The counts still reach the callbacks, with the last chunk.
    assert recorder.chunks[-1].generation_info["finish_reason"] == "length"
    # The engine's own stream ends with the last token's text when it stops at max_tokens.
    chunks = list(llm.engine.stream(PROMPTS[0], max_tokens=8))
    assert chunks[-1].finish_reason == "length" and chunks[-1].text and chunks[-1].token_ids


def test_streaming_field_sends_tokens_to_callbacks_during_invoke(tiny_path: Path) -> None:
    recorder = Recorder()
    text = StarCoderLLM(model=tiny_path, max_tokens=8, streaming=True).invoke(
        PROMPTS[1], config={"callbacks": [recorder]}
    )
    assert len(recorder.tokens) > 1 and "".join(recorder.tokens) == text
