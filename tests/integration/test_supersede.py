"""While you type: a newer request for the same document supersedes the older one (the client keeps its
connection open), warm-up requests, the FIM layout of the server, context files in a stable order and the
/infill prompt built once. A real uvicorn server over the tiny checkpoint; the engine's worker is held at
the first token of the first request, so "still running" is an event, not a race."""

from __future__ import annotations

import concurrent.futures
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from langchain_starcoder.fim import build as fim
from langchain_starcoder.fim.request import ContextFile, FIMRequest
from langchain_starcoder.server import create_app
from langchain_starcoder.testing.servers import ServerThread

PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"
EXTRA = [
    {"text": "def sub(a, b):\n    return a - b\n", "time": [1732960000, 123456], "filename": "src/ops.py"},
    {"text": "import math\n", "time": [1732960001, 654321], "filename": "src/util.py"},
]
FILES = [ContextFile(e["filename"], e["text"]) for e in EXTRA]
N = 8
LONG = 64  # the older request's n_predict: it is cancelled long before


@pytest.fixture(scope="module")
def server(tiny_engine) -> Iterator[str]:
    running = ServerThread(create_app(tiny_engine, model_name="tiny"))
    yield running.url
    running.stop()


class Held:
    """Every generation submitted from now on; the first one's first token waits for ``release``, so the
    next requests find it running. ``tokens[i]``: the ids the i-th generation's sink was given."""

    def __init__(self, engine: Any, monkeypatch: pytest.MonkeyPatch):
        self.generations: list[Any] = []
        self.tokens: list[list[int]] = []
        self.gate = threading.Event()
        submit = engine.backend.submit

        def held(generations: list) -> Any:
            for generation in generations:
                self._watch(generation, first=not self.generations)
                self.generations.append(generation)
            return submit(generations)

        monkeypatch.setattr(engine.backend, "submit", held)

    def _watch(self, generation: Any, first: bool) -> None:
        seen: list[int] = []
        self.tokens.append(seen)
        token = generation.sink.token

        def counted(token_id: int) -> bool:
            if first and not seen:
                self.gate.wait(60)
            seen.append(token_id)
            return token(token_id)

        generation.sink.token = counted

    def wait(self, condition: Any, what: str) -> None:
        for _ in range(3000):
            if condition():
                return
            threading.Event().wait(0.01)
        raise AssertionError(what)

    def wait_started(self) -> None:
        self.wait(lambda: self.generations and self.generations[0].sink._started, "the first did not start")

    def release(self) -> None:
        self.gate.set()


def _infill_body(prefix: str, **more: Any) -> dict[str, Any]:
    """llama.vim's /infill fields (its FIM request), greedy."""
    return {
        "id_slot": 0,
        "input_prefix": prefix,
        "input_suffix": SUFFIX,
        "input_extra": EXTRA,
        "prompt": "",
        "n_predict": N,
        "top_k": 40,
        "top_p": 0.99,
        "samplers": ["top_k", "top_p", "infill"],
        "stream": False,
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 3000,
        **more,
    }


def _post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url, json=body, timeout=120)


def _alone(engine: Any, prefix: str, suffix: str = SUFFIX, **more: Any) -> Any:
    """What a lone greedy request gives (the engine's own infill, no server)."""
    request = FIMRequest(prefix, suffix, context_files=tuple(more.pop("files", FILES)), **more)
    return engine.generate(request, max_tokens=N, temperature=0.0)


def _stream_events(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    with httpx.stream("POST", url, json=body, timeout=120) as reply:
        assert reply.status_code == 200, reply.read()
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def test_a_newer_infill_for_the_same_slot_cancels_the_older_one_still_running(
    server, tiny_engine, monkeypatch
):
    """llama.vim keeps its connection: the newer request (same client, id_slot 0) cancels the older one at
    its next step; the older answers as cancelled, the newer exactly as alone."""
    expected = _alone(tiny_engine, PREFIX + "return a")
    held = Held(tiny_engine, monkeypatch)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        older = pool.submit(_post, f"{server}/infill", _infill_body(PREFIX + "ret", n_predict=LONG))
        held.wait_started()
        newer = pool.submit(_post, f"{server}/infill", _infill_body(PREFIX + "return a"))
        held.wait(
            lambda: held.generations[0].cancelled.is_set(), "the newer request did not cancel the older"
        )
        held.release()
        old, new = older.result(timeout=120), newer.result(timeout=120)
    assert old.status_code == 200 and new.status_code == 200
    got = old.json()
    assert got["stop_type"] == "cancelled" and got["stop"] is True
    assert "content" not in got  # llama.vim keeps no answer without content for that text
    assert got["tokens_predicted"] < LONG
    assert len(held.tokens[0]) == 1  # the backend stopped at its next step: the held token was the last
    assert new.json()["content"] == expected.text and new.json()["stop_type"] != "cancelled"
    assert len(held.tokens[1]) == expected.completion_tokens


def test_a_newer_completion_with_a_suffix_cancels_the_older_stream(server, tiny_engine, monkeypatch):
    """/v1/completions with suffix and file_path: the older is streamed and its client stays; its last
    event says cancelled, the newer's text equals a lone request's."""
    expected = _alone(tiny_engine, PREFIX + "return", files=(), file_path="src/add.py")
    held = Held(tiny_engine, monkeypatch)
    old_body = {
        "prompt": PREFIX,
        "suffix": SUFFIX,
        "file_path": "src/add.py",
        "max_tokens": LONG,
        "temperature": 0,
        "stream": True,
    }
    new_body = {**old_body, "prompt": PREFIX + "return", "max_tokens": N, "stream": False}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        older = pool.submit(_stream_events, f"{server}/v1/completions", old_body)
        held.wait_started()
        newer = pool.submit(_post, f"{server}/v1/completions", new_body)
        held.wait(
            lambda: held.generations[0].cancelled.is_set(), "the newer request did not cancel the older"
        )
        held.release()
        events, new = older.result(timeout=120), newer.result(timeout=120)
    finishes = [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert finishes == ["cancelled"]
    assert len(held.tokens[0]) == 1 < LONG
    assert new.json()["choices"][0]["text"] == expected.text
    assert new.json()["choices"][0]["finish_reason"] != "cancelled"


@pytest.mark.parametrize(
    ("older_more", "newer_more"),
    [({"file_path": "src/a.py"}, {"file_path": "src/b.py"}), ({"id_slot": 0}, {"id_slot": 1})],
    ids=["another file", "another slot"],
)
def test_a_request_for_another_document_is_not_superseded(
    server, tiny_engine, monkeypatch, older_more, newer_more
):
    older_alone = _alone(tiny_engine, PREFIX, file_path=older_more.get("file_path"))
    held = Held(tiny_engine, monkeypatch)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        older = pool.submit(_post, f"{server}/infill", _infill_body(PREFIX, **older_more))
        held.wait_started()
        newer = pool.submit(_post, f"{server}/infill", _infill_body(PREFIX + "return", **newer_more))
        held.wait(lambda: len(held.generations) == 2, "the newer request was not submitted")
        assert not held.generations[0].cancelled.is_set()
        held.release()
        old, new = older.result(timeout=120), newer.result(timeout=120)
    assert old.json()["content"] == older_alone.text and old.json()["stop_type"] != "cancelled"
    assert new.json()["stop_type"] != "cancelled"


def _keyed(url: str, body: dict[str, Any], key: str) -> httpx.Response:
    return httpx.post(url, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120)


@pytest.mark.parametrize(
    ("newer_key", "names", "cancels"),
    [
        ("bob", {"file_path": "main.py"}, False),  # the review's case: another user, the same file
        ("bob", {"id_slot": 0}, False),  # a request that names only a slot claims it in its tenant only
        ("alice", {"file_path": "main.py"}, True),  # the same tenant on another connection: as today
    ],
    ids=["another key, same file", "another key, same slot", "same key"],
)
def test_a_request_supersedes_only_its_own_tenants_request(
    tiny_engine, monkeypatch, newer_key, names, cancels
):
    """While A's /infill for main.py runs, B's ``{"input_prefix": "x = 1\n", "file_path": "main.py",
    "n_predict": 2}`` on another connection with another key leaves it be; with A's own key it cancels it."""
    running = ServerThread(create_app(tiny_engine, api_key=["alice", "bob"]))
    try:
        older_body = {**_infill_body(PREFIX, n_predict=LONG if cancels else N), "id_slot": None, **names}
        newer_body = {"input_prefix": "x = 1\n", "n_predict": 2, **names}
        held = Held(tiny_engine, monkeypatch)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            older = pool.submit(_keyed, f"{running.url}/infill", older_body, "alice")
            held.wait_started()
            newer = pool.submit(_keyed, f"{running.url}/infill", newer_body, newer_key)
            if cancels:
                held.wait(
                    lambda: held.generations[0].cancelled.is_set(), "the newer did not cancel the older"
                )
            else:
                held.wait(lambda: len(held.generations) == 2, "the newer request was not submitted")
                assert not held.generations[0].cancelled.is_set()  # (checked while the older still runs)
            held.release()
            old, new = older.result(timeout=120), newer.result(timeout=120)
    finally:
        running.stop()
    assert old.status_code == 200 and new.status_code == 200, (old.text, new.text)
    assert new.json()["stop_type"] != "cancelled"
    if cancels:
        assert old.json()["stop_type"] == "cancelled" and len(held.tokens[0]) == 1
    else:
        alone = _alone(tiny_engine, PREFIX, file_path=names.get("file_path"))
        assert old.json()["stop_type"] != "cancelled" and old.json()["content"] == alone.text


def test_with_supersession_off_the_older_runs_to_its_end(tiny_engine, monkeypatch):
    """Today's behaviour (``supersede=False``, ``serve --no-supersede``): the newer waits for the older."""
    running = ServerThread(create_app(tiny_engine, supersede=False))
    try:
        older_alone = _alone(tiny_engine, PREFIX)
        held = Held(tiny_engine, monkeypatch)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            older = pool.submit(_post, f"{running.url}/infill", _infill_body(PREFIX))
            held.wait(
                lambda: held.generations and held.generations[0].sink._started, "the older did not start"
            )
            newer = pool.submit(_post, f"{running.url}/infill", _infill_body(PREFIX + "return"))
            held.wait(lambda: len(held.generations) == 2, "the newer request was not submitted")
            assert not held.generations[0].cancelled.is_set()
            held.release()
            old = older.result(timeout=120)
            newer.result(timeout=120)
        assert (
            old.json()["content"] == older_alone.text and len(held.tokens[0]) == older_alone.completion_tokens
        )
    finally:
        running.stop()


# --- warm-up -------------------------------------------------------------------------------------------


def test_a_warm_up_prefills_the_next_requests_prefix_and_answers_no_text(tiny_engine):
    """``max_tokens`` 0 (/v1/completions) and ``n_predict`` 0 (/infill): the prompt is prefilled and kept,
    nothing is answered; the next keystroke's request then prefills only its changed end (SPM)."""
    tiny_engine.clear_cache()
    running = ServerThread(create_app(tiny_engine, fim_mode="spm"))
    try:
        body = {"prompt": PREFIX + "ret", "suffix": SUFFIX, "file_path": "src/add.py", "max_tokens": 0}
        warm = _post(f"{running.url}/v1/completions", body)
        assert warm.status_code == 200, warm.text
        assert warm.json()["choices"][0]["text"] == "" and warm.json()["usage"]["completion_tokens"] == 0
        prompt_tokens = warm.json()["usage"]["prompt_tokens"]
        body.update(prompt=PREFIX + "return", max_tokens=N, temperature=0)
        got = _post(f"{running.url}/v1/completions", body).json()
        cached = got["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert got["usage"]["prompt_tokens"] - cached <= 3  # the typed end of the prefix, not the suffix
        assert cached >= prompt_tokens - 2
        assert (
            got["choices"][0]["text"]
            == _alone(tiny_engine, PREFIX + "return", files=(), mode="spm", file_path="src/add.py").text
        )
        # /infill's warm-up (llama.vim's ring update) answers nothing either, and warms the same way.
        warm = _post(
            f"{running.url}/infill", _infill_body(PREFIX + "x = ", n_predict=0, response_fields=[""])
        )
        assert warm.status_code == 200 and warm.json() == {}
        got = _post(f"{running.url}/infill", _infill_body(PREFIX + "x = 1")).json()
        assert got["tokens_evaluated"] - got["tokens_cached"] <= 3
    finally:
        running.stop()


def test_a_warm_up_never_cancels_an_answer_but_a_request_cancels_a_warm_up(server, tiny_engine, monkeypatch):
    held = Held(tiny_engine, monkeypatch)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answer = pool.submit(_post, f"{server}/infill", _infill_body(PREFIX))
        held.wait(lambda: held.generations and held.generations[0].sink._started, "the answer did not start")
        warm = pool.submit(_post, f"{server}/infill", _infill_body(PREFIX + "r", n_predict=0))
        held.wait(lambda: len(held.generations) == 2, "the warm-up was not submitted")
        assert not held.generations[0].cancelled.is_set()  # the warm-up waits its turn
        newer = pool.submit(_post, f"{server}/infill", _infill_body(PREFIX + "re"))
        held.wait(lambda: held.generations[1].cancelled.is_set(), "the request did not cancel the warm-up")
        held.release()
        results = [f.result(timeout=120).json() for f in (answer, warm, newer)]
    assert [r["stop_type"] for r in results] == ["cancelled", "cancelled", results[2]["stop_type"]]
    assert results[2]["stop_type"] != "cancelled"


# --- the server's FIM layout, the context's order, the prompt built once ----------------------------


@pytest.mark.parametrize("mode", ["psm", "spm"])
def test_each_fim_mode_answers_its_own_exact_greedy_output(tiny_engine, mode):
    running = ServerThread(create_app(tiny_engine, fim_mode=mode))
    try:
        got = _post(f"{running.url}/infill", _infill_body(PREFIX)).json()
        expected = _alone(tiny_engine, PREFIX, mode=mode)
        assert got["content"] == expected.text
        prompt = tiny_engine.fim_prompt(FIMRequest(PREFIX, SUFFIX, context_files=tuple(FILES), mode=mode), N)
        assert got["tokens_evaluated"] == len(prompt.token_ids) and prompt.mode == mode
    finally:
        running.stop()


def test_context_files_keep_their_order_between_keystrokes(server, tiny_engine, backend_spy):
    """A client (or the repository index) that sends the same chunks in another order at the next
    keystroke gets them in the order of the last request: the cache's common prefix covers them."""
    spy = backend_spy(tiny_engine)
    body = _infill_body(PREFIX, id_slot=3, response_fields=["content", "tokens_cached", "input_extra_used"])
    _post(f"{server}/infill", body)
    extra = [{**EXTRA[1]}, {**EXTRA[0]}, {"text": "x = 1\n", "filename": "src/x.py"}]
    got = _post(f"{server}/infill", {**body, "input_prefix": PREFIX + "r", "input_extra": extra}).json()
    first, second = spy.take()
    files = [ContextFile(e["filename"], e["text"]) for e in [EXTRA[0], EXTRA[1], extra[2]]]
    laid_out = tiny_engine.fim_prompt(FIMRequest(PREFIX + "r", SUFFIX, context_files=tuple(files)), N)
    assert second == laid_out.token_ids  # the two known chunks first, as before; the new one after
    shared = tiny_engine.fim_prompt(FIMRequest("", "", context_files=tuple(FILES)), N).token_ids[:-4]
    assert first[: len(shared)] == second[: len(shared)] == shared
    assert got["tokens_cached"] >= len(shared)
    assert got["input_extra_used"] == ["whole", "whole", "whole"]  # in the client's order


def test_an_infill_prompt_is_built_once(server, monkeypatch):
    built = []
    build = fim.build_fim_prompt
    monkeypatch.setattr(fim, "build_fim_prompt", lambda *a, **k: built.append(1) or build(*a, **k))
    assert _post(f"{server}/infill", _infill_body(PREFIX)).status_code == 200
    assert len(built) == 1
