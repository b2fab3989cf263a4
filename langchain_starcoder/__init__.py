"""StarCoder2 code models on MLX, for LangChain and LlamaIndex."""

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

__all__ = [
    "CheckpointError",
    "Completion",
    "CompletionChunk",
    "ContextLengthError",
    "EngineClosedError",
    "GenerationParams",
    "InvalidParameterError",
    "ModelNotFoundError",
    "StarCoderEngine",
    "StarCoderError",
    "UnsupportedModelError",
]
