"""StarCoderEngine, the front: text and prompts in, token ids to a backend, text chunks out.

:mod:`.front` holds the class (its public methods are the API); :mod:`.building` builds its
backend and tokenizer, :mod:`.prepare` makes a request a complete job (with :mod:`.checks` and
:mod:`.fim_prompts`, which builds FIM prompts within the budget, with repository context), and
:mod:`.jobs` hands jobs to the backend. The dependency is one-way: ``front`` imports the others,
which take what they need (a backend, a tokenizer, a context window) and never import ``front``
(``tests/unit/test_architecture.py`` checks it).
"""

from ..types import GenerationParams
from .building import _token_bytes
from .fim_prompts import repo_relative_path
from .front import StarCoderEngine
from .prepare import Prompt

__all__ = [
    "GenerationParams",
    "Prompt",
    "StarCoderEngine",
    "_token_bytes",
    "repo_relative_path",
]
