"""What the completion handler needs from the package: the engine a request's settings name, the
fill-in-the-middle request it makes (notebook or repository context), and which request is the newest
for each user's document.

The package's heavy modules (the engine, MLX) are imported on the first request, so that the Jupyter
server starts as fast without them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from .protocol import CompletionAsk

if TYPE_CHECKING:
    from ..engine import StarCoderEngine
    from ..fim import FIMPrompt
    from ..fim_request import FIMRequest
    from ..repo import RepoIndex

#: A running request: how to cancel it, and whether it is a warm-up.
_Running = tuple[Callable[[str], None], bool]


class Completer:
    """Engines (one per checkpoint and settings, from the package's registry), the server root's
    repository index, and the newest request of each user's document (an older one is superseded).

    ``base_url`` (the server's configuration, :class:`~.config.StarCoderJupyter`) is where every
    request generates; None: in this process.
    """

    def __init__(self, root_dir: str, base_url: str | None = None):
        self.root_dir = root_dir
        self.base_url = base_url
        self._lock = threading.Lock()
        self._default_model: str | None = None
        self._repo: RepoIndex | None = None
        #: The running requests of each (user, document path), oldest first.
        self._running: dict[tuple[str, str], list[_Running]] = {}

    # --- engines --------------------------------------------------------------------------------

    def engine(self, ask: CompletionAsk) -> StarCoderEngine:
        """The shared engine for the request's settings, loaded (or connected) on first use. Blocking:
        call it in a thread.

        The model is the request's (JupyterLab's settings), else ``$LANGCHAIN_STARCODER_MODEL``, else the
        package's default, which falls back to a small offline checkpoint without hub access (as the
        examples do). With the server's ``base_url`` the model names the served model and where the
        tokenizer is (the request's backend does not apply).
        """
        from ..registry import get_engine

        model = ask.model or self.default_model(remote=self.base_url is not None)
        if self.base_url is not None:
            return get_engine(model, base_url=self.base_url)
        return get_engine(model, backend=ask.backend)

    def default_model(self, *, remote: bool = False) -> str:
        """``$LANGCHAIN_STARCODER_MODEL`` or the package's default (for a local engine, resolved once:
        downloaded, or replaced by the offline checkpoint)."""
        from ..registry import DEFAULT_MODEL
        from ..testing import MODEL_ENV, model_or_offline

        if remote:  # only the tokenizer is read: nothing to download or build here
            return os.environ.get(MODEL_ENV) or DEFAULT_MODEL
        with self._lock:
            if self._default_model is None:
                self._default_model = model_or_offline()
            return self._default_model

    def prepare(self, ask: CompletionAsk) -> tuple[StarCoderEngine, FIMRequest, FIMPrompt]:
        """The engine, the request and its prompt, in one thread hop (each hop is a wake-up of a thread:
        on a busy machine, milliseconds). Blocking: call it in a thread."""
        engine, request = self.engine(ask), self.fim_request(ask)
        return engine, request, engine.fim_prompt(request, ask.max_tokens)

    # --- the prompt's context -------------------------------------------------------------------

    def fim_request(self, ask: CompletionAsk) -> FIMRequest:
        """The request as the engine takes it: the live notebook's cells around the hole's cell, and, with
        ``repo_context``, the server root's repository context for the document's path. Blocking (the
        first repository scan reads the root's files): call it in a thread."""
        from ..fim_request import FIMRequest
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
