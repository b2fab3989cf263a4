"""StarCoderEngine, the front: text and prompts in, token ids to a backend, text chunks out.

:mod:`.front` holds the class (its public methods are the API); :mod:`.building` builds its
backend and tokenizer, :mod:`.jobs` prepares requests and hands them to the backend, and
:mod:`.fim_prompts` builds FIM prompts within the budget, with repository context. The dependency
is one-way: ``front`` imports the other three, which take what they need (a backend, a tokenizer,
a context window) and never import ``front`` (``tests/unit/test_architecture.py`` checks it).
"""

from ..types import GenerationParams
from .building import _token_bytes
from .fim_prompts import repo_relative_path
from .front import StarCoderEngine
from .jobs import Prompt

__all__ = [
    "GenerationParams",
    "Prompt",
    "StarCoderEngine",
    "_token_bytes",
    "repo_relative_path",
]
