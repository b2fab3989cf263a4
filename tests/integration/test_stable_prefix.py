"""The hole's prefix keeps its start while llama.vim's window of the lines before the cursor slides down the
file (stable_prefix.py): a real uvicorn server over the tiny checkpoint, llama.vim's /infill fields, greedy.
Each test clears the engine's prompt cache and uses a slot of its own (the server remembers per document)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sequences import shared_prefix

from langchain_starcoder.fim import build as fim
from langchain_starcoder.fim.request import ContextFile, FIMRequest
from langchain_starcoder.server import create_app
from langchain_starcoder.testing.servers import ServerThread

LINES = [f"value_{i} = compute({i}, {i % 5})\n" for i in range(60)]
SUFFIX = "\n\nprint(total)\n"
EXTRA = [{"text": "def compute(a, b):\n    return a * b\n", "filename": "src/ops.py"}]
FILES = (ContextFile("src/ops.py", EXTRA[0]["text"]),)
N = 8


def lines(start: int, stop: int) -> str:
    return "".join(LINES[start:stop])


@pytest.fixture(scope="module", params=["psm", "spm"])
def served(request, tiny_engine) -> Iterator[tuple[str, str]]:
    running = ServerThread(create_app(tiny_engine, fim_mode=request.param))
    yield running.url, request.param
    running.stop()


def _infill(url: str, input_prefix: str, cursor: str, slot: int, **more: Any) -> dict[str, Any]:
    body = {
        "id_slot": slot,
        "input_prefix": input_prefix,
        "prompt": cursor,
        "input_suffix": SUFFIX,
        "input_extra": EXTRA,
        "n_predict": N,
        "temperature": 0.0,
        "samplers": ["top_k", "top_p", "infill"],
        "stream": False,
        "cache_prompt": True,
        **more,
    }
    reply = httpx.post(f"{url}/infill", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def _prompt(engine: Any, prefix: str, mode: str, max_tokens: int = N) -> list[int]:
    return engine.fim_prompt(FIMRequest(prefix, SUFFIX, context_files=FILES, mode=mode), max_tokens).token_ids


def test_a_window_slid_by_a_line_starts_where_the_last_prompt_did_and_is_served_from_the_cache(
    served, tiny_engine
):
    """The newline drops the window's first line; the server puts it back: the prompt is the one a larger
    window gives, its answer is engine.infill's on it, and the cache serves it up to the typed text."""
    url, mode = served
    tiny_engine.clear_cache()
    _infill(url, lines(10, 18), "total = ", slot=1)
    got = _infill(url, lines(11, 18) + "total = 1\n", "", slot=1)
    longer = lines(10, 18) + "total = 1\n"
    prompt = _prompt(tiny_engine, longer, mode)
    assert got["tokens_evaluated"] == len(prompt) and not got["truncated"]
    alone = tiny_engine.generate(
        FIMRequest(longer, SUFFIX, context_files=FILES, mode=mode), max_tokens=N, temperature=0.0
    )
    assert got["content"] == alone.text
    common = shared_prefix(_prompt(tiny_engine, lines(10, 18) + "total = ", mode), prompt)
    assert got["tokens_cached"] >= common - 1
    # The whole window before the typed line came from the cache (in PSM the suffix follows it).
    window_tokens = len(tiny_engine.encode(lines(10, 18)))
    assert got["tokens_cached"] >= window_tokens
    prefilled = got["tokens_evaluated"] - got["tokens_cached"]
    after_typed = len(prompt) - common
    assert prefilled <= after_typed + 1
    if mode == "spm":  # the suffix comes first: only the typed end of the prefix is prefilled
        assert prefilled <= len(tiny_engine.encode("1\n")) + 2


def test_the_window_as_sent_with_the_opt_out(tiny_engine):
    tiny_engine.clear_cache()
    running = ServerThread(create_app(tiny_engine, fim_mode="spm", stable_prefix=False))
    try:
        _infill(running.url, lines(10, 18), "total = ", slot=0)
        got = _infill(running.url, lines(11, 18) + "total = 1\n", "", slot=0)
    finally:
        running.stop()
    window = lines(11, 18) + "total = 1\n"
    assert got["tokens_evaluated"] == len(_prompt(tiny_engine, window, "spm"))
    # The prefix changed from its first line: all of it is prefilled again (bar the tokens its first line
    # shares with the old first line's start).
    assert got["tokens_evaluated"] - got["tokens_cached"] >= len(
        tiny_engine.encode(lines(12, 18) + "total = 1\n")
    )


@pytest.mark.parametrize(
    ("window", "more"),
    [
        (lines(11, 14) + "value_14 = 0\n" + lines(15, 18) + "total = 1\n", {}),  # an edit inside the window
        ("value_11 = 0\n" + lines(12, 18) + "total = 1\n", {}),  # the new window's first line edited
        (lines(11, 18) + "total = 1\n", {"id_slot": 5}),  # another document: another slot
        (lines(11, 18) + "total = 1\n", {"file_path": "src/other.py"}),  # another file
    ],
    ids=["edit inside", "first line edited", "another slot", "another file"],
)
def test_texts_that_disagree_or_another_document_are_not_extended(served, tiny_engine, window, more):
    url, mode = served
    _infill(url, lines(10, 18), "total = ", slot=2)
    got = _infill(url, window, "", slot=2, **more)
    request = FIMRequest(window, SUFFIX, context_files=FILES, mode=mode, file_path=more.get("file_path"))
    assert got["tokens_evaluated"] == len(tiny_engine.fim_prompt(request, N).token_ids)
    assert got["content"] == tiny_engine.generate(request, max_tokens=N, temperature=0.0).text


def test_a_prefix_the_budget_would_cut_starts_again_from_the_window_in_one_step(served, tiny_engine):
    """A longer prefix that the FIM builder would cut from its start is not used: the request runs as sent
    and its window becomes the anchor, so the next slide extends from there."""
    url, mode = served
    first = lines(0, 40)
    _infill(url, first, "total = ", slot=3)
    window = lines(20, 40) + "total = 1\n"
    longer = lines(0, 40) + "total = 1\n"
    fits = len(_prompt(tiny_engine, window, mode, 1))
    budget = tiny_engine.context_window - (fits + len(_prompt(tiny_engine, longer, mode, 1))) // 2
    cut = tiny_engine.fim_prompt(FIMRequest(longer, SUFFIX, context_files=FILES, mode=mode), budget)
    assert cut.prefix_chars_kept < len(longer)  # (the test's premise: the longer prefix would be cut)
    got = _infill(url, window, "", slot=3, n_predict=budget, t_max_predict_ms=200)
    assert got["tokens_evaluated"] == len(_prompt(tiny_engine, window, mode, budget)) and not got["truncated"]
    nxt = lines(21, 40) + "total = 1\ncount = 2\n"
    got = _infill(url, nxt, "", slot=3)
    assert got["tokens_evaluated"] == len(_prompt(tiny_engine, lines(20, 21) + nxt, mode))  # from the window


def test_completions_with_a_suffix_and_a_file_path_keep_the_prefix_start_too(
    served, tiny_engine, monkeypatch
):
    url, mode = served
    tiny_engine.clear_cache()
    body = {"suffix": SUFFIX, "file_path": "src/values.py", "max_tokens": N, "temperature": 0}
    httpx.post(f"{url}/v1/completions", json={**body, "prompt": lines(30, 38) + "total = "}, timeout=120)
    window = lines(31, 38) + "total = 1\n"
    built = []
    build = fim.build_fim_prompt
    monkeypatch.setattr(fim, "build_fim_prompt", lambda *a, **k: built.append(1) or build(*a, **k))
    got = httpx.post(f"{url}/v1/completions", json={**body, "prompt": window}, timeout=120).json()
    assert len(built) == 1  # the extended prompt, built to see that it cuts nothing, is the one run
    monkeypatch.undo()
    longer = FIMRequest(lines(30, 31) + window, SUFFIX, file_path="src/values.py", mode=mode)
    assert got["usage"]["prompt_tokens"] == len(tiny_engine.fim_prompt(longer, N).token_ids)
    assert got["choices"][0]["text"] == tiny_engine.generate(longer, max_tokens=N, temperature=0.0).text
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(tiny_engine.encode(lines(30, 38)))


# --- another user's text (issue 38, item 3) -------------------------------------------------------------

SECRET_PREFIX = (
    "import os\nAWS_SECRET_ACCESS_KEY = 'wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY'\n"
    "DB_PASSWORD = 'hunter2-prod'\n\n\ndef main("
)
SHORT_PREFIX = "\n\ndef main("


@pytest.mark.parametrize(
    "keys", [("alice-key", "bob-key"), ("team-key", "team-key")], ids=["two keys", "one key"]
)
def test_a_short_prefix_for_the_same_file_gets_none_of_another_users_text(tiny_engine, keys):
    """The review's case: user A's prefix for app.py holds secrets; user B, on another connection, sends
    two blank lines and ``def main(`` for app.py. B's prompt is B's text alone, and B's cached count
    says nothing of A's prompt: with another key (another tenant) it is 0, with the same key (one tenant,
    one cache) at most what B's own prompt shares with A's."""
    tiny_engine.clear_cache()
    one_tenant = keys[0] == keys[1]
    running = ServerThread(create_app(tiny_engine, api_key=keys[0] if one_tenant else list(keys)))

    def infill(prefix: str, key: str) -> dict[str, Any]:
        body = {"input_prefix": prefix, "input_suffix": SUFFIX, "file_path": "app.py", "n_predict": N}
        reply = httpx.post(
            f"{running.url}/infill", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=120
        )
        assert reply.status_code == 200, reply.text
        return reply.json()

    try:
        infill(SECRET_PREFIX, keys[0])
        got = infill(SHORT_PREFIX, keys[1])
    finally:
        running.stop()
    alone = FIMRequest(SHORT_PREFIX, SUFFIX, file_path="app.py")
    prompt = tiny_engine.fim_prompt(alone, N).token_ids
    assert got["tokens_evaluated"] == len(prompt)  # none of A's lines were put back above B's
    assert got["content"] == tiny_engine.generate(alone, max_tokens=N, temperature=0.0).text
    secret_prompt = tiny_engine.fim_prompt(FIMRequest(SECRET_PREFIX, SUFFIX, file_path="app.py"), N).token_ids
    assert got["tokens_cached"] <= (shared_prefix(secret_prompt, prompt) if one_tenant else 0)
