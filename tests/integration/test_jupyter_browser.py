"""JupyterLab in a real browser: headless Chromium (Debian's, driven by Playwright) opens a notebook
served by a real ``jupyter lab`` with the package's labextension and server extension and the tiny
checkpoint, types in a code cell, waits for the ghost text, accepts it with Tab, saves, and the saved
cell holds exactly what ``engine.infill`` gives in-process for that notebook context (greedy).

``LANGCHAIN_STARCODER_SCREENSHOTS=1`` also writes the ghost text's screenshot to
docs/images/jupyter-ghost-text.png (the docs' picture); otherwise it goes to the test's folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import sync_playwright
from sequences import shared_prefix

from benchmarks.cases import BENCHMARKS, OPTIONAL, Context
from benchmarks.harness import Checkpoints
from benchmarks.jupyter import bench_jupyter, percentile
from langchain_starcoder import NotebookContext, RepoIndex, StarCoderEngine
from langchain_starcoder.jupyter.completer import Completer
from langchain_starcoder.jupyter.handlers import ROUTE as ROUTE_PARTS
from langchain_starcoder.jupyter.protocol import SERVER_SETTINGS, parse_ask
from langchain_starcoder.testing import MODEL_ENV
from langchain_starcoder.testing.jupyter_lab import (
    NOTEBOOK,
    PAGE_TIMEOUT_MS,
    JupyterLab,
    cell_text,
    edit_cell,
    editor_text,
    open_notebook,
    write_project,
)

CHROMIUM = "/usr/bin/chromium"
ROUTE = "/".join(ROUTE_PARTS)
#: Copies of the notebook (hole cell empty) for the warm-up and Enter tests: the others type in NOTEBOOK.
WARM_NOTEBOOK, ENTER_NOTEBOOK = "warm.ipynb", "enter.ipynb"
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "images" / "jupyter-ghost-text.png"
MAX_TOKENS = 8
#: What the test may type: plain words (no brackets or quotes, which the editor would close itself).
TYPED = ("areas_total = sum", "x = values", "mean = total / len", "result = circle_area", "big = max")
#: Lines after which Enter indents the next one (what the Enter test may type).
BLOCK_HEADS = (
    "for r in radii:",
    "for area in areas:",
    "if radii:",
    "while areas:",
    "if total:",
    "for i in range:",
)
#: JupyterLab's Python indent.
INDENT = "    "
#: A script of the project, its text, and what the test may type at its end.
SCRIPT = "pkg/report.py"
SCRIPT_HEAD = "from pkg.geometry import circle_area\n\n\ndef report(radius):\n    area = "
SCRIPT_TYPED = ("circle_area", "radius * radius", "round", "max", "PI * radius")
#: Generous waits for a loaded 2-core machine: they bound a failure, a pass never waits them out.
PAGE_MS = GHOST_MS = PAGE_TIMEOUT_MS


@pytest.fixture(scope="session")
def lab_project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    root = tmp_path_factory.mktemp("browser-root")
    _, cell = write_project(root)
    return root, cell


#: The labextension's settings here: repository context on, as by default.
SETTINGS = {"maxTokens": MAX_TOKENS, "debounceMs": 100}


def configured_lab(root: Path, home: Path, model: str | Path) -> JupyterLab:
    """A ``jupyter lab`` whose model is its configuration's (``jupyter_server_config.py`` in the config
    folder JupyterLab gives it), the environment's left empty."""
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "jupyter_server_config.py").write_text(f"c.StarCoderJupyter.model = {str(model)!r}\n")
    return JupyterLab(root, home, model="", settings=SETTINGS, env={MODEL_ENV: ""})


@pytest.fixture(scope="session")
def lab(lab_project, tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterLab]:
    root, _ = lab_project
    with configured_lab(root, tmp_path_factory.mktemp("browser-home"), tiny_path) as lab:
        yield lab


@pytest.fixture(scope="module")
def browser() -> Iterator[Callable[[Callable[[Any], Any]], Any]]:
    """Runs a function with the browser, on a thread of its own: Playwright's sync API refuses a thread
    where an asyncio loop runs (pytest-asyncio's), and its own loop must not outlive these tests."""
    assert Path(CHROMIUM).is_file(), "Debian's chromium is needed: apt-get install -y chromium (.ci/run does)"
    jobs: queue.Queue[tuple[Callable[[Any], Any], Future[Any]] | None] = queue.Queue()

    def serve() -> None:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            while (job := jobs.get()) is not None:
                work, future = job
                try:
                    future.set_result(work(chromium))
                except BaseException as err:  # the test's own assertion errors too
                    future.set_exception(err)
            chromium.close()

    thread = threading.Thread(target=serve, name="browser", daemon=True)
    thread.start()

    def run(work: Callable[[Any], Any]) -> Any:
        future: Future[Any] = Future()
        jobs.put((work, future))
        return future.result(timeout=600)

    yield run
    jobs.put(None)
    thread.join(timeout=60)


def expected_middle(
    engine: StarCoderEngine, root: Path, notebook: dict[str, Any], cell: int, typed: str, path: str = NOTEBOOK
) -> str:
    """What the server should answer for ``typed`` in ``cell`` (the cursor at its end): the live
    notebook as context, and the server root's repository context for the notebook's path (the
    extension's default)."""
    live = json.loads(json.dumps(notebook))
    live["cells"][cell]["source"] = typed
    ctx = NotebookContext.from_notebook(live, cell)
    repo = RepoIndex(root)
    return engine.infill(
        typed, "", notebook=ctx, repo=repo, file_path=path, max_tokens=MAX_TOKENS, temperature=0
    ).text


def shown_as_is(answers: dict[str, str]) -> tuple[str, str]:
    """The first (typed, answer) whose answer the editor shows as it is: one line of printable text (the
    tiny model's random weights also emit control characters, which the editor draws as placeholders)."""
    for typed, middle in answers.items():
        if middle.strip() and middle.isprintable():
            return typed, middle
    raise AssertionError(f"no printable answer among {answers}")


def test_typing_in_a_cell_shows_the_models_ghost_text_and_tab_accepts_it(
    lab, lab_project, browser, tiny_engine: StarCoderEngine, tmp_path: Path
):
    root, cell = lab_project
    notebook = json.loads((root / NOTEBOOK).read_text())
    answers = {typed: expected_middle(tiny_engine, root, notebook, cell, typed) for typed in TYPED}
    typed, middle = shown_as_is(answers)

    def drive(chromium: Any) -> str:
        page = chromium.new_page(viewport={"width": 1100, "height": 820})
        try:
            return type_and_accept(page)
        finally:
            page.close()

    def type_and_accept(page: Any) -> str:
        open_notebook(page, lab, NOTEBOOK, cells=cell + 1)
        edit_cell(page, cell)
        page.keyboard.type(typed, delay=60)
        # The ghost text streams in; it is complete once it holds the whole middle.
        page.wait_for_function(
            "expected => document.querySelector('.jp-GhostText')?.textContent === expected",
            arg=middle,
            timeout=GHOST_MS,
            polling=100,
        )
        shot = tmp_path / SCREENSHOT.name
        page.locator(".jp-NotebookPanel").screenshot(path=str(shot))
        if os.environ.get("LANGCHAIN_STARCODER_SCREENSHOTS") == "1":
            SCREENSHOT.parent.mkdir(exist_ok=True)
            shutil.copyfile(shot, SCREENSHOT)
        assert cell_text(page, cell) == typed  # shown, not yet in the cell
        page.keyboard.press("Tab")  # JupyterLab's inline-completer:accept
        page.wait_for_function(
            "() => !document.querySelector('.jp-GhostText')?.textContent", timeout=GHOST_MS
        )  # accepted: the ghost is gone...
        assert cell_text(page, cell) == typed + middle  # ...and its text is the cell's
        page.keyboard.press("Control+s")
        return _saved_source(root / NOTEBOOK, cell, timeout=PAGE_MS / 1000)

    saved = browser(drive)
    assert saved == typed + middle


def test_a_py_file_gets_ghost_text_with_the_repository_context(
    lab, lab_project, browser, tiny_engine: StarCoderEngine
):
    """A ``.py`` file in JupyterLab's file editor: the server root's repository context (the module it
    imports) goes with the file's text, as ``engine.infill(..., repo=RepoIndex(root), file_path=...)``."""
    root, _ = lab_project
    (root / SCRIPT).write_text(SCRIPT_HEAD)
    repo = RepoIndex(root)
    answers = {
        typed: tiny_engine.infill(
            SCRIPT_HEAD + typed, "", repo=repo, file_path=SCRIPT, max_tokens=MAX_TOKENS, temperature=0
        ).text
        for typed in SCRIPT_TYPED
    }
    typed, middle = shown_as_is(answers)

    def drive(chromium: Any) -> None:
        page = chromium.new_page(viewport={"width": 1100, "height": 820})
        try:
            type_and_accept(page)
        finally:
            page.close()

    def type_and_accept(page: Any) -> None:
        page.goto(f"{lab.url}lab/tree/{SCRIPT}?token={lab.token}", timeout=PAGE_MS)
        page.locator(".jp-FileEditor .cm-content").click(timeout=PAGE_MS)
        page.keyboard.press("Control+End")
        page.wait_for_function(
            "() => document.activeElement?.matches('.jp-FileEditor .cm-content')", timeout=PAGE_MS
        )
        page.keyboard.type(typed, delay=60)
        page.wait_for_function(
            "expected => document.querySelector('.jp-GhostText')?.textContent === expected",
            arg=middle,
            timeout=GHOST_MS,
            polling=100,
        )
        page.keyboard.press("Tab")
        page.wait_for_function(
            "() => !document.querySelector('.jp-GhostText')?.textContent", timeout=GHOST_MS
        )
        assert editor_text(page, ".jp-FileEditor") == SCRIPT_HEAD + typed + middle
        page.keyboard.press("Control+s")
        deadline = time.monotonic() + PAGE_MS / 1000
        while (root / SCRIPT).read_text() == SCRIPT_HEAD:
            assert time.monotonic() < deadline, f"{SCRIPT} was not saved"
            time.sleep(0.2)

    browser(drive)
    assert (root / SCRIPT).read_text() == SCRIPT_HEAD + typed + middle


def test_entering_a_cell_warms_its_prompt_and_the_first_keystroke_there_takes_it_from_the_cache(
    lab, lab_project, browser, tiny_engine: StarCoderEngine
):
    """The labextension sends a warm-up when the user moves to a cell (its warmUp setting, on by
    default): the server prefills that cell's prompt, and the first keystroke's request there finds
    all it shares with that prompt in the engine's cache."""
    root, cell = lab_project
    notebook = json.loads((root / NOTEBOOK).read_text())
    notebook["cells"][cell]["source"] = ""
    (root / WARM_NOTEBOOK).write_text(json.dumps(notebook))

    def drive(chromium: Any) -> list[dict[str, Any]]:
        page = chromium.new_page(viewport={"width": 1100, "height": 820})
        sent: list[dict[str, Any]] = []
        # (JupyterLab's requests end in a query that defeats caches)
        page.on("request", lambda r: sent.append(r.post_data_json) if ROUTE in r.url else None)
        try:
            open_notebook(page, lab, WARM_NOTEBOOK, cells=cell + 1)
            edit_cell(page, cell)
            # The user pauses in the cell until a warm-up has run (the first loads the model), then types.
            _until(page, lambda: any(_warmed(lab, b) for b in sent if b.get("warm_up") and b["cell"] == cell))
            page.keyboard.type(TYPED[0], delay=60)
            # The whole word's request (one sent mid-word on a loaded machine is aborted by the next key),
            # answered before the page goes (closing it would disconnect the request).
            _until(page, lambda: any(typed(b) and _ended(lab, b) for b in sent))
            return list(sent)
        finally:
            page.close()

    def typed(body: dict[str, Any]) -> bool:
        return not body.get("warm_up") and body["prefix"] == TYPED[0]

    sent = browser(drive)
    keystroke = next(b for b in sent if typed(b))
    warm_ups = [b for b in sent[: sent.index(keystroke)] if b.get("warm_up") and b["cell"] == cell]
    assert warm_ups and all(b["max_tokens"] == MAX_TOKENS for b in warm_ups)  # budgeted as the keystrokes
    assert not any(name in b for b in sent for name in SERVER_SETTINGS)  # the server's configuration
    warmed = [b for b in warm_ups if lab.request_end(b["request_id"])[0] == "warm_up"]
    assert warmed, [lab.request_end(b["request_id"]) for b in warm_ups]  # one ran to its end
    completer = Completer(str(root))  # the server's own request for each body

    def prompt(body: dict[str, Any]) -> list[int]:
        return tiny_engine.fim_prompt(completer.fim_request(parse_ask(body)), MAX_TOKENS).token_ids

    warm_ids, keystroke_ids = prompt(warmed[-1]), prompt(keystroke)
    shared = shared_prefix(warm_ids, keystroke_ids)
    assert shared > len(keystroke_ids) * 0.9  # the notebook's context: most of the prompt
    outcome, _, cached = lab.request_end(keystroke["request_id"])
    assert outcome != "failed" and cached is not None and cached >= shared - 1


def test_enter_at_the_end_of_a_line_shows_ghost_text_for_the_next_line(
    lab, lab_project, browser, tiny_engine: StarCoderEngine
):
    """Enter after a block's head: the editor indents the new line, and its ghost text comes without
    another keystroke (JupyterLab itself asks nothing on a blank line): what ``engine.infill`` gives
    for the cell up to the indent."""
    root, cell = lab_project
    notebook = json.loads((root / NOTEBOOK).read_text())
    notebook["cells"][cell]["source"] = ""
    (root / ENTER_NOTEBOOK).write_text(json.dumps(notebook))
    answers = {
        head: expected_middle(tiny_engine, root, notebook, cell, head + "\n" + INDENT, ENTER_NOTEBOOK)
        for head in BLOCK_HEADS
    }
    head, middle = shown_as_is(answers)

    def drive(chromium: Any) -> list[dict[str, Any]]:
        page = chromium.new_page(viewport={"width": 1100, "height": 820})
        sent: list[dict[str, Any]] = []
        page.on("request", lambda r: sent.append(r.post_data_json) if ROUTE in r.url else None)
        try:
            open_notebook(page, lab, ENTER_NOTEBOOK, cells=cell + 1)
            edit_cell(page, cell)
            page.keyboard.type(head, delay=60)
            page.keyboard.press("Enter")
            assert cell_text(page, cell) == head + "\n" + INDENT  # indented by the editor
            page.wait_for_function(
                "expected => document.querySelector('.jp-GhostText')?.textContent === expected",
                arg=middle,
                timeout=GHOST_MS,
                polling=100,
            )
            assert cell_text(page, cell) == head + "\n" + INDENT  # nothing typed after Enter
            page.keyboard.press("Tab")
            page.wait_for_function(
                "() => !document.querySelector('.jp-GhostText')?.textContent", timeout=GHOST_MS
            )
            assert cell_text(page, cell) == head + "\n" + INDENT + middle
            return list(sent)
        finally:
            page.close()

    sent = browser(drive)
    after_enter = [b for b in sent if not b.get("warm_up") and b["prefix"] == head + "\n" + INDENT]
    assert after_enter and after_enter[-1]["path"] == ENTER_NOTEBOOK


def test_with_no_model_the_user_is_told_once_how_to_fix_it_and_no_ghost_text_appears(
    lab_project, browser, tmp_path_factory: pytest.TempPathFactory
):
    """The server's configured model cannot be had (a folder not there): the notebook's warm-up and
    each keystroke get 503 ``no_model``; JupyterLab shows one notification with the commands that fix
    it, and no ghost text."""
    root, cell = lab_project
    missing = root / "no-such-checkpoint"

    def drive(chromium: Any) -> tuple[list[str], list[int], str]:
        page = chromium.new_page(viewport={"width": 1100, "height": 820})
        statuses: list[int] = []
        page.on("response", lambda r: statuses.append(r.status) if ROUTE in r.url else None)
        try:
            open_notebook(page, nomodel, NOTEBOOK, cells=cell + 1)
            edit_cell(page, cell)
            for word in ("x = ", "values"):  # two keystroke pauses: two answers of 503
                page.keyboard.type(word, delay=60)
                before = statuses.count(503)
                _until(page, lambda before=before: statuses.count(503) > before)
            page.wait_for_selector(".Toastify__toast", timeout=PAGE_MS)
            page.wait_for_timeout(500)  # a second notification would be on the page by now
            toasts = page.locator(".Toastify__toast").all_inner_texts()
            return (
                toasts,
                statuses,
                page.evaluate("document.querySelector('.jp-GhostText')?.textContent ?? ''"),
            )
        finally:
            page.close()

    with configured_lab(root, tmp_path_factory.mktemp("nomodel-home"), missing) as nomodel:
        toasts, statuses, ghost = browser(drive)
    told = [toast for toast in toasts if "StarCoder" in toast]
    assert len(told) == 1, toasts
    assert "--StarCoderJupyter.model=DIR" in told[0] and "build-test-model DIR" in told[0], told
    assert statuses.count(503) >= 2 and ghost == ""


def _warmed(lab: JupyterLab, body: dict[str, Any]) -> bool:
    """Whether the warm-up request ``body`` ran to its end (the extension's log says so)."""
    pattern = rf"'{re.escape(body['request_id'])}' for .* ended \(warm_up\)"
    return re.search(pattern, lab.log_text()) is not None


def _ended(lab: JupyterLab, body: dict[str, Any]) -> bool:
    """Whether the request ``body`` has ended, however (the extension's log says so)."""
    return re.search(rf"'{re.escape(body['request_id'])}' for .* ended \(", lab.log_text()) is not None


def _until(page: Any, condition: Callable[[], bool]) -> None:
    """Wait (letting the page's events run) until ``condition`` holds."""
    deadline = time.monotonic() + PAGE_MS / 1000
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        page.wait_for_timeout(100)


def _saved_source(path: Path, cell: int, timeout: float) -> str:
    """The cell's source once the notebook on disk has it (the save is asynchronous)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(json.JSONDecodeError):  # read while being written: try again
            source = json.loads(path.read_text())["cells"][cell]["source"]
            source = "".join(source) if isinstance(source, list) else source
            if source or time.monotonic() > deadline:
                return source
        assert time.monotonic() < deadline, f"{path} was not saved"
        time.sleep(0.2)


def test_the_jupyter_benchmark_runs_end_to_end_on_tiny(tmp_path: Path):
    """``python -m benchmarks --only jupyter`` (issue 30's figures): on the tiny preset its rows hold
    real samples, every keystroke pause showed ghost text, its goal is the 10% + 15 ms budget, and the
    first keystroke in a cell is timed with and without a warm-up."""
    assert BENCHMARKS["jupyter"] is bench_jupyter and "jupyter" in OPTIONAL
    ctx = Context(Checkpoints(tmp_path, tiny=True, log=lambda _: None), reps=1, warmup=0)
    section = bench_jupyter(ctx)
    assert section.skipped is None
    (figures,) = section.data.values()
    assert figures["misses"] == 0 and len(figures["latencies_s"]) == ctx.size(20, 10, 4)
    assert 0 < figures["latency_p50_s"] <= figures["latency_p95_s"]
    latency, overhead, warm_up = section.rows
    assert latency.goal is None and all(s > 0 for s in latency.a_samples + latency.b_samples)
    assert len(warm_up.a_samples) == len(warm_up.b_samples) == 3  # reps 1: three tries of each
    assert all(s > 0 for s in warm_up.a_samples + warm_up.b_samples)
    median = overhead.b_median
    assert overhead.goal == ("<=", round((1.1 * median + 0.015) / median, 3))
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0 and percentile([3.0, 1.0, 2.0, 4.0], 95) == 4.0
