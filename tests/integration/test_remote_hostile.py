"""The remote backend against hostile or broken servers: stubs on 127.0.0.1 that speak llama.cpp's
or vLLM's protocol but send impossible numbers, keep a stream alive without tokens, trickle bytes,
or hold back more ids than a character can account for. Each must end in one clear ServerError,
in bounded time, naming what the user can change, and leave the engine usable.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from langchain_starcoder import ChatStarCoder, StarCoderEngine, StarCoderLLM
from langchain_starcoder.backends.remote import (
    MAX_WITHHELD,
    ServerError,
    ServerTimeoutError,
    ServerUnavailableError,
    _split,
)
from langchain_starcoder.llama_index import StarCoder

VOCAB, CONTEXT = 1024, 2048  # the tiny checkpoint's
Write = Callable[[bytes], None]


class HostileStub:
    """A llama-server (or, with ``vllm``, a vLLM) look-alike: ``models`` and ``props`` are the JSON
    bodies of ``/v1/models`` and ``/props``; ``stream(body, write)`` writes a completion's body."""

    def __init__(self, stream: Callable[[dict[str, Any], Write], None], vllm: bool = False) -> None:
        card: dict[str, Any] = (
            {"id": "tiny", "max_model_len": CONTEXT}
            if vllm
            else {"id": "tiny", "meta": {"n_vocab": VOCAB, "n_ctx_train": CONTEXT}}
        )
        self.models: Any = {"data": [card]}
        self.props: Any = {"default_generation_settings": {"n_ctx": CONTEXT}}
        self.stream = stream
        self.stop = threading.Event()  # ends any stream still running (the stub is closing)
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                body = {"/v1/models": stub.models, "/props": stub.props}.get(self.path)
                data = json.dumps(body).encode()
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()

                def write(data: bytes) -> None:
                    self.wfile.write(data)
                    self.wfile.flush()

                with contextlib.suppress(OSError):  # the client left (what most tests want)
                    stub.stream(body, write)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


@pytest.fixture
def ids(tiny_engine: StarCoderEngine) -> dict[str, int]:
    return {c: tiny_engine.encode(c)[0] for c in "abc "}


@contextlib.contextmanager
def serving(stream: Callable[[dict[str, Any], Write], None], vllm: bool = False) -> Iterator[HostileStub]:
    stub = HostileStub(stream, vllm)
    try:
        yield stub
    finally:
        stub.close()


def connect(stub: HostileStub, tiny_path: Path, **kwargs: Any) -> StarCoderEngine:
    # The whole reported context, past the tiny model's 512-token window, for the long streams here.
    kwargs.setdefault("inexact_past_window", True)
    return StarCoderEngine.connect(stub.url, model="tiny", tokenizer=tiny_path, max_retries=0, **kwargs)


def llama_events(ids: dict[str, int], **first: Any) -> Callable[[dict[str, Any], Write], None]:
    """A llama.cpp stream of "abc", whose first event gets the fields ``first``."""

    def stream(body: dict[str, Any], write: Write) -> None:
        events = [{"tokens": [ids[c]], "content": c, "stop": False} for c in "abc"]
        events[0].update(first)
        write(sse(*events, {"tokens": [], "content": "", "stop": True}))

    return stream


def vllm_events(
    ids: dict[str, int], cached: Any = 0, token: Any = None
) -> Callable[[dict[str, Any], Write], None]:
    def stream(body: dict[str, Any], write: Write) -> None:
        head = {"id": "cmpl-1", "object": "text_completion", "model": "tiny"}
        chunks = [
            {**head, "choices": [{"index": 0, "text": c, "token_ids": [ids[c]], "finish_reason": None}]}
            for c in "abc"
        ]
        chunks[0]["choices"][0]["prompt_token_ids"] = body["prompt"]
        if token is not None:
            chunks[1]["choices"][0]["token_ids"] = [token]
        chunks[-1]["choices"][0]["finish_reason"] = "length"
        usage = {
            "prompt_tokens": len(body["prompt"]),
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        write(sse(*chunks, {**head, "choices": [], "usage": usage}) + b"data: [DONE]\n\n")

    return stream


# --- item 7: every number a server sends is checked ------------------------------------------------


@pytest.mark.parametrize("token", [99999, VOCAB, -1, 2**70, True, 1.5, "7"])
@pytest.mark.parametrize("protocol", ["llama.cpp", "vllm"])
def test_impossible_token_ids_are_refused(
    tiny_path: Path, ids: dict[str, int], token: Any, protocol: str
) -> None:
    if protocol == "vllm":
        stream = vllm_events(ids, token=token)
    else:
        stream = llama_events(ids)
        good = stream

        def stream(body: dict[str, Any], write: Write) -> None:
            write(sse({"tokens": [ids["a"]], "stop": False}, {"tokens": [token], "stop": False}))
            good(body, write)

    with serving(stream, vllm=protocol == "vllm") as stub:
        engine = connect(stub, tiny_path)
        with pytest.raises(
            ServerError, match=r"impossible token id: .* \(expected an integer from 0 to 1023\)"
        ):
            engine.generate("def f():", max_tokens=8)
        engine.close()


@pytest.mark.parametrize("cached", [10**9, 1e9, 5, -1, True])
def test_impossible_cache_hits_are_refused(tiny_path: Path, ids: dict[str, int], cached: Any) -> None:
    """A hit larger than the prompt (4 ids here), negative, or not an integer, in either protocol."""
    for stream, vllm, what in (
        (llama_events(ids, timings={"cache_n": cached}), False, "timings.cache_n"),
        (vllm_events(ids, cached=cached), True, "cached_tokens"),
    ):
        with serving(stream, vllm) as stub:
            engine = connect(stub, tiny_path)
            with pytest.raises(ServerError, match=rf"impossible {what}: .* from 0 to 4\)"):
                engine.generate("def f():", max_tokens=3)
            engine.close()


def test_possible_numbers_pass(tiny_path: Path, ids: dict[str, int]) -> None:
    with (
        serving(llama_events(ids, timings={"cache_n": 3})) as stub,
        closing(connect(stub, tiny_path)) as engine,
    ):
        completion = engine.generate("def f():", max_tokens=3)
        assert (completion.text, completion.cached_tokens) == ("abc", 3)
    with serving(vllm_events(ids, cached=4), vllm=True) as stub, closing(connect(stub, tiny_path)) as engine:
        assert engine.generate("def f():", max_tokens=3).cached_tokens == 4


@pytest.mark.parametrize("predicted", [-1, 2**70, True, 9])
def test_impossible_generated_counts_are_refused(
    tiny_path: Path, ids: dict[str, int], predicted: Any
) -> None:
    """``tokens_predicted`` is at most ``max_tokens`` (8 here); 2**70 used to build a list that long."""
    with (
        serving(llama_events(ids, tokens_predicted=predicted)) as stub,
        closing(connect(stub, tiny_path)) as engine,
        pytest.raises(ServerError, match=r"impossible tokens_predicted: .* from 0 to 8\)"),
    ):
        engine.generate("def f():", max_tokens=8)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n_ctx", 0),
        ("n_ctx", -100),
        ("n_ctx", True),
        ("n_ctx", 2048.0),
        ("n_vocab", "1024"),
        ("n_vocab", 0),
        ("n_ctx_train", -1),
        ("max_model_len", 0),
        ("max_model_len", True),
    ],
)
def test_impossible_sizes_are_refused_at_connect(
    tiny_path: Path, ids: dict[str, int], field: str, value: Any
) -> None:
    with serving(llama_events(ids), vllm=field == "max_model_len") as stub:
        if field == "n_ctx":
            stub.props["default_generation_settings"]["n_ctx"] = value
        elif field == "max_model_len":
            stub.models["data"][0]["max_model_len"] = value
        else:
            stub.models["data"][0]["meta"][field] = value
        with pytest.raises(ServerError, match=rf"impossible {field}: .*expected an integer >= 1"):
            connect(stub, tiny_path)


@pytest.mark.parametrize(
    ("models", "props", "message"),
    [
        ({"data": 5}, None, r"/v1/models lists no models \('data' is '5'\)"),
        ({"data": [{"id": "tiny", "meta": [1]}]}, None, "does not report its context"),
        (None, {"default_generation_settings": [1, 2]}, "does not report its context"),
        (None, [{"n_ctx": 2048}], "/props answered something that is not a JSON object"),
    ],
)
def test_malformed_answers_at_connect_are_one_server_error(
    tiny_path: Path, ids: dict[str, int], models: Any, props: Any, message: str
) -> None:
    with serving(llama_events(ids)) as stub:
        stub.models = models if models is not None else stub.models
        stub.props = props if props is not None else stub.props
        with pytest.raises(ServerError, match=message):
            connect(stub, tiny_path)


@pytest.fixture
def llama_stub(tiny_path: Path, ids: dict[str, int]) -> Iterator[tuple[HostileStub, StarCoderEngine]]:
    with serving(llama_events(ids)) as stub, closing(connect(stub, tiny_path)) as engine:
        yield stub, engine


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    value=st.one_of(
        st.integers(min_value=-(2**80), max_value=2**80),
        st.booleans(),
        st.none(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=3),
    )
)
def test_any_streamed_id_is_in_the_vocabulary_or_refused(
    llama_stub: tuple[HostileStub, StarCoderEngine], ids: dict[str, int], value: Any
) -> None:
    """Whatever a server puts in ``tokens``, what reaches token_ids is a vocabulary id."""
    stub, engine = llama_stub
    stub.stream = llama_events(ids, tokens=[value])
    try:
        completion = engine.generate("def f():", max_tokens=3)
    except ServerError as e:
        assert "impossible token id" in str(e)
    else:
        assert all(type(t) is int and 0 <= t < VOCAB for t in completion.token_ids)
        assert completion.token_ids[0] == value


# --- item 4: held-back ids are rebuilt in linear time, the gap is bounded ---------------------------


def test_an_impossible_split_is_refused_at_once(tiny_path: Path, ids: dict[str, int]) -> None:
    """28 spaces cannot be 29 tokens; backtracking tried every way (the tiny vocabulary has runs of
    1, 2, 3 and 5 spaces) for tens of seconds, on the caller's thread, where no timeout applies."""
    content = " " * 28 + "a"
    stream = llama_events(ids, content=content, tokens_predicted=30)
    with serving(stream) as stub, closing(connect(stub, tiny_path, timeout=60)) as engine:
        started = time.monotonic()
        with pytest.raises(ServerError, match=r"held back 29 token ids .* could not be rebuilt"):
            engine.generate("def f():", max_tokens=40)
        assert time.monotonic() - started < 5


def test_a_possible_split_is_rebuilt_longest_piece_first(
    tiny_path: Path, tiny_engine: StarCoderEngine, ids: dict[str, int]
) -> None:
    content = " " * 28 + "a"
    stream = llama_events(ids, content=content, tokens_predicted=10)  # 9 held back + "a"
    with serving(stream) as stub, closing(connect(stub, tiny_path)) as engine:
        completion = engine.generate("def f():", max_tokens=40)
    assert completion.text == content + "bc" and completion.completion_tokens == 12
    assert tiny_engine.decode(completion.token_ids[:9]) == " " * 28
    assert [len(tiny_engine.decode([t])) for t in completion.token_ids[:9]] == [5, 5, 5, 5, 3, 2, 1, 1, 1]


def test_a_gap_beyond_the_bound_is_refused(tiny_path: Path, ids: dict[str, int]) -> None:
    """A gap of 1,000 ids hit the recursion limit; now any gap above MAX_WITHHELD is refused."""
    for gap in (1000, MAX_WITHHELD + 1):
        content = " " * gap + "a"
        with (
            serving(llama_events(ids, content=content, tokens_predicted=gap + 1)) as stub,
            closing(connect(stub, tiny_path)) as engine,
            pytest.raises(ServerError, match=f"held back {gap} token ids at once"),
        ):
            engine.generate("def f():", max_tokens=2000)


def _split_by_backtracking(data: bytes, count: int, pieces: dict[bytes, int]) -> list[int] | None:
    """The old recursive search (longest piece first), as a reference on short inputs."""
    if count == 0:
        return [] if not data else None
    for end in range(len(data), 0, -1):
        head = pieces.get(data[:end])
        rest = _split_by_backtracking(data[end:], count - 1, pieces) if head is not None else None
        if rest is not None:
            return [head, *rest]
    return None


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=10).map(lambda b: bytes(97 + x % 3 for x in b)), count=st.integers(0, 12))
def test_split_equals_the_backtracking_it_replaces(data: bytes, count: int) -> None:
    pieces = {b"a": 1, b"b": 2, b"c": 3, b"ab": 4, b"aab": 5, b"bc": 6, b"abc": 7, b"cc": 8}
    assert _split(data, count, pieces, 3) == _split_by_backtracking(data, count, pieces)


# --- item 4: timeout is silence (tokens), deadline is the whole request -----------------------------


def test_keep_alive_comments_do_not_reset_the_silence_bound(tiny_path: Path, ids: dict[str, int]) -> None:
    """A server that sends ``: ping`` comments (and never a token) held a client 43 s with timeout=5."""

    def stream(body: dict[str, Any], write: Write) -> None:
        write(sse({"tokens": [ids["a"]], "stop": False}))
        for _ in range(150):  # 30 s at most
            write(b": ping\n\n")
            if stub.stop.wait(0.2):
                return

    with serving(stream) as stub, closing(connect(stub, tiny_path, timeout=1)) as engine:
        started = time.monotonic()
        with pytest.raises(
            ServerTimeoutError, match=r"sent no token for 1 s \(after 1 generated tokens\); raise timeout="
        ):
            engine.generate("def f():", max_tokens=8)
        assert time.monotonic() - started < 5


def test_a_trickled_line_does_not_reset_the_silence_bound(tiny_path: Path, ids: dict[str, int]) -> None:
    def stream(body: dict[str, Any], write: Write) -> None:
        write(b'data: {"tokens": [')
        for _ in range(150):  # one byte every 0.2 s, never a whole line
            write(b" ")
            if stub.stop.wait(0.2):
                return

    with serving(stream) as stub, closing(connect(stub, tiny_path, timeout=1)) as engine:
        started = time.monotonic()
        with pytest.raises(ServerTimeoutError, match=r"sent no token for 1 s"):
            engine.generate("def f():", max_tokens=8)
        assert time.monotonic() - started < 5


def test_the_deadline_bounds_a_server_that_keeps_sending_tokens(tiny_path: Path, ids: dict[str, int]) -> None:
    def stream(body: dict[str, Any], write: Write) -> None:
        for _ in range(100):  # a token every 0.1 s: never silent for timeout
            write(sse({"tokens": [ids["a"]], "stop": False}))
            if stub.stop.wait(0.1):
                return

    with serving(stream) as stub, closing(connect(stub, tiny_path, timeout=1, deadline=1.5)) as engine:
        started = time.monotonic()
        with pytest.raises(
            ServerTimeoutError,
            match=r"ran past its deadline of 1.5 s in all \(after \d+ generated tokens\); raise deadline=",
        ):
            engine.generate("def f():", max_tokens=1000)
        assert 1.4 < time.monotonic() - started < 5
        stub.stream = llama_events(ids)
        assert engine.generate("def f():", max_tokens=3).text == "abc"  # still usable


def test_settings_are_checked(tiny_path: Path, ids: dict[str, int]) -> None:
    with serving(llama_events(ids)) as stub:
        for bad in ({"deadline": 0}, {"deadline": float("inf")}, {"timeout": True}, {"timeout": -1}):
            with pytest.raises(ValueError, match=f"{next(iter(bad))} must be a positive number of seconds"):
                connect(stub, tiny_path, **bad)


# --- item 4: the wrappers have the fields, the registry passes them, errors name them ---------------


@pytest.mark.parametrize("cls", [StarCoderLLM, ChatStarCoder, StarCoder])
def test_wrappers_pass_timeout_deadline_and_retries(cls: type, tiny_path: Path, ids: dict[str, int]) -> None:
    with serving(llama_events(ids)) as stub:
        wrapper = cls(
            base_url=stub.url, model="tiny", tokenizer=str(tiny_path), timeout=7, deadline=30, max_retries=0
        )
        backend = wrapper.engine.backend
        assert (backend.timeout, backend.deadline, backend.max_retries) == (7, 30, 0)
        same = cls(
            base_url=stub.url, model="tiny", tokenizer=str(tiny_path), timeout=7, deadline=30, max_retries=0
        )
        other = cls(
            base_url=stub.url, model="tiny", tokenizer=str(tiny_path), timeout=8, deadline=30, max_retries=0
        )
        assert same.engine is wrapper.engine and other.engine is not wrapper.engine
        with pytest.raises(ValueError, match=r"\['deadline', 'timeout'\] needs base_url"):
            cls(model=str(tiny_path), timeout=7, deadline=30)
        with pytest.raises(ValueError, match="greater than 0"):
            cls(base_url=stub.url, model="tiny", timeout=0)


def test_wrapper_timeout_error_names_its_field(tiny_path: Path, ids: dict[str, int]) -> None:
    def stream(body: dict[str, Any], write: Write) -> None:
        stub.stop.wait(10)  # prefill that never ends

    with serving(stream) as stub:
        llm = StarCoderLLM(
            base_url=stub.url, model="tiny", tokenizer=str(tiny_path), timeout=0.5, max_retries=0
        )
        started = time.monotonic()
        with pytest.raises(ServerTimeoutError, match="raise timeout="):
            llm.invoke("def f():")
        assert time.monotonic() - started < 5
        assert "timeout" in type(llm).model_fields  # the setting the message names exists there


def test_unreachable_error_names_max_retries(tiny_path: Path) -> None:
    from langchain_starcoder.testing.gguf import free_port

    nothing = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(
        ServerUnavailableError, match=r"could not be reached .* after 2 tries \(max_retries=1\)"
    ):
        StarCoderEngine.connect(nothing, model="tiny", tokenizer=tiny_path, max_retries=1)


# --- item 15: a prompt time that is not known is None, never a made-up rate -------------------------


def test_prompt_time_unknown_through_vllm(tiny_path: Path, ids: dict[str, int]) -> None:
    with serving(vllm_events(ids), vllm=True) as stub, closing(connect(stub, tiny_path)) as engine:
        completion = engine.generate("def f():", max_tokens=3)
        chunks = list(engine.stream("def f():", max_tokens=3))
    assert completion.prompt_seconds is None and completion.prompt_tps is None
    assert chunks[-1].prompt_seconds is None
    assert completion.generation_seconds >= 0 and completion.usage()["prompt_tokens"] == 4


def test_prompt_time_is_llama_cpps_own(tiny_path: Path, ids: dict[str, int]) -> None:
    """llama.cpp times its prefill (``timings.prompt_ms``); a figure longer than the request is refused."""
    llama = llama_events(ids, timings={"cache_n": 0, "prompt_ms": 150.0})

    def stream(body: dict[str, Any], write: Write) -> None:
        time.sleep(0.2)  # the prefill
        llama(body, write)

    with serving(stream) as stub, closing(connect(stub, tiny_path)) as engine:
        completion = engine.generate("def f():", max_tokens=3)
        assert completion.prompt_seconds == pytest.approx(0.15)
        assert completion.prompt_tps == pytest.approx(4 / 0.15)
        stub.stream = llama_events(ids, timings={"prompt_ms": 60_000.0})  # a minute, in 0.01 s
        with pytest.raises(ServerError, match=r"impossible timings.prompt_ms: 60000.0"):
            engine.generate("def f():", max_tokens=3)
        stub.stream = llama_events(ids)  # no timings: not known
        assert engine.generate("def f():", max_tokens=3).prompt_seconds is None


def test_unknown_prompt_time_reaches_the_wrappers_as_none(tiny_path: Path, ids: dict[str, int]) -> None:
    with serving(vllm_events(ids), vllm=True) as stub:
        response = StarCoder(
            base_url=stub.url, model="tiny", tokenizer=str(tiny_path), max_tokens=3
        ).complete("x")
        assert response.raw["prompt_seconds"] is None and response.raw["prompt_tps"] is None
        assert json.loads(json.dumps(response.raw))["prompt_tps"] is None


def test_cli_stats_say_the_prompt_rate_is_unknown() -> None:
    from langchain_starcoder.cli import _stats
    from langchain_starcoder.types import CompletionChunk

    unknown = CompletionChunk(
        "",
        [],
        finish_reason="length",
        prompt_tokens=4,
        cached_tokens=0,
        completion_tokens=3,
        prompt_seconds=None,
        generation_seconds=0.5,
    )
    line = _stats(unknown)
    assert "prompt: 4 tokens, speed unknown" in line and "generation: 3 tokens, 6.0 tokens/s" in line
    known = CompletionChunk(
        "",
        [],
        finish_reason="length",
        prompt_tokens=4,
        cached_tokens=0,
        completion_tokens=3,
        prompt_seconds=0.5,
        generation_seconds=0.5,
    )
    assert "prompt: 4 tokens, 8.0 tokens/s" in _stats(known)


def test_infill_timings_say_unknown_as_null() -> None:
    from langchain_starcoder.server.shapes import final_answer
    from langchain_starcoder.types import Completion

    completion = Completion(
        "x",
        [1],
        "length",
        prompt_tokens=4,
        cached_tokens=1,
        completion_tokens=1,
        prompt_seconds=None,
        generation_seconds=0.5,
    )
    timings = final_answer("tiny", completion, "x", False, 1)["timings"]
    assert timings["prompt_ms"] is None and timings["prompt_per_second"] is None
    assert timings["prompt_per_token_ms"] is None and timings["predicted_per_second"] == 2.0


def test_a_remote_wrapper_round_trips_through_langchain_serialization(tiny_path: Path) -> None:
    """LangChain writes every truthy field, defaults included (dtype "auto", timeout 60): loading that
    back is not "a local setting with base_url" nor "a remote setting without it"."""
    from langchain_core.load import dumpd, load

    for llm in (
        StarCoderLLM(
            base_url="http://127.0.0.1:1", model="tiny", tokenizer=str(tiny_path), timeout=7, deadline=30
        ),
        StarCoderLLM(model=str(tiny_path)),
    ):
        restored = load(dumpd(llm), valid_namespaces=["langchain_starcoder"], allowed_objects=[StarCoderLLM])
        assert (restored.base_url, restored.timeout, restored.deadline) == (
            llm.base_url,
            llm.timeout,
            llm.deadline,
        )


def test_the_local_engine_still_times_its_prefill(tiny_engine: StarCoderEngine) -> None:
    started = time.perf_counter()
    completion = tiny_engine.generate("def local_timing(x):\n" * 8, max_tokens=2)
    assert 0 < completion.prompt_seconds < time.perf_counter() - started
    assert (
        completion.prompt_tps
        == (completion.prompt_tokens - completion.cached_tokens) / completion.prompt_seconds
    )
