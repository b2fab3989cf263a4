"""The server extension's settings, from Jupyter's own configuration (never from a request).

In ``jupyter_server_config.py``::

    c.StarCoderJupyter.base_url = "http://127.0.0.1:8080"

or on the command line: ``jupyter lab --StarCoderJupyter.base_url=http://127.0.0.1:8080``.
"""

from __future__ import annotations

from typing import Any

from traitlets import TraitError, Unicode, validate
from traitlets.config import Configurable


class StarCoderJupyter(Configurable):
    """Where the Jupyter server's completions are generated: what a request may not choose."""

    base_url = Unicode(
        None,
        allow_none=True,
        config=True,
        help="A server to generate on (langchain-starcoder serve, llama.cpp's llama-server or vLLM), "
        "e.g. http://127.0.0.1:8080; None: the model runs in the Jupyter server's process. JupyterLab's "
        "model setting then names the served model, whose tokenizer is read here.",
    )

    @validate("base_url")
    def _http_url(self, proposal: dict[str, Any]) -> str | None:
        value = proposal["value"]
        if value is not None and not value.startswith(("http://", "https://")):
            msg = f"StarCoderJupyter.base_url must be an http:// or https:// URL, not {value!r}."
            raise TraitError(msg)
        return value or None
