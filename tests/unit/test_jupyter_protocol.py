"""The Jupyter handler's reading of a request, up to the prompt it builds (``read_body``, ``parse_ask``,
``Completer.prepare`` on the tiny checkpoint): every malformed body is a client's mistake, answered with a
4xx that says what is wrong, never a 500; an unexpected error's message is never sent back."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from langchain_starcoder.editor import statuses
from langchain_starcoder.jupyter.completer import Completer, EngineSettings
from langchain_starcoder.jupyter.protocol import parse_ask, read_body
from langchain_starcoder.testing import MODEL_ENV

#: Any JSON value, nested a little.
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
TEXT = st.text(max_size=40)
HOLE = {"cell_type": "code", "source": ""}


def either(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's valid values (three times in four), or any JSON in its place."""
    return st.one_of(valid, valid, valid, JSON)


OUTPUT = either(
    st.fixed_dictionaries(
        {"output_type": either(st.sampled_from(["stream", "execute_result", "display_data", "error"]))},
        optional={
            "text": either(TEXT | st.lists(TEXT, max_size=3)),
            "data": either(st.dictionaries(st.sampled_from(["text/plain", "image/png"]), either(TEXT))),
            "ename": either(TEXT),
            "evalue": either(TEXT),
        },
    )
)
CELL = either(
    st.fixed_dictionaries(
        {"cell_type": either(st.sampled_from(["code", "markdown", "raw"]))},
        optional={
            "source": either(TEXT | st.lists(TEXT, max_size=3)),
            "outputs": either(st.lists(OUTPUT, max_size=3)),
            "metadata": JSON,
        },
    )
)
NOTEBOOK = either(
    st.fixed_dictionaries(
        {"nbformat": either(st.just(4)), "cells": either(st.lists(CELL, max_size=4))},
        optional={
            "metadata": either(
                st.fixed_dictionaries(
                    {}, optional={"language_info": either(st.fixed_dictionaries({"name": JSON}))}
                )
            ),
            "nbformat_minor": JSON,
        },
    )
)


@st.composite
def bodies(draw: st.DrawFn, model: str, *, envelope: bool) -> dict[str, Any]:
    """Requests as the labextension sends them (no model load or llama-server: the model is the tiny
    checkpoint or one that is not there). ``envelope``: any field of any shape; else well-formed fields
    around a notebook of any shape, most of them ending with the code cell that ``cell`` names (so
    that the malformed parts before it are read)."""
    fields = {
        "suffix": TEXT,
        "path": st.sampled_from(["analysis.ipynb", "pkg/app.py", "../out.py", "/etc/passwd"]) | TEXT,
        "cell": st.integers(-2, 5),
        "max_tokens": st.integers(-1, 5_000),
        "temperature": st.floats(-1, 2, allow_nan=False),
        "backend": st.sampled_from(["mlx", "torch", "", None]),
        "repo_context": st.booleans(),
        "warm_up": st.booleans(),
        "request_id": TEXT,
    }
    if envelope:
        fields = {name: either(valid) for name, valid in fields.items()}
    fields |= {
        "model": st.sampled_from([model, "/no/such/checkpoint", "", None]),
        "base_url": st.sampled_from(
            [None, "http://127.0.0.1:1/", "file:///etc/passwd"] if envelope else [None]
        ),
    }
    required = {"prefix": either(TEXT) if envelope else TEXT, "notebook": NOTEBOOK}
    body = draw(st.fixed_dictionaries(required, optional=fields))
    notebook = body.get("notebook")
    if isinstance(notebook, dict) and isinstance(notebook.get("cells"), list) and draw(st.integers(0, 3)):
        notebook["cells"].append(HOLE)
        body["cell"] = len(notebook["cells"]) - 1
    return body


@pytest.fixture(scope="module")
def completer(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Completer]:
    root = tmp_path_factory.mktemp("protocol-root")
    (root / "pkg").mkdir()
    (root / "pkg" / "app.py").write_text("def area(r):\n    return 3.14 * r * r\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(MODEL_ENV, raising=False)  # the model is the server's configuration's
        os.environ.pop("LANGCHAIN_STARCODER_BASE_URL", None)
        completer = Completer(str(root), EngineSettings(model=str(tiny_path)))
        yield completer
        completer.close()


def status_of(completer: Completer, body: bytes) -> tuple[int, str]:
    """What the handler answers before streaming: 200 when the prompt was built, else the error's."""
    try:
        completer.prepare(parse_ask(read_body(body)))
    except Exception as e:
        status = statuses.status_of(e)  # the handler's map (the HTTP server's too)
        return status.status, status.message
    return 200, ""


@pytest.mark.parametrize("envelope", [True, False], ids=["any-fields", "any-notebook"])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_malformed_body_gets_a_4xx(
    completer: Completer, tiny_path: Path, envelope: bool, data: st.DataObject
) -> None:
    body = data.draw(bodies(str(tiny_path), envelope=envelope))
    status, message = status_of(completer, json.dumps(body).encode())
    assert status in (200, 400, 404, 413), (status, message, body)
    assert status == 200 or message


def with_notebook(**fields: Any) -> dict[str, Any]:
    """A request whose notebook's last cell is the hole, with ``fields`` in (or replacing) its JSON."""
    notebook = {"nbformat": 4, "cells": [HOLE], **fields}
    return {"prefix": "x", "notebook": notebook, "cell": len(notebook["cells"]) - 1}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"[" * 200_000 + b"]" * 200_000, "nests too deeply"),
        (b'{"prefix": "x", "notebook": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests too deeply"),
        (b"{oops", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (with_notebook(metadata={"language_info": None}), "language_info"),
        (with_notebook(metadata={"language_info": []}), "language_info"),
        (with_notebook(metadata=[]), "metadata"),
        (with_notebook(cells=["code", HOLE]), "cells[0]"),
        (with_notebook(cells=[{"cell_type": "code", "outputs": 3}, HOLE]), "cells[0].outputs"),
        (with_notebook(cells=[{"cell_type": "code", "outputs": [7]}, HOLE]), "cells[0].outputs[0]"),
        ({"prefix": "x", "base_url": "http://169.254.169.254/"}, "base_url"),
        ({"prefix": "x", "model": "/etc"}, "StarCoderJupyter.model"),
        ({"prefix": "x", "backend": "llama.cpp"}, "StarCoderJupyter.backend"),
        ({"prefix": "x\ud800"}, "surrogate"),
    ],
)
def test_a_malformed_body_is_refused_saying_what_is_wrong(
    completer: Completer, body: bytes | dict[str, Any], says: str
) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, message = status_of(completer, raw)
    assert status == 400 and says in message, (status, message)


@pytest.mark.parametrize("mime_data", ["a string", ["a", "list"], 3])
def test_an_outputs_data_that_is_not_an_object_is_refused(completer: Completer, mime_data: Any) -> None:
    cells = [
        {
            "cell_type": "code",
            "source": "x = 1",
            "outputs": [{"output_type": "execute_result", "data": mime_data}],
        },
        {"cell_type": "code", "source": ""},
    ]
    body = {"prefix": "y = ", "notebook": {"nbformat": 4, "cells": cells}, "cell": 1}
    status, message = status_of(completer, json.dumps(body).encode())
    assert status == 400 and "cells[0].outputs[0].data" in message, (status, message)


def test_a_well_formed_body_builds_its_prompt(completer: Completer) -> None:
    cells = [
        {"cell_type": "code", "source": "x = 1", "outputs": [{"output_type": "stream", "text": "1\n"}]},
        {"cell_type": "code", "source": ""},
    ]
    notebook = {"nbformat": 4, "cells": cells, "metadata": {"language_info": {"name": "python"}}}
    body = {"prefix": "y = ", "notebook": notebook, "cell": 1, "path": "analysis.ipynb", "base_url": None}
    assert status_of(completer, json.dumps(body).encode()) == (200, "")


def test_an_unexpected_errors_message_is_not_sent_back() -> None:
    status = statuses.status_of(KeyError("/home/ada/.secret"))
    assert status.status == 500 and ".secret" not in status.message and "log" in status.message
    bad = statuses.status_of(statuses.RequestError("bad field"))
    assert (bad.status, bad.message) == (400, "bad field")
