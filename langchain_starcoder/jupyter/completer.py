"""What the completion handler needs from the package: the engine the server's configuration names, the
fill-in-the-middle request it makes (notebook or repository context), and the editor session that says
which request supersedes which (a document of each Jupyter user's path, as the HTTP server's).

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

from ..editor import Claim, EditorSessions
from .protocol import CompletionAsk, RequestError

if TYPE_CHECKING:
    from ..engine import StarCoderEngine
    from ..fim.build import FIMPrompt
    from ..fim.request import FIMRequest
    from ..repo import RepoIndex

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
        msg = f"No model is available to the Jupyter server: {reason} {FIX}"
        super().__init__(msg, status=503, code="no_model", notice=NOTICE)


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
    :meth:`close`), the server root's repository index, and the editor session whose documents are each
    user's paths (a newer request supersedes the older)."""

    def __init__(self, root_dir: str, settings: EngineSettings | None = None):
        self.root_dir = root_dir
        self.settings = settings or EngineSettings()
        self._lock = threading.Lock()
        self._engine_lock = threading.Lock()  # held while loading: one engine, never two
        self._engine: StarCoderEngine | None = None
        self._closed = False
        self._repo: RepoIndex | None = None
        #: Supersession of each (user, path) document, by the server's rule. Only that: the labextension
        #: sends the whole text before the cursor (no window slides, so no stable prefix), and the answer
        #: is engine.infill's with the repository's context as its index ranks it (no kept order).
        self.sessions = EditorSessions(stable_prefix=False)

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

    def newest(self, user: str, path: str, cancel: Callable[[str], None], *, warm_up: bool = False) -> Claim:
        """The claim of ``user``'s newest request for ``path``, which ``cancel`` stops: that user's older
        ones still running are superseded (another user's, on a shared server, never), except that a
        warm-up never supersedes an answer someone waits for (the server's rule, editor/supersede.py).
        A request without a path claims nothing. Release it with :meth:`ended`."""
        claim = self.sessions.claim(self.sessions.document(user, path), warm_up=warm_up)
        claim.on_supersede(lambda: cancel("superseded"))
        return claim

    def ended(self, claim: Claim) -> None:
        """The request of ``claim`` ended: a newer one supersedes it no more."""
        self.sessions.release(claim)
