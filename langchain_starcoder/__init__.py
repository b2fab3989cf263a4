"""StarCoder2 code models on MLX, for LangChain and LlamaIndex."""

# First, before anything imports MLX: the opt-in optimized BLAS (LANGCHAIN_STARCODER_BLAS).
from .blas import configure_from_env as _configure_blas

_configure_blas()

from .chat_models import ChatStarCoder
from .engine import Completion, CompletionChunk, GenerationParams, StarCoderEngine
from .errors import (
    CheckpointError,
    ContextLengthError,
    EngineClosedError,
    InvalidParameterError,
    ModelNotFoundError,
    StarCoderError,
    UnsupportedModelError,
)
from .fim import ContextFile, FIMPrompt, build_fim_prompt
from .llms import StarCoderLLM
from .prompts import FIMPromptTemplate

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
    "GenerationParams",
    "InvalidParameterError",
    "ModelNotFoundError",
    "StarCoderEngine",
    "StarCoderError",
    "StarCoderLLM",
    "UnsupportedModelError",
    "build_fim_prompt",
]
