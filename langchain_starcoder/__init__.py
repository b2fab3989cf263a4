"""StarCoder2 code models on MLX, for LangChain and LlamaIndex."""

# First, before anything imports MLX: the opt-in optimized BLAS (LANGCHAIN_STARCODER_BLAS).
from ._blas import configure_from_env as _configure_blas

_configure_blas()

from typing import TYPE_CHECKING, Any

from ._lazy import lazy_exports as _lazy_exports
from ._version import __version__ as __version__

if TYPE_CHECKING:
    from ._progress import show_progress
    from .chat_models import ChatStarCoder
    from .ends import MiddleEnd, middle_end
    from .engine import StarCoderEngine
    from .engine.options import LlamaCppOptions, MLXOptions, RemoteOptions
    from .errors import (
        CheckpointError,
        ContextLengthError,
        EngineClosedError,
        GrammarError,
        InvalidParameterError,
        ModelNotFoundError,
        StarCoderError,
        UnsupportedModelError,
    )
    from .fim import ContextFile, FIMPrompt, FIMRequest, build_fim_prompt
    from .llms import StarCoderLLM
    from .notebook import NotebookContext
    from .prompts import FIMPromptTemplate, StarCoderPromptTemplate
    from .repo import RepoIndex
    from .retrievers import RepoRetriever
    from .retrievers.llama_index import RepoNodeRetriever
    from .types import Completion, CompletionChunk, GenerationParams

# Public name -> the module that defines it. Imported on first use (PEP 562), so that `import
# langchain_starcoder` and the command line's --help do not pay for MLX, LangChain and LlamaIndex.
_EXPORTS = {
    "ChatStarCoder": "chat_models",
    "CheckpointError": "errors",
    "Completion": "types",
    "CompletionChunk": "types",
    "ContextFile": "fim",
    "ContextLengthError": "errors",
    "EngineClosedError": "errors",
    "FIMPrompt": "fim",
    "FIMPromptTemplate": "prompts",
    "FIMRequest": "fim",
    "GenerationParams": "types",
    "GrammarError": "errors",
    "InvalidParameterError": "errors",
    "LlamaCppOptions": "engine.options",
    "MLXOptions": "engine.options",
    "MiddleEnd": "ends",
    "ModelNotFoundError": "errors",
    "NotebookContext": "notebook",
    "RemoteOptions": "engine.options",
    "StarCoderEngine": "engine",
    "StarCoderError": "errors",
    "StarCoderLLM": "llms",
    "StarCoderPromptTemplate": "prompts",
    "RepoIndex": "repo",
    "RepoNodeRetriever": "retrievers.llama_index",
    "RepoRetriever": "retrievers",
    "UnsupportedModelError": "errors",
    "build_fim_prompt": "fim",
    "middle_end": "ends",
    "show_progress": "_progress",
}

__all__ = [
    "ChatStarCoder",
    "CheckpointError",
    "Completion",
    "CompletionChunk",
    "ContextFile",
    "ContextLengthError",
    "EngineClosedError",
    "FIMPrompt",
    "FIMPromptTemplate",
    "FIMRequest",
    "GenerationParams",
    "GrammarError",
    "InvalidParameterError",
    "LlamaCppOptions",
    "MLXOptions",
    "MiddleEnd",
    "ModelNotFoundError",
    "NotebookContext",
    "RemoteOptions",
    "RepoIndex",
    "RepoNodeRetriever",
    "RepoRetriever",
    "StarCoderEngine",
    "StarCoderError",
    "StarCoderLLM",
    "StarCoderPromptTemplate",
    "UnsupportedModelError",
    "build_fim_prompt",
    "middle_end",
    "show_progress",
]


def load_ipython_extension(shell: Any) -> None:
    """``%load_ext langchain_starcoder``: the model's completions in IPython's completer (docs/jupyter.md)."""
    from .jupyter.ipython import load_ipython_extension as load

    load(shell)


def unload_ipython_extension(shell: Any) -> None:
    from .jupyter.ipython import unload_ipython_extension as unload

    unload(shell)


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)
