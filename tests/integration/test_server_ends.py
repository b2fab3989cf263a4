"""The server ends a middle where the code does (issue 31): ``/infill`` and ``/v1/completions`` with a
suffix stop decoding there and say so (``stop_type`` "middle_end"), take ``end`` ("none": off) and honour
llama.cpp's ``n_indent``; each answer equals ``engine.infill`` of the same hole (greedy)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.fim.request import FIMRequest
from langchain_starcoder.server import create_app
from langchain_starcoder.testing.servers import ServerThread

# A hole whose greedy middle goes on past its end on the tiny checkpoint (tests/unit/test_engine_ends.py).
PREFIX = "def walk(items):\n    result = 0\n    "
SUFFIX = "\n    return result\n\n\ndef main():\n    print(total([1, 2]))\n"
GREEDY = {"max_tokens": 160, "temperature": 0.0}


@pytest.fixture(scope="module")
def server(tiny_engine: StarCoderEngine) -> Iterator[str]:
    running = ServerThread(create_app(tiny_engine, model_name="tiny"))
    yield running.url
    running.stop()


def _engine(engine: StarCoderEngine, **fields: object):
    return engine.infill(FIMRequest(PREFIX, SUFFIX, file_path="m.py", **fields), **GREEDY)  # type: ignore[arg-type]


def _infill(server: str, **more: object) -> dict:
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "file_path": "m.py", "n_predict": 160, **more}
    response = httpx.post(f"{server}/infill", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def test_infill_stops_where_the_middle_ends(server: str, tiny_engine: StarCoderEngine) -> None:
    ended, free = _engine(tiny_engine), _engine(tiny_engine, end="none")
    assert ended.middle_end == "syntax" and len(ended.text) < len(free.text)
    got = _infill(server)
    assert (got["content"], got["stop_type"]) == (ended.text, "middle_end")
    assert got["tokens_predicted"] == ended.completion_tokens < free.completion_tokens
    off = _infill(server, end="none")
    assert off["content"] == free.text and off["stop_type"] != "middle_end"


def test_infill_stream_never_sends_text_past_the_end(server: str, tiny_engine: StarCoderEngine) -> None:
    want = _engine(tiny_engine).text
    body = {
        "input_prefix": PREFIX,
        "input_suffix": SUFFIX,
        "file_path": "m.py",
        "n_predict": 160,
        "stream": True,
    }
    shown, last = "", {}
    with httpx.stream("POST", f"{server}/infill", json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                last = json.loads(line[6:])
                shown += last.get("content", "")
                assert want.startswith(shown)
    assert shown == want and last["stop_type"] == "middle_end"


def test_n_indent_ends_before_a_line_indented_less_as_llama_cpp(
    server: str, tiny_engine: StarCoderEngine
) -> None:
    free = _engine(tiny_engine, end="none").text
    lines = free.split("\n")
    deepest = max(len(line) - len(line.lstrip(" \t")) for line in lines[1:] if line.strip())
    want = _engine(tiny_engine, end="none", min_indent=deepest + 1)
    assert want.middle_end == "indent" and len(want.text) < len(free)
    got = _infill(server, end="none", n_indent=deepest + 1)
    assert (got["content"], got["stop_type"]) == (want.text, "limit")


def test_v1_completions_with_a_suffix_ends_there_too(server: str, tiny_engine: StarCoderEngine) -> None:
    ended, free = _engine(tiny_engine), _engine(tiny_engine, end="none")
    body = {"prompt": PREFIX, "suffix": SUFFIX, "file_path": "m.py", **GREEDY}
    got = httpx.post(f"{server}/v1/completions", json=body, timeout=120).json()
    assert got["choices"][0]["text"] == ended.text and got["choices"][0]["finish_reason"] == "stop"
    assert got["usage"]["completion_tokens"] == ended.completion_tokens
    got = httpx.post(f"{server}/v1/completions", json={**body, "end": "none"}, timeout=120).json()
    assert got["choices"][0]["text"] == free.text


@pytest.mark.parametrize(
    ("field", "value"), [("end", "sometimes"), ("end", 3), ("n_indent", -1), ("n_indent", "4")]
)
def test_bad_end_fields_are_a_400(server: str, field: str, value: object) -> None:
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 4, field: value}
    response = httpx.post(f"{server}/infill", json=body, timeout=60)
    assert response.status_code == 400 and field in response.text, response.text
    assert _infill(server, n_predict=2)["tokens_predicted"] <= 2  # the server stays usable


def test_an_answer_cut_by_n_predict_says_so(server: str, tiny_engine: StarCoderEngine) -> None:
    """(issue 38) A middle cut by ``n_predict`` says "limit" (``/infill``) and "length" (``/v1/completions``);
    "middle_end" and "stop" only for one that ended where the code does. The greedy middle of this hole
    "completes" ``return ...`` at every cut if its unfinished last line is read as whole."""
    prefix, suffix = "def area(r):\n    return ", "\n\n\nprint(area(2))\n"
    seen = set()
    for n in range(1, 9):
        done = tiny_engine.infill(FIMRequest(prefix, suffix, file_path="m.py"), max_tokens=n, temperature=0.0)
        want = "middle_end" if done.middle_end == "syntax" else "limit"
        assert done.finish_reason == ("stop" if want == "middle_end" else "length")
        got = _infill(server, input_prefix=prefix, input_suffix=suffix, n_predict=n, temperature=0.0)
        assert (got["content"], got["stop_type"]) == (done.text, want)
        body = {"prompt": prefix, "suffix": suffix, "file_path": "m.py", "max_tokens": n, "temperature": 0.0}
        choice = httpx.post(f"{server}/v1/completions", json=body, timeout=120).json()["choices"][0]
        assert (choice["text"], choice["finish_reason"]) == (done.text, done.finish_reason)
        seen.add(want)
    assert seen == {"limit", "middle_end"}  # cut at first, then ended at the line's newline
