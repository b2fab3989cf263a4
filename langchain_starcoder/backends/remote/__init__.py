"""The remote backend: a serving engine given token ids, streaming token ids back.

The front keeps everything about text (tokenizer, FIM and chat prompts, budgets, stop strings,
detokenization, counts) and sends the server **token ids**, never text: a server re-tokenizes text
with special-token parsing on, so a ``<file_sep>`` inside a user's file would become a control token.

Two protocols, chosen at connect from what ``/v1/models`` reports: llama.cpp's ``llama-server``
(``llama_cpp``) and vLLM (``vllm``). They share the transport (``transport``: client, time bounds,
retries, bounded reading, errors), the checks of the numbers a server sends (``validation``) and the
reading of a generation's stream (``protocol``); ``backend`` ties them together behind the backend
contract.
"""

from .backend import RemoteBackend, ServerBackend
from .errors import ServerDisconnectedError, ServerError, ServerTimeoutError, ServerUnavailableError
from .llama_cpp import MAX_WITHHELD
from .llama_cpp import _split as _split  # the tests check it against plain backtracking

__all__ = [
    "MAX_WITHHELD",
    "RemoteBackend",
    "ServerBackend",
    "ServerDisconnectedError",
    "ServerError",
    "ServerTimeoutError",
    "ServerUnavailableError",
]
