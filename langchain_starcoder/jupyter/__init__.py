"""JupyterLab inline completion: a Jupyter server extension that answers the package's labextension.

``pip install -e ".[jupyter]"`` then ``jupyter lab``: the labextension (its TypeScript in the repository's
``labextension/``, its prebuilt bundle in ``labextension/`` here) asks
``POST {base_url}langchain-starcoder/complete`` for the middle of the cursor's hole, with the live
notebook (StarCoder2's structured-notebook context) or the file's repository context, and shows it as
ghost text while it streams (docs/jupyter.md, "Inline completion in JupyterLab").

The model, its backend and where it runs are the Jupyter server's configuration
(:class:`~.config.StarCoderJupyter`: ``jupyter lab --StarCoderJupyter.model=DIR``). Jupyter imports this
module to find the extension: it imports nothing heavy (MLX and the engine load on the first request).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: The labextension's npm name (``labextension/package.json``): the folder JupyterLab serves it from.
LABEXTENSION_NAME = "@langchain-starcoder/jupyterlab"
#: The prebuilt bundle shipped in the package (the wheel also installs it as shared data).
LABEXTENSION_DIR = Path(__file__).resolve().parent / "labextension"


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    # The app (an ExtensionApp) holds the configuration and is stopped with the server (its engine closed).
    from .config import StarCoderJupyter

    return [{"module": "langchain_starcoder.jupyter", "app": StarCoderJupyter}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the prebuilt bundle is, for ``jupyter labextension develop`` and tools that read it."""
    return [{"src": "labextension", "dest": LABEXTENSION_NAME}]
