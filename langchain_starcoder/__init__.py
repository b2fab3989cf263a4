"""StarCoder2 code models on MLX, for LangChain and LlamaIndex."""

# First, before anything imports MLX: the opt-in optimized BLAS (LANGCHAIN_STARCODER_BLAS).
from .blas import configure_from_env as _configure_blas

_configure_blas()

from .chat_models import ChatStarCoder
from .engine import StarCoderEngine
from .errors import (
    CheckpointError,
    ContextLengthError,
    EngineClosedError,
    InvalidParameterError,
    ModelNotFoundError,
    StarCoderError,
    UnsupportedModelError,
)
from .fim import FIMPrompt, build_fim_prompt
from .llms import StarCoderLLM
from .prompts import FIMPromptTemplate, StarCoderPromptTemplate
from .types import Completion, CompletionChunk, ContextFile, FIMRequest, GenerationParams

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
    "InvalidParameterError",
    "ModelNotFoundError",
    "StarCoderEngine",
    "StarCoderError",
    "StarCoderLLM",
    "StarCoderPromptTemplate",
    "UnsupportedModelError",
    "build_fim_prompt",
]
