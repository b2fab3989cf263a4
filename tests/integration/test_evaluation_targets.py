"""``evaluate()`` through every path that serves a hole, on the tiny checkpoint and a small repository:
the engine in process, managed llama.cpp, this package's server over HTTP (``/infill`` as llama.vim sends
it, ``/v1/completions`` as Continue does), llama.cpp's own ``llama-server`` ``/infill``, and a remote vLLM.

Greedy predictions through our server equal the in-process engine's: the same prompt (its token count),
the same model. Each comparison runs on engines loaded for it: the prompt cache serves a prompt's start
(whose KV, reused, may differ from a fresh prefill's in the last bits: a near tie of the random weights
then goes the other way), so both sides must start with the same (empty) cache.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from langchain_starcoder import StarCoderEngine, cli
from langchain_starcoder.evaluation import (
    CompletionsEndpoint,
    EvalReport,
    Hole,
    InfillEndpoint,
    cut_holes,
    evaluate,
)
from langchain_starcoder.server import create_app
from langchain_starcoder.testing.gguf import LlamaServer, write_gguf
from langchain_starcoder.testing.repos import write_files
from langchain_starcoder.testing.servers import ServerThread, free_port
from langchain_starcoder.testing.vllm_server import VLLMServer

MAX_TOKENS = 6
#: What must be the same through two paths that run the same prompt on the same model.
SAME = (
    "task_id",
    "config",
    "raw",
    "prediction",
    "ended",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_files(tmp_path_factory.mktemp("eval-targets") / "repo")


@pytest.fixture(scope="module")
def holes(repo: Path) -> list[Hole]:
    return cut_holes(repo, n=4, seed=0)


def run_eval(target: Any, holes: list[Hole], configs: str, repo: Path, **more: Any) -> EvalReport:
    """An evaluation with its own repository index: the index remembers the files a hole was in, which
    orders the next holes' context, so each run starts from the same index."""
    return evaluate(target, holes, configs, repo=repo, max_tokens=MAX_TOKENS, **more)


def rows(report: EvalReport) -> list[tuple[Any, ...]]:
    return [tuple(getattr(r, name) for name in SAME) for r in report.records]


def same_predictions(
    here: StarCoderEngine, other: StarCoderEngine, holes: list[Hole], repo: Path
) -> EvalReport:
    """Asserts that ``other`` answers every hole, with ``here``'s greedy middles and counts; returns
    ``here``'s report. Both engines are closed after."""
    try:
        want = run_eval(here, holes, "psm,psm+repo", repo)
        got = run_eval(other, holes, "psm,psm+repo", repo)
    finally:
        other.close()
        here.close()
    assert all(r.error is None and r.first_token_s is not None for r in got.records)
    pick = ("task_id", "config", "raw", "prompt_tokens", "completion_tokens")
    assert [[getattr(r, k) for k in pick] for r in got.records] == [
        [getattr(r, k) for k in pick] for r in want.records
    ]
    return want


@pytest.fixture
def pair(tiny_path: Path) -> Iterator[tuple[StarCoderEngine, StarCoderEngine]]:
    """Two engines on the tiny checkpoint, both with an empty prompt cache: one here, one to serve."""
    here, there = StarCoderEngine.load(tiny_path), StarCoderEngine.load(tiny_path)
    yield here, there
    here.close()
    there.close()


def assert_timed(report: EvalReport) -> None:
    for r in report.records:
        assert r.error is None, r.error
        assert r.total_s is not None and r.total_s > 0
        assert r.prompt_tokens and r.completion_tokens is not None and r.cached_tokens is not None
        if r.raw:  # the time to the first token is the first streamed text's
            assert r.first_token_s is not None and 0 < r.first_token_s <= r.total_s


# --- this package's server over HTTP --------------------------------------------------------------


@pytest.mark.parametrize(("mode", "configs"), [("psm", "psm,psm+repo,psm+noend"), ("spm", "spm,spm+repo")])
def test_infill_gives_the_in_process_predictions(pair, holes, repo, mode, configs):
    """/infill, sent each hole as llama.vim does (its context files as input_extra): the same prompt and
    the same greedy middle as the engine in process, under every configuration of the server's layout."""
    here, there = pair
    want = run_eval(here, holes, configs, repo)
    running = ServerThread(create_app(there, model_name="tiny", fim_mode=mode))
    try:
        with InfillEndpoint(running.url, fim_mode=mode) as target:
            got = run_eval(target, holes, configs, repo)
    finally:
        running.stop()
    assert_timed(got)
    assert rows(got) == rows(want)
    assert len(got.records) == len(holes) * len(configs.split(","))
    assert got.metadata["target"] == "InfillEndpoint" and got.metadata["model"] == f"{running.url}/infill"
    with_repo = [r for r in got.records if r.config.endswith("+repo")]
    assert any(r.settings["context_files"] for r in with_repo)  # the context did travel as input_extra
    plain = {r.task_id: r.prompt_tokens for r in got.records if r.config == mode}
    assert all(r.prompt_tokens > plain[r.task_id] for r in with_repo if r.settings["context_files"])


def test_completions_gives_the_in_process_predictions_and_refuses_repo_context(pair, holes, repo):
    """/v1/completions with suffix, as Continue sends a hole: the in-process predictions; a +repo
    configuration (no field carries context files) is an error per hole, and the others go on."""
    here, there = pair
    want = run_eval(here, holes, "psm,psm+noend", repo)
    running = ServerThread(create_app(there, model_name="tiny"))
    try:
        with CompletionsEndpoint(running.url) as target:
            got = run_eval(target, holes, "psm,psm+noend", repo)
            refused = run_eval(target, holes[:2], "psm+repo,psm", repo)
    finally:
        running.stop()
    assert_timed(got)
    assert rows(got) == rows(want)
    assert [r.error is None for r in refused.records] == [False, True] * 2
    assert all("no field for context files" in r.error for r in refused.records if r.config == "psm+repo")


def test_a_layout_the_server_does_not_use_is_an_error_per_hole(tiny_engine, holes, repo):
    running = ServerThread(create_app(tiny_engine, model_name="tiny"))  # lays holes out as psm
    try:
        with InfillEndpoint(running.url) as target:
            report = run_eval(target, holes[:2], "psm,spm", repo)
    finally:
        running.stop()
    psm = [r for r in report.records if r.config == "psm"]
    spm = [r for r in report.records if r.config == "spm"]
    assert all(r.error is None and r.completion_tokens for r in psm)
    assert all("lays holes out as psm" in r.error and "--fim-mode spm" in r.error for r in spm)


@pytest.mark.parametrize("fault", ["refused", "unauthorized", "no endpoint"])
def test_a_failing_server_is_an_error_in_every_record_and_nothing_is_raised(tiny_engine, holes, repo, fault):
    """A dead server, a missing key, a wrong address: every record says so; the evaluation ends, and
    the same target with what was missing given completes every hole."""
    running = ServerThread(create_app(tiny_engine, model_name="tiny", api_key="k3y"))
    try:
        url, key, expected = {
            "refused": (f"http://127.0.0.1:{free_port()}", "k3y", "could not be reached"),
            "unauthorized": (running.url, None, "Give the server's API key"),
            "no endpoint": (f"{running.url}/nope", "k3y", "answered 404 to /nope/"),
        }[fault]
        with InfillEndpoint(url, api_key=key) as target:
            report = run_eval(target, holes, "psm,psm+repo", repo)
        assert len(report.records) == len(holes) * 2
        assert all(r.error is not None and expected in r.error for r in report.records), report.records[0]
        assert not report.metadata.get("interrupted")
        with InfillEndpoint(running.url, api_key="k3y") as target:
            assert all(r.error is None for r in run_eval(target, holes[:1], "psm,psm+repo", repo).records)
    finally:
        running.stop()


def test_a_server_still_loading_its_model_is_asked_again(tiny_path, holes, repo):
    """``serve`` answers 503 while its model loads: the endpoint asks again, and no hole fails for it."""

    def slow() -> StarCoderEngine:
        time.sleep(2)
        return StarCoderEngine.load(tiny_path)

    running = ServerThread(create_app(slow, model_name="tiny"))
    try:
        assert httpx.get(f"{running.url}/health", timeout=10).status_code == 503
        with InfillEndpoint(running.url) as target:
            report = run_eval(target, holes[:1], "psm+repo,psm", repo)
    finally:
        running.stop()
    assert [r.error for r in report.records] == [None, None]
    assert all(r.completion_tokens for r in report.records)


def test_ctrl_c_mid_stream_closes_the_request_and_keeps_what_is_done(tiny_engine, holes, repo):
    """Ctrl-C in the middle of a streamed answer: the report holds the completions done, the HTTP
    stream is closed at once (not left open with the server generating), and the server serves on."""
    streams: list[Any] = []

    class Interrupted:  # the endpoint, with Ctrl-C pressed after the second completion's first chunk
        def __init__(self, inner: InfillEndpoint) -> None:
            self.inner = inner

        def count_tokens(self, text: str) -> int:
            return self.inner.count_tokens(text)

        def stream_infill(self, request: Any, suffix: str = "", **settings: Any) -> Any:
            stream = self.inner.stream_infill(request, suffix, **settings)
            streams.append(stream)
            if len(streams) < 2:
                return stream

            def pressed() -> Any:  # (closing it closes the endpoint's stream, as a wrapper should)
                try:
                    yield next(stream)
                    raise KeyboardInterrupt
                finally:
                    stream.close()

            return pressed()

    running = ServerThread(create_app(tiny_engine, model_name="tiny"))
    try:
        with InfillEndpoint(running.url) as target:
            report = evaluate(Interrupted(target), holes, "psm,psm+noend", repo=repo, max_tokens=400)
            assert report.metadata["interrupted"] is True
            assert [r.config for r in report.records] == ["psm"]
            assert streams[1].gi_frame is None  # closed: its response (and connection) with it
            again = run_eval(target, holes[:2], "psm", repo)
    finally:
        running.stop()
    assert all(r.error is None for r in again.records)


def test_eval_cli_through_the_servers_infill(capsys, tiny_path, repo, tmp_path):
    """``eval --base-url URL --endpoint infill``: the in-process predictions, from a server's /infill."""
    argv = ["eval", str(repo), "--holes", "3", "--configs", "psm,psm+repo", "--max-tokens", str(MAX_TOKENS)]
    assert cli.main([*argv, "--model", str(tiny_path), "--out", str(tmp_path / "here.json")]) == 0
    engine = StarCoderEngine.load(tiny_path)
    running = ServerThread(create_app(engine, model_name="tiny"))
    try:
        remote = ["--base-url", running.url, "--endpoint", "infill", "--tokenizer", str(tiny_path)]
        remote += ["--out", str(tmp_path / "there.json")]  # (--tokenizer: the context's counts made here)
        code = cli.main([*argv, *remote])
    finally:
        running.stop()
        engine.close()
    _, err = capsys.readouterr()
    assert code == 0, err
    assert f"Completing through {running.url}/infill" in err
    here, there = (json.loads((tmp_path / n).read_text()) for n in ("here.json", "there.json"))
    assert there["metadata"]["endpoint"] == "infill"
    assert [r["error"] for r in there["records"]] == [None] * 6
    pick = ("task_id", "config", "prediction", "prompt_tokens")
    assert [[r[k] for k in pick] for r in there["records"]] == [[r[k] for k in pick] for r in here["records"]]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--endpoint", "infill"], "--endpoint infill is a server's: give its --base-url URL"),
        (["--endpoint", "completions", "--base-url", "http://127.0.0.1:9", "--max-prompt-tokens", "64"], ""),
        (["--endpoint", "infill", "--base-url", "http://127.0.0.1:9", "--backend", "llama.cpp"], ""),
    ],
)
def test_eval_cli_endpoint_errors_are_one_line_exit_2(capsys, repo, extra, expected):
    code = cli.main(["eval", str(repo), "--holes", "2", *extra])
    _, err = capsys.readouterr()
    assert code == 2
    lines = err.strip().splitlines()
    assert lines[-1].startswith("langchain-starcoder: error: ") and expected in lines[-1]
    if not expected:
        assert "cannot go to --endpoint" in lines[-1] and extra[-2] in lines[-1]


# --- llama.cpp: managed, and its own llama-server --------------------------------------------------


def test_managed_llama_cpp_gives_the_in_process_predictions(clean_path, gguf_cache, holes, repo):
    """``backend="llama.cpp"``: our prompts, run by a llama-server this engine manages; the same greedy
    middles as MLX on the same (cleaned, float32) weights, prompts inside the sliding window."""
    here = StarCoderEngine.load(clean_path)
    # float32 throughout and one thread: llama.cpp's float16 attention, and a thread count that follows the
    # machine's load, flipped a near-tie of the random weights once (measured: 1e-5 of MLX with these)
    exact = {"threads": 1, "server_args": ("-fa", "off", "-ctk", "f32", "-ctv", "f32")}
    managed = StarCoderEngine.load(clean_path, backend="llama.cpp", **exact)
    want = same_predictions(here, managed, holes, repo)
    assert all(r.prompt_tokens < 512 for r in want.records)  # inside the window llama.cpp ignores


def test_llama_servers_own_infill(clean_path, holes, repo, tmp_path):
    """llama.cpp's llama-server /infill, held to the holes as our server is: its own FIM layout (so its
    own middles), its counts and timings read from its last answer, the context as input_extra; and
    each streamed middle is the one it answers to the same request unstreamed."""
    with LlamaServer(write_gguf(clean_path, tmp_path / "tiny-f32.gguf")) as server:
        with InfillEndpoint(server.url) as target:
            report = run_eval(target, holes, "psm,psm+repo", repo)
            assert target.fresh_documents is False  # llama-server's id_slot is one of its slots
        assert_timed(report)
        assert all(0 < r.completion_tokens <= MAX_TOKENS for r in report.records)
        by_hole = {r.task_id: r for r in report.records if r.config == "psm"}
        for r in report.records:
            if r.config == "psm+repo" and r.settings["context_files"]:
                assert r.prompt_tokens > by_hole[r.task_id].prompt_tokens
        for hole in holes[:2]:
            cut = hole.prefix.rfind("\n") + 1
            body = {
                "input_prefix": hole.prefix[:cut],
                "prompt": hole.prefix[cut:],
                "input_suffix": hole.suffix,
                "file_path": hole.file,
                "n_predict": MAX_TOKENS,
                "temperature": 0.0,
                "cache_prompt": False,
            }
            answer = httpx.post(f"{server.url}/infill", json=body, timeout=60).json()
            assert answer["content"] == by_hole[hole.task_id].raw


# --- vLLM (the session's server: tests/conftest.py) ------------------------------------------------


@pytest.mark.vllm
def test_remote_vllm_gives_the_in_process_predictions(vllm_server: VLLMServer, vllm_path: Path, holes, repo):
    """``StarCoderEngine.connect`` to vLLM: our prompts as token ids; the greedy middles of MLX on the
    same weights. (vLLM's /v1/completions takes no suffix, so it has no editor path to hold.)"""
    here = StarCoderEngine.load(vllm_path)
    remote = StarCoderEngine.connect(vllm_server.url, model="tiny", tokenizer=vllm_path, timeout=120)
    same_predictions(here, remote, holes, repo)
