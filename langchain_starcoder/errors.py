"""Errors raised by langchain-starcoder. Each says what is wrong and what to do about it."""

from __future__ import annotations


class StarCoderError(Exception):
    """Base class of every error this package raises on purpose."""


class ModelNotFoundError(StarCoderError, FileNotFoundError):
    """The model folder or hub id does not exist, or cannot be reached."""


class UnsupportedModelError(StarCoderError, ValueError):
    """The checkpoint is of another architecture, or uses a feature this package does not run."""


class CheckpointError(StarCoderError):
    """The checkpoint is incomplete, corrupted or unsafe (pickled weights)."""


class InvalidParameterError(StarCoderError, ValueError):
    """A setting or request parameter is out of range or of the wrong type."""


class GrammarError(InvalidParameterError):
    """A ``json_schema``, ``regex`` or ``grammar`` that is invalid, or too big or too complex for the
    grammar engine's limits; raised before any decoding (or when a limit is hit while decoding)."""


class ContextLengthError(InvalidParameterError):
    """The prompt plus the tokens to generate do not fit in the model's context window."""


class EngineClosedError(StarCoderError):
    """The engine was closed; load a new one."""


#: What an import of the LlamaIndex surfaces says when the ``llama-index`` extra is not installed.
LLAMA_INDEX_MISSING = (
    "The LlamaIndex surfaces need llama-index-core, which the LangChain package does not install: "
    'pip install -e ".[llama-index]" in a checkout of langchain-starcoder (or pip install llama-index-core).'
)
