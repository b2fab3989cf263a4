"""A real ``jupyter lab`` on 127.0.0.1 with the package's server extension and labextension, for the
JupyterLab tests and the ``jupyter`` benchmark: its own token, a model, settings and config folders of
its own (a user's ~/.jupyter never applies), stopped by its own pid (and the process group it leads,
where its kernels run)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from .servers import free_port

#: The labextension's settings plugin (labextension/schema/plugin.json).
SETTINGS_PLUGIN = ("@langchain-starcoder", "jupyterlab", "plugin")
NOTIFICATIONS_PLUGIN = ("@jupyterlab", "apputils-extension", "notification")


class JupyterLab:
    """``python -m jupyterlab`` serving ``root`` with ``model`` as ``$LANGCHAIN_STARCODER_MODEL``.

    ``settings`` are the labextension's (``maxTokens``, ``debounceMs``...), written as the user's
    settings file; ``env`` adds to the server's environment; ``log`` gets the server's output at DEBUG
    level (the extension logs how each request ended there).
    """

    def __init__(
        self,
        root: Path,
        home: Path,
        *,
        model: str | os.PathLike[str],
        settings: dict[str, Any],
        env: dict[str, str] | None = None,
    ):
        self.root, self.home = Path(root), Path(home)
        self.env = env or {}
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = self.home / "jupyter.log"
        self.model = os.fspath(model)
        self.settings = settings
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 300) -> JupyterLab:
        folders = {name: self.home / name for name in ("config", "data", "runtime", "settings", "workspaces")}
        for folder in folders.values():
            folder.mkdir(parents=True, exist_ok=True)
        for (owner, package, name), values in (
            (SETTINGS_PLUGIN, self.settings),
            (NOTIFICATIONS_PLUGIN, {"fetchNews": "false", "checkForUpdates": False}),  # no news toast
        ):
            plugin = folders["settings"] / owner / package / f"{name}.jupyterlab-settings"
            plugin.parent.mkdir(parents=True, exist_ok=True)
            plugin.write_text(json.dumps(values))
        env = {
            **os.environ,
            "LANGCHAIN_STARCODER_MODEL": self.model,
            "JUPYTER_CONFIG_DIR": str(folders["config"]),
            "JUPYTER_RUNTIME_DIR": str(folders["runtime"]),
            "JUPYTERLAB_SETTINGS_DIR": str(folders["settings"]),
            "JUPYTERLAB_WORKSPACES_DIR": str(folders["workspaces"]),
            "HF_HUB_OFFLINE": "1",
            **self.env,
        }
        command = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            "--ServerApp.log_level=DEBUG",
            "--allow-root",  # CI containers run as root
            # Nothing from the network: no news feed, update check or extension listing.
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.extension_manager=readonly",
        ]
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root, start_new_session=True
            )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                msg = f"jupyter lab did not start:\n{self.log_text()[-3000:]}"
                raise RuntimeError(msg)
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.url}api/status", headers=self.auth, timeout=5).status_code == 200:
                    return
            time.sleep(0.3)

    @property
    def auth(self) -> dict[str, str]:
        """The header of a client that has the server's token."""
        return {"Authorization": f"token {self.token}"}

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.is_file() else ""

    def request_end(self, request_id: str, timeout: float = 120) -> tuple[str, int, int | None]:
        """How the extension's request ``request_id`` ended, after how many tokens, and how many of its
        prompt's tokens the engine's cache held (from the line it logs when a request ends)."""
        pattern = re.compile(
            rf"request '{re.escape(request_id)}' for .* ended \((\w+)\) after (\d+) tokens \((\w+) prompt"
        )
        deadline = time.monotonic() + timeout
        while not (found := pattern.search(self.log_text())):
            assert time.monotonic() < deadline, self.log_text()[-3000:]
            time.sleep(0.1)
        cached = found.group(3)
        return found.group(1), int(found.group(2)), None if cached == "None" else int(cached)

    def stop(self) -> None:
        """SIGTERM (Jupyter's own shutdown: kernels too), then SIGKILL to the group it leads."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group it leads (start_new_session): kernels left
        self.proc.wait(10)

    def __enter__(self) -> JupyterLab:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


#: The example project's notebook, and the index of its last (empty) code cell: where tests type.
NOTEBOOK = "analysis.ipynb"
GEOMETRY = "PI = 3.14159\n\n\ndef circle_area(radius: float) -> float:\n    return PI * radius**2\n"


def write_project(root: Path) -> tuple[Path, int]:
    """A small project in ``root``: ``pkg/geometry.py`` and :data:`NOTEBOOK`, whose cells import it and
    hold outputs of every kind (stream, a result, an error in ANSI colours, an image), then an empty
    code cell. Returns the notebook's path and the index of that last cell."""
    import nbformat
    from nbformat import v4

    (root / "pkg").mkdir(parents=True, exist_ok=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "geometry.py").write_text(GEOMETRY)
    notebook = v4.new_notebook(
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
        }
    )
    out = v4.new_output
    error = "\x1b[31mNameError\x1b[0m: name 'area' is not defined"
    figure = {
        "image/png": _plot_png([1, 2, 3], [3.14, 12.57, 28.27]),
        "text/plain": "<Figure size 400x150 with 1 Axes>",
    }
    notebook.cells = [
        v4.new_markdown_cell("# Areas\nCircle areas from `pkg.geometry`."),
        v4.new_code_cell(
            "from pkg.geometry import circle_area\nradii = [1, 2, 3]\nprint(len(radii))",
            outputs=[out("stream", name="stdout", text="3\n")],
        ),
        v4.new_code_cell(
            "areas = [circle_area(r) for r in radii]\nareas",
            outputs=[out("execute_result", data={"text/plain": "[3.14, 12.57, 28.27]"}, execution_count=2)],
        ),
        v4.new_code_cell(
            "total = sum(area)",
            outputs=[out("error", ename="NameError", evalue="name 'area' is not defined", traceback=[error])],
        ),
        v4.new_code_cell(
            "import matplotlib.pyplot as plt\nplt.plot(radii, areas)",
            outputs=[out("display_data", data=figure)],
        ),
        v4.new_code_cell(""),
    ]
    path = root / NOTEBOOK
    nbformat.write(notebook, path)
    return path, len(notebook.cells) - 1


def _plot_png(x: list[float], y: list[float]) -> str:
    """A small line plot as base64 PNG (what a notebook stores for a matplotlib figure)."""
    import base64
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(4, 1.5), dpi=60)
    axes.plot(x, y, marker="o")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


# --- in the browser (a Playwright page) -----------------------------------------------------------------

#: Generous waits for a loaded machine: they bound a failure, a pass never waits them out.
PAGE_TIMEOUT_MS = 300_000


def open_notebook(page: Any, lab: JupyterLab, path: str, cells: int) -> None:
    """Open notebook ``path`` (relative to the root) in JupyterLab and wait until its ``cells`` cells
    are on the page. The notebook gets a workspace of its own: JupyterLab would restore the documents
    an earlier page opened beside it, and their cells would match the tests' selectors too."""
    workspace = re.sub(r"[^A-Za-z0-9]", "-", path)
    page.goto(f"{lab.url}lab/workspaces/{workspace}/tree/{path}?token={lab.token}", timeout=PAGE_TIMEOUT_MS)
    page.wait_for_function(
        "n => document.querySelectorAll('.jp-Notebook .jp-Cell').length === n",
        arg=cells,
        timeout=PAGE_TIMEOUT_MS,
    )


def edit_cell(page: Any, index: int) -> None:
    """Put the cursor in cell ``index``'s editor and wait until it has the focus (typed keys then go to
    the cell, not to the notebook's command mode, where letters are shortcuts)."""
    page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".cm-content").click()
    page.wait_for_function(
        "i => document.activeElement?.classList.contains('cm-content') && document.activeElement"
        ".closest('.jp-Cell') === document.querySelectorAll('.jp-Notebook .jp-Cell')[i]",
        arg=index,
        timeout=PAGE_TIMEOUT_MS,
    )


def cell_text(page: Any, index: int) -> str:
    """The text of cell ``index``'s editor (its lines joined by newlines), ghost text left out."""
    return editor_text(page, ".jp-Notebook .jp-Cell", index)


def editor_text(page: Any, container: str, index: int = 0) -> str:
    """The text of the editor in the ``index``-th element matching ``container`` (a CSS selector), its
    lines joined by newlines, ghost text left out."""
    return page.evaluate(
        """([container, i]) => [...document.querySelectorAll(container)[i].querySelectorAll('.cm-line')]
            .map(line => {
              const copy = line.cloneNode(true);
              copy.querySelectorAll('.jp-GhostText').forEach(ghost => ghost.remove());
              return copy.textContent;
            }).join('\\n')""",
        [container, index],
    )
