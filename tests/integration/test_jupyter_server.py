"""The Jupyter server extension over HTTP: a real ``jupyter lab`` on 127.0.0.1 with its own token and the
tiny checkpoint, asked ``POST /langchain-starcoder/complete`` as the labextension asks it. Answers are
compared with ``engine.infill`` in-process on the same checkpoint (greedy); how a request ended is read
from the server's log (the extension writes one line per request). Whether the engine itself stopped is
seen from inside: a Jupyter server run in a thread of this process, whose engine's generations are
watched."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from jupyter_server.base.handlers import log as jupyter_log
from jupyter_server.serverapp import ServerApp
from sequences import shared_prefix

from langchain_starcoder import FIMRequest, NotebookContext, RepoIndex, StarCoderEngine
from langchain_starcoder.editor.statuses import RequestError
from langchain_starcoder.errors import (
    CheckpointError,
    ContextLengthError,
    EngineClosedError,
    GrammarError,
    InvalidParameterError,
    ModelNotFoundError,
    StarCoderError,
)
from langchain_starcoder.gguf_format.cache import CACHE_ENV
from langchain_starcoder.jupyter import LABEXTENSION_DIR, LABEXTENSION_NAME
from langchain_starcoder.jupyter.bundle import SOURCE_DIR, bundle_stamp, source_hash
from langchain_starcoder.jupyter.completer import Completer
from langchain_starcoder.jupyter.handlers import SETTINGS_KEY
from langchain_starcoder.server import create_app
from langchain_starcoder.testing import MODEL_ENV
from langchain_starcoder.testing.jupyter_lab import NOTEBOOK, JupyterLab, write_project
from langchain_starcoder.testing.servers import ServerThread, free_port
from langchain_starcoder.types import CompletionChunk

ROUTE = "langchain-starcoder/complete"
DOCS, DOCS_MODEL = Path(__file__).resolve().parents[2] / "docs" / "jupyter.md", "/models/starcoder2-3b-4bit"
N = 12
#: Holes among which the tiny model fills one with hundreds of tokens (long enough to cancel).
LONG_CANDIDATES, LONG_TOKENS, LONG_ENOUGH = (
    ("x = values", "y = areas", "n = radii", "z = total", "k = r"),
    1500,
    300,
)


@pytest.fixture(scope="session")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], int]:
    root = tmp_path_factory.mktemp("jupyter-root")
    path, cell = write_project(root)
    (root / "pkg" / "app.py").write_text("from pkg.geometry import circle_area\n\n\ndef report(r):\n")
    return root, json.loads(path.read_text()), cell


@pytest.fixture(scope="session")
def gguf_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where ``backend="llama.cpp"`` keeps the converted checkpoint (in this process and the server's)."""
    return tmp_path_factory.mktemp("gguf-cache")


@pytest.fixture(scope="session")
def lab(
    project, tiny_path: Path, gguf_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[JupyterLab]:
    root, _, _ = project
    home = tmp_path_factory.mktemp("jupyter-home")
    configure(home, model=tiny_path)
    # The model is the configuration's: the environment's (the helper sets it) is left empty.
    env = {CACHE_ENV: str(gguf_cache), MODEL_ENV: ""}
    with JupyterLab(root, home, model="", settings={}, env=env) as server:
        yield server


def configure(home: Path, model: str | Path) -> None:
    """docs/jupyter.md's ``jupyter_server_config.py``, its model replaced by ``model``, in the Jupyter
    config folder that :class:`JupyterLab` gives the server (``home/config``), as a user writes it."""
    (block,) = re.findall(r"```py\n(.*?)```", DOCS.read_text(), flags=re.S)
    assert DOCS_MODEL in block
    config = home / "config"
    config.mkdir(parents=True, exist_ok=True)
    (config / "jupyter_server_config.py").write_text(block.replace(DOCS_MODEL, str(model)))


#: Logged-in clients, by server and name: each is one Jupyter user (its login cookie), as a browser is.
_USERS: dict[tuple[str, str], httpx.Client] = {}


def user(base: str, auth: dict[str, str], name: str = "ada") -> httpx.Client:
    """The client of user ``name`` on the Jupyter server at ``base``: with a shared token, each
    browser (its login cookie) is a user of its own (jupyter_server's anonymous users)."""
    if (base, name) not in _USERS:
        client = httpx.Client(headers=auth, timeout=300)
        assert client.get(base + "api/me").status_code == 200  # logs in: the cookie names the user
        _USERS[base, name] = client
    return _USERS[base, name]


@pytest.fixture(scope="module", autouse=True)
def _close_users() -> Iterator[None]:
    yield
    for client in _USERS.values():
        client.close()
    _USERS.clear()


def ask(lab: JupyterLab, body: dict[str, Any], name: str = "ada", **kwargs: Any) -> httpx.Response:
    return user(lab.url, lab.auth, name).post(lab.url + ROUTE, json=body, **kwargs)


def answer_lines(reply: httpx.Response) -> list[dict[str, Any]]:
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("application/x-ndjson")
    return [json.loads(line) for line in reply.text.splitlines()]


def live(notebook: dict[str, Any], cell: int, text: str) -> dict[str, Any]:
    """The notebook as the editor holds it: the hole cell's live text (not what was saved)."""
    edited = json.loads(json.dumps(notebook))
    edited["cells"][cell]["source"] = text
    return edited


def ended(lab: JupyterLab, request_id: str) -> tuple[str, int]:
    """How the request ended and after how many tokens, from the extension's log line."""
    outcome, tokens, _ = lab.request_end(request_id)
    return outcome, tokens


# --- auth: Jupyter's own -------------------------------------------------------------------------


def test_a_request_without_jupyters_token_is_refused(lab, project):
    body = {"prefix": "x = ", "max_tokens": N}
    for headers in ({}, {"Authorization": "token not-the-token"}):
        reply = httpx.post(lab.url + ROUTE, json=body, headers=headers, timeout=60)
        assert reply.status_code in (401, 403), reply.text
        assert "text" not in reply.text and "done" not in reply.text
    assert ask(lab, body).status_code == 200  # the same request with the token is answered


def test_a_cross_origin_request_is_refused_even_with_the_users_login_cookie(lab):
    """A page of another origin that the logged-in user visits sends the user's cookies: Jupyter's
    origin and XSRF checks refuse it, and no CORS header invites it."""
    body = {"prefix": "x = ", "max_tokens": N}
    with httpx.Client(timeout=120) as browser:
        assert browser.get(f"{lab.url}lab?token={lab.token}").status_code == 200  # logs in: cookies set
        xsrf = {"X-XSRFToken": browser.cookies["_xsrf"]}
        assert browser.post(lab.url + ROUTE, json=body, headers=xsrf).status_code == 200  # same origin
        evil = {**xsrf, "Origin": "http://evil.example"}
        refused = browser.post(lab.url + ROUTE, json=body, headers=evil)
        assert refused.status_code in (403, 404), refused.text
        assert "done" not in refused.text
        assert browser.post(lab.url + ROUTE, json=body).status_code == 403  # no XSRF token: refused
        preflight = browser.options(
            lab.url + ROUTE,
            headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert "access-control-allow-origin" not in preflight.headers


# --- answers: what engine.infill gives for the same context --------------------------------------


@pytest.mark.parametrize("repo_context", [False, True])
def test_the_streamed_middle_equals_engine_infill_with_the_notebook_context(
    lab, project, tiny_engine: StarCoderEngine, repo_context: bool
):
    root, notebook, cell = project
    prefix, suffix = "volumes = [circle_area(r) * ", " for r in radii]"
    nb = live(notebook, cell, prefix + suffix)
    ctx = NotebookContext.from_notebook(nb, cell)
    repo = {"repo": RepoIndex(root), "file_path": NOTEBOOK} if repo_context else {}
    expected = tiny_engine.infill(prefix, suffix, notebook=ctx, max_tokens=N, temperature=0, **repo)
    body = {
        "prefix": prefix,
        "suffix": suffix,
        "path": NOTEBOOK,
        "notebook": nb,
        "cell": cell,
        "max_tokens": N,
        "repo_context": repo_context,
        "request_id": f"nb-{repo_context}",
    }
    lines = answer_lines(ask(lab, body))
    *texts, done = lines
    assert texts and all(set(line) == {"text"} for line in texts)  # streamed, line by line
    assert "".join(line["text"] for line in texts) == done["text"] == expected.text
    assert done["done"] is True and done["finish_reason"] == expected.finish_reason
    assert (done["prompt_tokens"], done["completion_tokens"]) == (
        expected.prompt_tokens,
        expected.completion_tokens,
    )
    if repo_context:  # the imported module came as context: the prompt is not the notebook's alone
        alone = tiny_engine.fim_prompt(FIMRequest(prefix, suffix, notebook=ctx), N)
        assert done["prompt_tokens"] > len(alone.token_ids)


def test_a_warm_up_prefills_the_cells_prompt_and_the_next_keystroke_reuses_it(
    lab, project, tiny_engine: StarCoderEngine
):
    """Moving to a cell sends a warm-up: nothing is generated, the prompt is prefilled; the keystroke's
    request after it takes what the two prompts share from the cache and answers exactly as alone."""
    _, notebook, cell = project
    marked = json.loads(json.dumps(notebook))
    marked["cells"][0]["source"] = "# Areas, probed by the warm-up test"  # a prompt no other test sent
    typed = "volume = "

    def body(text: str, **extra: Any) -> dict[str, Any]:
        nb = live(marked, cell, text)
        return {"prefix": text, "path": NOTEBOOK, "notebook": nb, "cell": cell, "max_tokens": N, **extra}

    def prompt(text: str, nb: dict[str, Any]) -> list[int]:
        ctx = NotebookContext.from_notebook(live(nb, cell, text), cell)
        return tiny_engine.fim_prompt(FIMRequest(text, "", notebook=ctx), N).token_ids

    warm_ids, typed_ids = prompt("", marked), prompt(typed, marked)
    shared = shared_prefix(warm_ids, typed_ids)
    # Every earlier request's prompt lacks the mark: the cache could give the typed prompt this much alone.
    before_mark = shared_prefix(typed_ids, prompt(typed, notebook))
    assert before_mark < shared - 1

    warm = answer_lines(ask(lab, body("", warm_up=True, request_id="warm")))
    assert len(warm) == 1 and warm[0]["done"] is True
    assert (warm[0]["text"], warm[0]["finish_reason"], warm[0]["completion_tokens"]) == ("", "warm_up", 0)
    assert warm[0]["prompt_tokens"] == len(warm_ids)
    assert ended(lab, "warm")[0] == "warm_up"

    done = answer_lines(ask(lab, body(typed)))[-1]
    ctx = NotebookContext.from_notebook(live(marked, cell, typed), cell)
    expected = tiny_engine.infill(typed, "", notebook=ctx, max_tokens=N, temperature=0)
    assert (done["text"], done["finish_reason"]) == (expected.text, expected.finish_reason)
    assert done["prompt_tokens"] == len(typed_ids)
    assert done["cached_tokens"] >= shared - 1  # all it shares with the warm-up (the engine may redo one)


def test_a_py_file_gets_the_server_roots_repository_context(lab, project, tiny_engine: StarCoderEngine):
    root, _, _ = project
    prefix, suffix, path = "def report(r):\n    return ", "\n", "pkg/app.py"
    with_repo = tiny_engine.infill(
        prefix, suffix, repo=RepoIndex(root), file_path=path, max_tokens=N, temperature=0
    )
    plain = tiny_engine.infill(prefix, suffix, max_tokens=N, temperature=0)
    assert with_repo.prompt_tokens > plain.prompt_tokens  # geometry.py is in the first one's prompt
    for repo_context, expected in ((True, with_repo), (False, plain)):
        body = {
            "prefix": prefix,
            "suffix": suffix,
            "path": path,
            "max_tokens": N,
            "repo_context": repo_context,
        }
        done = answer_lines(ask(lab, body))[-1]
        assert (done["text"], done["prompt_tokens"]) == (expected.text, expected.prompt_tokens)


def test_a_middle_ends_where_the_code_does(lab, tiny_engine: StarCoderEngine):
    """Decoding stops where the middle is complete (end="auto", issue 31): a hole whose greedy middle
    goes on past its end on the tiny checkpoint (tests/unit/test_engine_ends.py)."""
    prefix, suffix = "def walk(items):\n    result = 0\n    ", "\n    return result\n"
    ended = tiny_engine.infill(prefix, suffix, max_tokens=64, temperature=0)
    free = tiny_engine.infill(prefix, suffix, max_tokens=64, temperature=0, end="none")
    assert ended.middle_end == "syntax" and ended.completion_tokens < free.completion_tokens
    body = {"prefix": prefix, "suffix": suffix, "path": "walk.py", "max_tokens": 64, "repo_context": False}
    done = answer_lines(ask(lab, body))[-1]
    assert (done["text"], done["middle_end"]) == (ended.text, "syntax")
    assert done["completion_tokens"] == ended.completion_tokens


def test_the_servers_base_url_generates_on_that_server(
    project, tiny_engine: StarCoderEngine, tiny_path: Path
):
    """``StarCoderJupyter.base_url`` (the Jupyter server's configuration, never a request's): the model
    runs on that server (here our ``serve``), the prompt is built here."""
    root, notebook, cell = project
    prefix = "mean_area = sum(areas) / "
    nb = live(notebook, cell, prefix)
    expected = tiny_engine.infill(prefix, "", notebook=NotebookContext.from_notebook(nb, cell), max_tokens=N)
    app, asked = create_app(tiny_engine), []

    async def counted(scope: dict[str, Any], receive: Any, send: Any) -> None:
        asked.append(scope.get("path"))
        await app(scope, receive, send)

    served = ServerThread(counted)
    try:
        argv = (f"--StarCoderJupyter.base_url={served.url}", f"--StarCoderJupyter.model={tiny_path}")
        with jupyter_in_this_process(root, *argv) as (base, auth, _):
            body = {"prefix": prefix, "notebook": nb, "cell": cell, "max_tokens": N}
            done = answer_lines(user(base, auth).post(base + ROUTE, json=body))[-1]
    finally:
        served.stop()
    assert (done["text"], done["completion_tokens"]) == (expected.text, expected.completion_tokens)
    assert any(path and "completion" in path for path in asked), asked  # generated there


def test_backend_llama_cpp_runs_the_model_in_a_llama_server_stopped_with_the_server(
    project, tiny_path: Path, gguf_cache: Path, monkeypatch: pytest.MonkeyPatch
):
    """``StarCoderJupyter.backend = "llama.cpp"`` (the server's configuration): the server's engine
    starts a llama-server and answers as the same managed engine does in-process; when the Jupyter
    server stops, the extension closes its engine: the llama-server is gone."""
    root, notebook, cell = project
    prefix = "mean_area = sum(areas) / "
    nb = live(notebook, cell, prefix)
    monkeypatch.setenv(CACHE_ENV, str(gguf_cache))
    managed = StarCoderEngine.load(tiny_path, backend="llama.cpp")
    try:
        ctx = NotebookContext.from_notebook(nb, cell)
        expected = managed.infill(prefix, "", notebook=ctx, max_tokens=N, temperature=0)
    finally:
        managed.close()
    body = {"prefix": prefix, "notebook": nb, "cell": cell, "max_tokens": N}

    def llama_servers() -> list[psutil.Process]:
        children = psutil.Process().children(recursive=True)
        return [child for child in children if "llama-server" in " ".join(child.cmdline())]

    before = {child.pid for child in llama_servers()}
    argv = (f"--StarCoderJupyter.model={tiny_path}", "--StarCoderJupyter.backend=llama.cpp")
    with jupyter_in_this_process(root, *argv) as (base, auth, _):
        done = answer_lines(user(base, auth).post(base + ROUTE, json=body))[-1]
        started = [child for child in llama_servers() if child.pid not in before]
    assert (done["text"], done["completion_tokens"]) == (expected.text, expected.completion_tokens)
    assert len(started) == 1  # not MLX's answer: one llama-server, the configuration's
    psutil.wait_procs(started, timeout=30)
    assert not started[0].is_running()  # released with the server extension


# --- the model: the server's configuration ----------------------------------------------------------


def test_the_configured_model_answers_not_the_environments(
    project, tiny_engine: StarCoderEngine, tiny_path: Path, monkeypatch: pytest.MonkeyPatch
):
    root, notebook, cell = project
    monkeypatch.setenv(MODEL_ENV, str(root / "not-this-one"))
    nb = live(notebook, cell, "y = ")
    expected = tiny_engine.infill("y = ", "", notebook=NotebookContext.from_notebook(nb, cell), max_tokens=N)
    with jupyter_in_this_process(root, f"--StarCoderJupyter.model={tiny_path}") as (base, auth, _):
        body = {"prefix": "y = ", "notebook": nb, "cell": cell, "max_tokens": N}
        reply = user(base, auth).post(base + ROUTE, json=body)
    assert answer_lines(reply)[-1]["text"] == expected.text


@pytest.mark.parametrize("model", ["a missing folder", "a hub id not in the cache", "the default"])
def test_with_no_model_a_request_gets_503_saying_how_to_fix_it_and_no_answer(
    project, monkeypatch: pytest.MonkeyPatch, model: str
):
    """Offline (the tests' HF_HUB_OFFLINE=1), a model that cannot be had is not replaced by random
    weights: every request gets 503 ``no_model`` whose message gives the commands that fix it."""
    root, notebook, cell = project
    monkeypatch.delenv(MODEL_ENV, raising=False)
    argv = {
        "a missing folder": [f"--StarCoderJupyter.model={root / 'no-such-checkpoint'}"],
        "a hub id not in the cache": ["--StarCoderJupyter.model=bigcode/not-in-this-cache"],
        "the default": [],
    }[model]
    body = {"prefix": "y = ", "notebook": live(notebook, cell, "y = "), "cell": cell, "path": NOTEBOOK}
    with jupyter_in_this_process(root, *argv) as (base, auth, _):
        replies = [user(base, auth).post(base + ROUTE, json=b) for b in (body, {**body, "warm_up": True})]
    for reply in replies:
        assert reply.status_code == 503, reply.text
        answer = reply.json()
        assert answer["code"] == "no_model" and set(answer) == {"error", "code", "notice"}
        for told in (answer["error"], answer["notice"]):  # the notice: JupyterLab shows 140 characters
            assert "--StarCoderJupyter.model=DIR" in told
            assert "langchain-starcoder build-test-model DIR" in told
        assert len(answer["notice"]) <= 140


def test_random_weights_answer_only_when_the_configuration_asks(project, monkeypatch: pytest.MonkeyPatch):
    """``offline_test_model``: a model that cannot be had is replaced by a checkpoint of random weights,
    for trying the extension offline; the same configuration without it answers 503."""
    root, notebook, cell = project
    monkeypatch.delenv(MODEL_ENV, raising=False)
    missing = f"--StarCoderJupyter.model={root / 'no-such-checkpoint'}"
    body = {"prefix": "y = ", "notebook": live(notebook, cell, "y = "), "cell": cell, "max_tokens": N}
    statuses = {}
    for asks in (False, True):
        flag = f"--StarCoderJupyter.offline_test_model={asks}"
        with jupyter_in_this_process(root, missing, flag) as (base, auth, _):
            statuses[asks] = user(base, auth).post(base + ROUTE, json=body)
    assert statuses[False].status_code == 503
    done = answer_lines(statuses[True])[-1]
    assert done["done"] is True and done["completion_tokens"] > 0


def hole_notebook(**fields: Any) -> dict[str, Any]:
    """A request whose notebook's last cell is the hole, with ``fields`` in (or replacing) its JSON."""
    notebook = {"nbformat": 4, "cells": [], **fields}
    notebook["cells"] = [*notebook["cells"], {"cell_type": "code", "source": ""}]
    return {"prefix": "x", "notebook": notebook, "cell": len(notebook["cells"]) - 1}


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ("not json", 400, "not JSON"),
        ({"suffix": "x"}, 400, "prefix"),
        ({"prefix": "x", "notebook": {"nbformat": 4, "cells": []}}, 400, "cell"),
        ({"prefix": "x", "max_tokens": 0}, 400, "max_tokens"),
        ({"prefix": "x", "backend": "torch"}, 400, "backend"),
        ({"prefix": "x", "warm_up": "yes"}, 400, "warm_up"),
        ({"prefix": "x", "notebook": {"nbformat": 3, "cells": []}, "cell": 0}, 400, "format 4"),
        ({"prefix": "x", "notebook": "MARKDOWN", "cell": 0}, 400, "notebook"),
        ({"prefix": "x", "model": "/no/such/checkpoint"}, 400, "StarCoderJupyter.model"),
        ({"prefix": "x", "backend": "mlx"}, 400, "StarCoderJupyter.backend"),
        (b"[" * 100_000 + b"]" * 100_000, 400, "nests too deeply"),
        (hole_notebook(metadata={"language_info": None}), 400, "language_info"),
        (hole_notebook(metadata={"language_info": ["python"]}), 400, "language_info"),
        (hole_notebook(metadata=[]), 400, "metadata"),
        (
            hole_notebook(
                cells=[{"cell_type": "code", "outputs": [{"output_type": "display_data", "data": "x"}]}]
            ),
            400,
            "cells[0].outputs[0].data",
        ),
        ({"prefix": "x", "base_url": "http://127.0.0.1:9/"}, 400, "base_url"),
    ],
)
def test_a_bad_request_gets_a_4xx_saying_what_is_wrong(lab, project, body, status, says):
    if body == "not json":
        reply = httpx.post(lab.url + ROUTE, content=b"{oops", headers=lab.auth, timeout=60)
    elif isinstance(body, bytes):
        reply = httpx.post(lab.url + ROUTE, content=body, headers=lab.auth, timeout=60)
    else:
        reply = ask(lab, body)
    assert reply.status_code == status, reply.text
    assert says in reply.json()["error"]


def test_a_markdown_cell_as_the_hole_is_refused(lab, project):
    _, notebook, _ = project
    reply = ask(lab, {"prefix": "x", "notebook": notebook, "cell": 0})
    assert reply.status_code == 400 and "markdown" in reply.json()["error"]


# --- cancellation ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def long_hole(project, tiny_engine: StarCoderEngine) -> tuple[str, int]:
    """A hole of the last cell that the model fills with hundreds of tokens, and how many it takes
    when nobody stops it (found in-process: the checkpoint's weights are random)."""
    _, notebook, cell = project
    for prefix in LONG_CANDIDATES:
        ctx = NotebookContext.from_notebook(live(notebook, cell, prefix), cell)
        whole = tiny_engine.infill(prefix, "", notebook=ctx, max_tokens=LONG_TOKENS).completion_tokens
        if whole >= LONG_ENOUGH:
            return prefix, whole
    raise AssertionError(f"none of {LONG_CANDIDATES} gets {LONG_ENOUGH} tokens from this checkpoint")


def long_body(project, long_hole, request_id: str, path: str = NOTEBOOK) -> dict[str, Any]:
    _, notebook, cell = project
    prefix, _ = long_hole
    return {
        "prefix": prefix,
        "path": path,
        "notebook": live(notebook, cell, prefix),
        "cell": cell,
        "max_tokens": LONG_TOKENS,
        "request_id": request_id,
    }


def test_a_client_that_disconnects_stops_its_generation(lab, project, long_hole, tiny_engine):
    body = long_body(project, long_hole, "gone")
    with httpx.stream("POST", lab.url + ROUTE, json=body, headers=lab.auth, timeout=300) as reply:
        first = json.loads(next(reply.iter_lines()))
        assert "text" in first  # generating: then the client leaves (the frontend aborts its fetch)
    outcome, tokens = ended(lab, "gone")
    assert outcome == "disconnected"
    assert tokens < long_hole[1] / 2
    # The server goes on answering, correctly.
    _, notebook, cell = project
    nb = live(notebook, cell, "y = ")
    expected = tiny_engine.infill("y = ", "", notebook=NotebookContext.from_notebook(nb, cell), max_tokens=N)
    body = {"prefix": "y = ", "notebook": nb, "cell": cell, "max_tokens": N, "path": NOTEBOOK}
    assert answer_lines(ask(lab, body))[-1]["text"] == expected.text


def test_a_newer_request_for_the_same_document_supersedes_the_older(lab, project, long_hole, tiny_engine):
    """The same user's newer request (the browser's next keystroke) supersedes the older one."""
    older: list[dict[str, Any]] = []
    streaming = threading.Event()

    def read_older() -> None:
        body = long_body(project, long_hole, "older")
        with user(lab.url, lab.auth).stream("POST", lab.url + ROUTE, json=body) as reply:
            for line in reply.iter_lines():
                older.append(json.loads(line))
                streaming.set()

    reader = threading.Thread(target=read_older)
    reader.start()
    assert streaming.wait(300)
    _, notebook, cell = project
    nb = live(notebook, cell, "z = ")
    newer = answer_lines(ask(lab, {"prefix": "z = ", "notebook": nb, "cell": cell, "path": NOTEBOOK}))
    reader.join(300)
    expected = tiny_engine.infill("z = ", "", notebook=NotebookContext.from_notebook(nb, cell), max_tokens=64)
    assert newer[-1]["text"] == expected.text and newer[-1]["finish_reason"] == expected.finish_reason
    assert older[-1]["done"] is True and older[-1]["finish_reason"] == "superseded"
    assert older[-1]["completion_tokens"] < long_hole[1] / 2
    assert older[-1]["text"] == "".join(line.get("text", "") for line in older[:-1])
    assert ended(lab, "older")[0] == "superseded"


@pytest.mark.parametrize("beside", ["another document", "a warm-up", "another user"])
def test_a_request_for_another_document_or_a_warm_up_or_of_another_user_does_not_supersede(
    lab, project, long_hole, tiny_engine, beside: str
):
    """A request for another document, a warm-up of the same one (nobody waits for its answer), and
    another user's request for the same document (a shared server's users share its paths) run beside
    an answer being streamed and leave it whole."""
    _, notebook, cell = project
    first: list[dict[str, Any]] = []
    streaming = threading.Event()
    body = {**long_body(project, long_hole, f"beside {beside}"), "max_tokens": 40}

    def read_first() -> None:
        with user(lab.url, lab.auth).stream("POST", lab.url + ROUTE, json=body) as reply:
            for line in reply.iter_lines():
                first.append(json.loads(line))
                streaming.set()

    reader = threading.Thread(target=read_first)
    reader.start()
    assert streaming.wait(300)
    if beside == "a warm-up":
        other = {"prefix": "", "notebook": live(notebook, cell, ""), "path": NOTEBOOK, "warm_up": True}
    else:
        path = NOTEBOOK if beside == "another user" else "other.ipynb"
        other = {"prefix": "w = ", "notebook": live(notebook, cell, "w = "), "path": path}
    name = "bob" if beside == "another user" else "ada"
    me = {n: user(lab.url, lab.auth, n).get(lab.url + "api/me").json()["identity"] for n in ("ada", "bob")}
    assert me["ada"]["username"] != me["bob"]["username"]  # two browsers: two users
    done = answer_lines(ask(lab, {**other, "cell": cell}, name))[-1]
    assert done["done"] is True and done["finish_reason"] != "superseded"
    assert (done["finish_reason"] == "warm_up") == (beside == "a warm-up")
    reader.join(300)
    whole = tiny_engine.infill(
        body["prefix"], "", notebook=NotebookContext.from_notebook(body["notebook"], cell), max_tokens=40
    )
    assert first[-1]["finish_reason"] == whole.finish_reason != "superseded"
    assert first[-1]["text"] == whole.text


def test_the_extension_is_enabled_and_jupyterlab_serves_this_packages_bundle(lab):
    """What ``pip install -e ".[jupyter]"`` gives: the server extension loaded by its shipped config, and
    the prebuilt labextension found by JupyterLab: the page loads this package's bundle (an install
    older than the bundle would serve another remoteEntry: reinstall)."""
    assert "langchain_starcoder.jupyter | extension was successfully loaded" in lab.log_text()
    page = httpx.get(f"{lab.url}lab?token={lab.token}", timeout=120).text
    shipped = json.loads((LABEXTENSION_DIR / "package.json").read_text())
    assert shipped["name"] == LABEXTENSION_NAME
    assert LABEXTENSION_NAME in page
    assert shipped["jupyterlab"]["_build"]["load"] in page


# --- the shipped bundle and its TypeScript source ------------------------------------------------------


def test_the_shipped_bundle_is_built_from_the_current_typescript_source():
    """Rebuild with ``python -m langchain_starcoder.jupyter.bundle`` after changing labextension/."""
    assert bundle_stamp() == source_hash(), (
        "the labextension bundle is out of date with labextension/: rebuild it"
    )
    assert (LABEXTENSION_DIR / "schemas" / LABEXTENSION_NAME / "plugin.json").is_file()


def test_any_change_to_the_source_changes_its_hash(tmp_path: Path):
    source = tmp_path / "labextension"
    shutil.copytree(SOURCE_DIR, source, ignore=shutil.ignore_patterns("node_modules", "lib", "*.tsbuildinfo"))
    original = source_hash(source)
    for name in ("src/provider.ts", "schema/plugin.json", "package.json"):
        text = (source / name).read_text()
        (source / name).write_text(text + " ")
        assert source_hash(source) != original, name
        (source / name).write_text(text)
    (source / "src" / "extra.ts").write_text("export {};\n")
    assert source_hash(source) != original


# --- the engine's side of a cancel, seen from inside --------------------------------------------------


class ServerInThisProcess(ServerApp):
    """Jupyter's server run in a thread of the test process (signal handlers are the main thread's)."""

    def init_signal(self) -> None:
        pass


@contextlib.contextmanager
def jupyter_in_this_process(root: Path, *argv: str) -> Iterator[tuple[str, dict[str, str], ServerApp]]:
    """A Jupyter server with the extension on a thread of this process, with ``argv`` added to its
    command line: its URL, the header of its token and the server (stopped when the block ends)."""
    port, token = free_port(), secrets.token_hex(16)
    started, apps = threading.Event(), []

    def run() -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        app = ServerInThisProcess()
        app.initialize(
            argv=[
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}",
                "--allow-root",
                "--no-browser",
                "--ServerApp.jpserver_extensions",
                "langchain_starcoder.jupyter=True",
                *argv,
            ]
        )
        apps.append(app)
        app.io_loop.add_callback(started.set)
        app.start()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not started.wait(0.2):
        assert thread.is_alive() and time.monotonic() < deadline, "the Jupyter server did not start"
    try:
        yield f"http://127.0.0.1:{port}/", {"Authorization": f"token {token}"}, apps[0]
    finally:
        apps[0].io_loop.add_callback(apps[0].stop)
        thread.join(60)


@pytest.fixture(scope="module")
def inside(project, tiny_path: Path) -> Iterator[tuple[str, dict[str, str], ServerApp]]:
    root, _, _ = project
    with jupyter_in_this_process(root, f"--StarCoderJupyter.model={tiny_path}") as server:
        yield server


def completer_of(app: ServerApp) -> Completer:
    return app.web_app.settings[SETTINGS_KEY]


@dataclass
class Watched:
    """A generation the engine ran, the tokens its worker produced for it, and its end."""

    generation: Any
    tokens: list[int] = field(default_factory=list)
    end: Future | None = None


def watch_generations(engine: StarCoderEngine, monkeypatch: pytest.MonkeyPatch) -> list[Watched]:
    """Every generation the engine runs from now on (a live list)."""
    seen: list[Watched] = []
    submit = engine.backend.submit

    def watched(generations: list) -> Future:
        batch = [Watched(g) for g in generations]
        for w in batch:
            token = w.generation.sink.token

            def counting(t: int, token: Any = token, tokens: list[int] = w.tokens) -> Any:
                tokens.append(t)
                return token(t)

            w.generation.sink.token = counting
        future = submit(generations)
        for w in batch:
            w.end = future
        seen.extend(batch)
        return future

    monkeypatch.setattr(engine.backend, "submit", watched)
    return seen


@pytest.mark.parametrize("leave", ["disconnect", "supersede"])
def test_the_engines_generation_stops_when_its_request_is_dropped(
    inside, project, long_hole, tiny_path: Path, monkeypatch: pytest.MonkeyPatch, leave: str
):
    base, auth, app = inside
    url, ada = base + ROUTE, user(base, auth)
    engine = completer_of(app).engine()  # the server's one engine
    body = long_body(project, long_hole, leave)
    whole = long_hole[1]
    seen = watch_generations(engine, monkeypatch)
    with ada.stream("POST", url, json=body) as reply:
        lines = reply.iter_lines()
        assert "text" in json.loads(next(lines))
        if leave == "supersede":  # the user's newer keystroke in the same file, while the older streams
            newer = ada.post(url, json={**body, "prefix": "y = ", "max_tokens": N})
            assert json.loads(newer.text.splitlines()[-1])["done"] is True
            assert json.loads(list(lines)[-1])["finish_reason"] == "superseded"
    dropped = seen[0]
    assert dropped.end is not None
    dropped.end.result(timeout=300)  # the engine's worker is done with it...
    assert dropped.generation.cancelled.is_set()
    assert len(dropped.tokens) < whole / 2  # ...long before the whole answer


# --- one map from errors to statuses: the HTTP server's and the Jupyter extension's --------------------

#: What an unexpected error may hold, and neither surface may send back.
SECRET = "/home/ada/.ssh/id_ed25519"
#: Each error as raised while a request's prompt is built, and the status both surfaces answer.
ERRORS = [
    pytest.param(lambda: RequestError("a field is wrong", 409), 409, id="request-error"),
    pytest.param(lambda: InvalidParameterError("temperature must be >= 0"), 400, id="invalid-parameter"),
    pytest.param(lambda: GrammarError("the grammar is too deep"), 400, id="grammar"),
    pytest.param(lambda: ContextLengthError("the prompt does not fit"), 413, id="context-length"),
    pytest.param(lambda: ModelNotFoundError("no model at /models/x"), 404, id="model-not-found"),
    pytest.param(lambda: CheckpointError("the checkpoint is incomplete"), 500, id="checkpoint"),
    pytest.param(lambda: EngineClosedError("the engine was closed"), 500, id="engine-closed"),
    pytest.param(lambda: OSError(f"cannot read {SECRET}"), 500, id="unexpected-oserror"),
    pytest.param(lambda: KeyError(SECRET), 500, id="unexpected-keyerror"),
]


@pytest.fixture(scope="module")
def http_server(tiny_engine: StarCoderEngine) -> Iterator[str]:
    """The package's HTTP server over the tiny checkpoint, in a thread of this process."""
    running = ServerThread(create_app(tiny_engine, model_name="tiny"))
    yield running.url
    running.stop()


@dataclass
class Surfaces:
    """The HTTP server's ``/infill`` and the Jupyter extension's route, each asked for the same hole,
    with the engine each one runs and the log each one writes to."""

    server: str
    jupyter: tuple[str, dict[str, str], ServerApp]
    server_engine: StarCoderEngine
    jupyter_engine: StarCoderEngine
    logs: list[str]

    def ask_server(self, stream: bool = False) -> httpx.Response:
        body = {"input_prefix": "x = ", "input_suffix": "\n", "n_predict": 8, "stream": stream}
        return httpx.post(self.server + "/infill", json=body, timeout=300)

    def ask_jupyter(self) -> httpx.Response:
        base, auth, _ = self.jupyter
        body = {"prefix": "x = ", "suffix": "\n", "path": "errors.py", "max_tokens": 8, "repo_context": False}
        return user(base, auth).post(base + ROUTE, json=body)


class _Lines(logging.Handler):
    def __init__(self, lines: list[str]):
        super().__init__(logging.ERROR)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))  # the message and its traceback


@pytest.fixture
def surfaces(http_server, inside, tiny_engine: StarCoderEngine) -> Iterator[Surfaces]:
    logs: list[str] = []
    handler = _Lines(logs)
    # The server logs through Python's logging; the Jupyter handler through the Jupyter server's log.
    loggers = [logging.getLogger("langchain_starcoder"), jupyter_log()]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield Surfaces(http_server, inside, tiny_engine, completer_of(inside[2]).engine(), logs)
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def _raising(make: Any) -> Any:
    def fim_prompt(*args: Any, **kwargs: Any) -> Any:
        raise make()

    return fim_prompt


@pytest.mark.parametrize(("make", "status"), ERRORS)
def test_the_server_and_the_jupyter_extension_answer_an_error_with_one_status(
    surfaces: Surfaces, monkeypatch: pytest.MonkeyPatch, make: Any, status: int
):
    """The same error raised while the prompt is built gets the same status (and code) from both; the
    package's own errors say what is wrong; an unexpected one's text is in neither answer, only in the
    server's log, under the id the answer names."""
    for engine in (surfaces.server_engine, surfaces.jupyter_engine):
        monkeypatch.setattr(engine, "fim_prompt", _raising(make))
    server, jupyter = surfaces.ask_server(), surfaces.ask_jupyter()
    assert (server.status_code, jupyter.status_code) == (status, status), (server.text, jupyter.text)
    said = {"server": server.json()["error"]["message"], "jupyter": jupyter.json()["error"]}
    assert server.json()["error"]["code"] == jupyter.json().get("code")
    error = make()
    if isinstance(error, StarCoderError | RequestError):
        assert said == {"server": str(error), "jupyter": str(error)}
        return
    for surface, message in said.items():
        assert SECRET not in message, (surface, message)
        (error_id,) = re.findall(r"Internal error (\w+)", message)
        (logged,) = [line for line in surfaces.logs if error_id in line]
        assert SECRET in logged and "Traceback" in logged and "fim_prompt" in logged  # the log has it all


def test_an_unexpected_error_mid_stream_is_not_sent_either(
    surfaces: Surfaces, monkeypatch: pytest.MonkeyPatch
):
    """An error after the first line of the answer (the status already sent) is an error line in both,
    which names the log's id and holds nothing of the error's text."""

    def astream_fim_prompt(*args: Any, **kwargs: Any) -> Any:
        async def chunks() -> Any:
            yield CompletionChunk("partial", [1])
            raise OSError(f"cannot read {SECRET}")

        return chunks()

    for engine in (surfaces.server_engine, surfaces.jupyter_engine):
        monkeypatch.setattr(engine, "astream_fim_prompt", astream_fim_prompt)
    server, jupyter = surfaces.ask_server(stream=True), surfaces.ask_jupyter()
    events = [json.loads(line[5:]) for line in server.text.splitlines() if line.startswith("data: ")]
    lines = [json.loads(line) for line in jupyter.text.splitlines()]
    assert (server.status_code, events[0]["content"]) == (200, "partial")
    assert (jupyter.status_code, lines[0]) == (200, {"text": "partial"})
    for message in (events[-1]["error"]["message"], lines[-1]["error"]):
        assert SECRET not in message
        (error_id,) = re.findall(r"Internal error (\w+)", message)
        assert any(error_id in line and SECRET in line for line in surfaces.logs)
