"""Fill-in-the-middle prompts, one concern a module:

- :mod:`.request`: the request (the hole, its context, where the middle ends), checked on construction.
- :mod:`.layout`: the control tokens and where each part goes (PSM, SPM, the repository layouts),
  :class:`FIMPrompt`, the tokens an infill stops at.
- :mod:`.budget`: how many tokens a prompt may have (the one rule every surface uses).
- :mod:`.fitting`: what of the hole and the context files fits the budget.
- :mod:`.build`: :func:`build_fim_prompt`, the steps above in order.
- :mod:`.overlap`: the suffix overlap a middle must not repeat.
"""

from ..types import DEFAULT_MAX_TOKENS
from .build import build_fim_prompt, fim_stop_token_ids
from .layout import FIM_STOP_TOKENS, STARCODER_METADATA_TOKENS, FIMPrompt, MissingFIMTokensError
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
