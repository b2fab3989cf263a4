"""Fill-in-the-middle prompts: the request, its layouts (PSM, SPM, StarCoder2's repository format), the
budget a prompt is cut to, fitting files into it, and the suffix overlap a middle must not repeat."""

from .build import (
    DEFAULT_MAX_TOKENS,
    FIM_STOP_TOKENS,
    STARCODER_METADATA_TOKENS,
    FIMPrompt,
    MissingFIMTokensError,
    build_fim_prompt,
    fim_stop_token_ids,
)
from .request import ContextFile, FIMRequest

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "FIM_STOP_TOKENS",
    "STARCODER_METADATA_TOKENS",
    "ContextFile",
    "FIMPrompt",
    "FIMRequest",
    "MissingFIMTokensError",
    "build_fim_prompt",
    "fim_stop_token_ids",
]
