"""The editor session (``langchain_starcoder.editor``) on its own, with no web framework: what it prepares
for a document (layout, stable prefix, context order, each partition's own), its claims, and the one map
from errors to statuses that the HTTP server and the Jupyter extension share."""

from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
import sys

import pytest

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.editor import EditorSessions, RequestError, status_of
from langchain_starcoder.errors import (
    CheckpointError,
    ContextLengthError,
    EngineClosedError,
    GrammarError,
    InvalidParameterError,
    ModelNotFoundError,
)
from langchain_starcoder.fim.request import ContextFile, FIMRequest

LINES = [f"value_{i} = compute({i}, scale=2)\n" for i in range(40)]
A, B = (
    ContextFile("src/a.py", "def a():\n    return 1\n"),
    ContextFile("src/b.py", "def b():\n    return 2\n"),
)


def window(start: int, size: int = 20) -> str:
    """The editor's window of ``size`` lines before the cursor, from line ``start`` of the file."""
    return "".join(LINES[start : start + size])


def test_the_editor_package_needs_no_web_framework() -> None:
    code = (
        "import sys, langchain_starcoder.editor as e; e.EditorSessions(); "
        "print(sorted(m for m in ('starlette', 'tornado', 'jupyter_server') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_window_slid_down_gets_the_lines_it_dropped_in_the_sessions_layout(tiny_engine: StarCoderEngine):
    sessions = EditorSessions(fim_mode="spm")
    document = sessions.document("tenant", "src/app.py")
    first = sessions.prepare(tiny_engine, FIMRequest(window(0), "\n"), 8, document)
    assert (first.request.prefix, first.request.mode, first.prompt) == (window(0), "spm", None)
    slid = sessions.prepare(tiny_engine, FIMRequest(window(1), "\n"), 8, document)
    assert slid.request.prefix == window(0, 21)  # the dropped line is back above the window
    assert slid.prompt is not None
    assert slid.prompt.token_ids == tiny_engine.fim_prompt(slid.request, 8).token_ids  # the prompt it runs
    # Another partition's document of the same path, or no document: the window as sent.
    other = sessions.prepare(
        tiny_engine, FIMRequest(window(2), "\n"), 8, sessions.document("other", "src/app.py")
    )
    alone = sessions.prepare(tiny_engine, FIMRequest(window(2), "\n"), 8, None)
    assert other.request.prefix == alone.request.prefix == window(2)


def test_the_stable_prefix_off_sends_the_window_as_is(tiny_engine: StarCoderEngine):
    sessions = EditorSessions(stable_prefix=False)
    document = sessions.document("tenant", "src/app.py")
    sessions.prepare(tiny_engine, FIMRequest(window(0), "\n"), 8, document)
    assert sessions.prepare(tiny_engine, FIMRequest(window(1), "\n"), 8, document).request.prefix == window(1)


def test_context_files_keep_the_documents_last_order_after_the_added_context(tiny_engine: StarCoderEngine):
    sessions = EditorSessions()
    document = sessions.document("tenant", None, 0)  # a slot alone names a document too
    repo = ContextFile("src/repo.py", "def repo():\n    return 3\n")

    def add(request: FIMRequest) -> FIMRequest:  # the server's repository context, after the client's files
        return dataclasses.replace(request, context_files=(*request.context_files, repo))

    first = sessions.prepare(tiny_engine, FIMRequest("x = ", "", context_files=(A, B)), 8, document, add)
    assert (first.request.context_files, first.order) == ((A, B, repo), [0, 1, 2])
    again = sessions.prepare(tiny_engine, FIMRequest("x = 1", "", context_files=(B, A)), 8, document, add)
    assert (again.request.context_files, again.order) == ((A, B, repo), [1, 0, 2])
    off = EditorSessions(supersede=False)
    plain = off.prepare(tiny_engine, FIMRequest("x", "", context_files=(B, A)), 8, document, add)
    assert (plain.request.context_files, plain.order) == ((B, A, repo), [0, 1, 2])


async def test_claims_supersede_within_a_document_and_never_with_supersession_off():
    sessions = EditorSessions()
    ada, bob = sessions.document("ada", "nb.ipynb"), sessions.document("bob", "nb.ipynb")
    older, others = sessions.claim(ada), sessions.claim(bob)
    warm_up = sessions.claim(ada, warm_up=True)
    assert not older.superseded.is_set()  # a warm-up never supersedes an answer someone waits for
    newer = sessions.claim(ada)
    assert older.superseded.is_set() and warm_up.superseded.is_set() and not others.superseded.is_set()
    sessions.release(newer)
    assert sessions.supersedes(ada) and not sessions.supersedes(None)
    off = EditorSessions(supersede=False)
    kept = off.claim(ada)
    off.claim(ada)
    assert not kept.superseded.is_set() and not off.supersedes(ada)


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (RequestError("a field is wrong", 422, code="bad_field"), 422, "bad_field"),
        (InvalidParameterError("temperature must be >= 0"), 400, None),
        (GrammarError("the grammar is too deep"), 400, None),
        (ContextLengthError("the prompt does not fit"), 413, "context_length_exceeded"),
        (ModelNotFoundError("no model at /models/x"), 404, "model_not_found"),
        (CheckpointError("the checkpoint is incomplete"), 500, None),
        (EngineClosedError("the engine was closed"), 500, None),
    ],
)
def test_a_client_mistake_or_a_package_error_says_what_is_wrong(
    error: Exception, status: int, code: str | None
):
    answered = status_of(error)
    assert (answered.status, answered.message, answered.fields.get("code")) == (status, str(error), code)


def test_an_unexpected_error_is_a_500_naming_a_log_id_and_nothing_of_its_text(
    caplog: pytest.LogCaptureFixture,
):
    secret = "/home/ada/.ssh/id_ed25519"
    try:
        open(secret + "-not-there")  # noqa: SIM115  # a real error, with a real traceback
    except OSError as e:
        with caplog.at_level(logging.ERROR, logger="langchain_starcoder"):
            answered = status_of(e)
    assert answered.status == 500 and secret not in answered.message
    (error_id,) = re.findall(r"Internal error (\w+):", answered.message)
    assert answered.fields == {"error_id": error_id}
    (record,) = [r for r in caplog.records if error_id in r.getMessage()]
    assert record.exc_info is not None and secret in str(record.exc_info[1])
    assert status_of(KeyError(secret)).fields["error_id"] != error_id  # one id per error
