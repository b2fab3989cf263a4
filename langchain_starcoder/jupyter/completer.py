"""What the completion handler needs from the package: the engine the server's configuration names, the
fill-in-the-middle request it makes (notebook or repository context), and which request is the newest
for each user's document.

The package's heavy modules (the engine, MLX) are imported on the first request, so that the Jupyter
server starts as fast without them.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .protocol import CompletionAsk, RequestError

if TYPE_CHECKING:
    from ..engine import StarCoderEngine
    from ..fim.build import FIMPrompt
    from ..fim.request import FIMRequest
    from ..repo import RepoIndex

#: A running request: how to cancel it, and whether it is a warm-up.
_Running = tuple[Callable[[str], None], bool]
_log = logging.getLogger(__name__)


#: The commands that fix "no model" (a checkpoint, or one of random weights built offline).
FIX = (
    "Point the Jupyter server at a model: `jupyter lab --StarCoderJupyter.model=DIR` (a checkpoint folder, "
    ".gguf file or hub id; or c.StarCoderJupyter.model in jupyter_server_config.py). Without one, "
    "`langchain-starcoder build-test-model DIR` builds a small checkpoint of random weights offline (its "
    "ghost text is nonsense)."
)
#: What JupyterLab's notification says (it shows 140 characters at most).
NOTICE = (
    "No StarCoder model: jupyter lab --StarCoderJupyter.model=DIR (a checkpoint; offline: "
    "langchain-starcoder build-test-model DIR)"
)


class NoModelError(RequestError):
    """The configured model cannot be had (a hub id offline, a missing folder): 503, with :data:`FIX`
    and the fields that let the labextension tell the user once."""

    def __init__(self, reason: str):
        super().__init__(f"No model is available to the Jupyter server: {reason} {FIX}", status=503)
        self.fields = {"code": "no_model", "notice": NOTICE}


@dataclass(frozen=True)
class EngineSettings:
    """The engine the Jupyter server's configuration names (:class:`~.config.StarCoderJupyter`)."""

    model: str | None = None
    """None: ``$LANGCHAIN_STARCODER_MODEL`` as the server was started, else the package's default."""
    backend: str = "mlx"
    gguf_file: str | None = None
    base_url: str | None = None
    """Where every request generates; None: in this process."""
    offline_test_model: bool = False
    """A model that cannot be had is replaced by a small checkpoint of random weights (else an error)."""


class Completer:
    """The server's one engine (loaded on first use from its :class:`EngineSettings`, closed by
    :meth:`close`), the server root's repository index, and the newest request of each user's document
    (an older one is superseded)."""

    def __init__(self, root_dir: str, settings: EngineSettings | None = None):
        self.root_dir = root_dir
        self.settings = settings or EngineSettings()
        self._lock = threading.Lock()
        self._engine_lock = threading.Lock()  # held while loading: one engine, never two
        self._engine: StarCoderEngine | None = None
        self._closed = False
        self._repo: RepoIndex | None = None
        #: The running requests of each (user, document path), oldest first.
        self._running: dict[tuple[str, str], list[_Running]] = {}

    # --- the engine -----------------------------------------------------------------------------

    def engine(self) -> StarCoderEngine:
        """The server's engine, loaded (or connected) on first use; :class:`NoModelError` when the
        configured model cannot be had. Blocking: call it in a thread."""
        with self._engine_lock:
            if self._closed:
                raise RequestError("The Jupyter server is stopping.", status=503)
            if self._engine is None:
                self._engine = self._open()
            return self._engine

    def model(self) -> str:
        """The configured model, else ``$LANGCHAIN_STARCODER_MODEL``, else the package's default."""
        from .._registry import DEFAULT_MODEL
        from ..testing import MODEL_ENV

        return self.settings.model or os.environ.get(MODEL_ENV) or DEFAULT_MODEL

    def _open(self) -> StarCoderEngine:
        from ..engine import StarCoderEngine
        from ..errors import ModelNotFoundError

        s, model = self.settings, self.model()
        try:
            if s.base_url is not None:
                return StarCoderEngine.connect(s.base_url, model=model)
            return StarCoderEngine.load(model, backend=s.backend, gguf_file=s.gguf_file)
        except ModelNotFoundError as e:
            if not s.offline_test_model or s.base_url is not None:  # no stand-in for a served model
                raise NoModelError(str(e)) from None
        from ..testing import model_or_offline

        # Asked for by the configuration only: random weights, said in the server's log.
        stand_in = model_or_offline(model, default=model)
        _log.warning("langchain-starcoder: %s cannot be had: random weights from %s", model, stand_in)
        return StarCoderEngine.load(stand_in)

    def close(self) -> None:
        """Release the engine (weights, llama-server, connection); later requests are refused."""
        with self._engine_lock:
            self._closed = True
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()

    def prepare(self, ask: CompletionAsk) -> tuple[StarCoderEngine, FIMRequest, FIMPrompt]:
        """The engine, the request and its prompt, in one thread hop (each hop is a wake-up of a thread:
        on a busy machine, milliseconds). Blocking: call it in a thread."""
        engine, request = self.engine(), self.fim_request(ask)
        return engine, request, engine.fim_prompt(request, ask.max_tokens)

    # --- the prompt's context -------------------------------------------------------------------

    def fim_request(self, ask: CompletionAsk) -> FIMRequest:
        """The request as the engine takes it: the live notebook's cells around the hole's cell, and, with
        ``repo_context``, the server root's repository context for the document's path. Blocking (the
        first repository scan reads the root's files): call it in a thread."""
        from ..fim.request import FIMRequest
        from ..notebook import NotebookContext

        notebook = None
        if ask.notebook is not None:
            assert ask.cell is not None  # parse_ask requires it with a notebook
            notebook = NotebookContext.from_notebook(ask.notebook, ask.cell, path=ask.path or None)
        repo = self.repo() if ask.repo_context and ask.path else None
        return FIMRequest(
            ask.prefix, ask.suffix, notebook=notebook, repo=repo, file_path=ask.path if repo else None
        )

    def repo(self) -> RepoIndex:
        """The index of the server's root, scanned on first use and kept fresh by the index itself."""
        from ..repo import RepoIndex

        with self._lock:
            if self._repo is None:
                self._repo = RepoIndex(self.root_dir)
            return self._repo

    # --- supersession (on the event loop's thread only) --------------------------------------------

    def newest(self, user: str, path: str, cancel: Callable[[str], None], *, warm_up: bool = False) -> None:
        """``cancel`` is ``user``'s newest request for ``path``: that user's older ones still running
        are superseded (another user's, on a shared server, never), except that a warm-up never
        supersedes an answer someone waits for (as the server's /infill)."""
        if not path:
            return  # a document without a path cannot be told apart from another
        running = self._running.setdefault((user, path), [])
        superseded = [r for r in running if r[1] or not warm_up]
        running[:] = [r for r in running if r not in superseded] + [(cancel, warm_up)]
        for older, _ in superseded:
            older("superseded")

    def ended(self, user: str, path: str, cancel: Callable[[str], None]) -> None:
        running = self._running.get((user, path), [])
        running[:] = [r for r in running if r[0] != cancel]
        if not running:
            self._running.pop((user, path), None)
