"""llama.cpp's ``llama-server`` protocol: its native ``/completion``, which takes a list of ids as
``prompt`` and, with ``return_tokens``, streams each generated token's id (its ``/v1/completions``
streams text only). ``timings_per_token`` puts the prompt-cache hit (``cache_n``) on the first chunk.

llama.cpp does not stream a token whose text ends inside a UTF-8 character: the next chunk carries the
whole character's text, from which the held-back ids are rebuilt here.

llama-server's prompt cache takes no salt: :mod:`.shared_cache` decides which requests may reuse it.
This package's own server speaks the same protocol and partitions its cache by ``cache_salt``, which
it is then sent."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import httpx

from ...types import PENALTY_CONTEXT, GenerationParams
from .. import Generation
from ..grammar import JSON_WHITESPACE
from .constraints import llama_cpp_fields
from .errors import ServerError
from .protocol import ServerProtocol
from .shared_cache import SharedCache
from .transport import Clock, Transport

#: The most ids llama.cpp may hold back at once (its text ends inside a UTF-8 character: a few tokens,
#: more only for a run of stray lead bytes); a larger gap is refused (rebuilding costs gap * piece).
MAX_WITHHELD = 64
T = TypeVar("T", bytes, str)


class LlamaCpp(ServerProtocol):
    """Generations over llama-server's ``/completion`` stream; ``token_bytes`` rebuilds held-back ids."""

    path = "/completion"
    needs = "it needs a llama-server that supports return_tokens"
    json_whitespace = JSON_WHITESPACE  # its json-schema-to-grammar's; it ignores our compact option

    def __init__(
        self, transport: Transport, vocab_size: int, token_bytes: Mapping[bytes, int], *, salted: bool = False
    ) -> None:
        super().__init__(transport, vocab_size)
        self._token_bytes = dict(token_bytes)
        self._id_bytes = {i: b for b, i in self._token_bytes.items()}
        self.salted = salted  # the server partitions its cache by cache_salt (this package's own)
        self.shared_cache = SharedCache()

    @contextlib.contextmanager
    def request(self, gen: Generation) -> Iterator[dict[str, Any]]:
        """The body, reusing the server's KV only where :class:`.SharedCache` admits it."""
        reuse = self.salted or self.shared_cache.admit(gen)
        try:
            yield self.body(gen.prompt, gen.params, reuse=reuse)
        finally:
            self.shared_cache.settle(gen)

    def body(self, prompt: list[int], params: GenerationParams, *, reuse: bool = True) -> dict[str, Any]:
        """The request: the prompt as ids, our sampling settings, with llama.cpp's other samplers
        turned off, and the constraint (:mod:`.constraints`). Stop strings stay with the front (they
        need our detokenizer). ``reuse``: whether the server may reuse its KV for a shared prefix."""
        # Our server takes salts of at most 256 characters: the partition's digest names any salt in 32.
        salted = self.salted and params.cache_salt is not None
        salt = {"cache_salt": params.partition.digest} if salted else {}
        return {
            "prompt": prompt,
            "n_predict": params.max_tokens,
            "stream": True,
            "return_tokens": True,
            "timings_per_token": True,  # the prompt-cache hit comes with the first token
            "cache_prompt": reuse,  # reuse the server's KV for a shared prefix
            "temperature": params.temperature,  # below GREEDY_BELOW already 0 (greedy)
            "top_k": params.top_k,
            "top_p": params.top_p,
            "min_p": params.min_p,  # llama.cpp's default is 0.05, ours 0: always sent
            "repeat_penalty": params.repetition_penalty or 1.0,
            "repeat_last_n": PENALTY_CONTEXT,
            "seed": -1 if params.seed is None else _llama_seed(params.seed),
            "typical_p": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "dry_multiplier": 0.0,
            "xtc_probability": 0.0,
            "mirostat": 0,
            **llama_cpp_fields(params),  # json_schema or a GBNF grammar: the server enforces it
            **salt,
        }

    def relay(self, gen: Generation, response: httpx.Response, clock: Clock) -> None:
        """Hand each streamed id to the sink until it, the server or the budget ends it."""
        started = stopped = False
        count = 0
        ended: int | None = None  # the last chunk's cache hit (this package's server says it there only)
        for event in self._events(gen, response, clock, lambda: count):  # noqa: B023 (the count so far)
            if event.get("stop"):
                ended = self._final_cached(event, gen.prompt)
            if not started:
                self.shared_cache.settle(gen)  # its prefill is done: no later KV can reach it
                gen.sink.start(
                    self._cached(event, gen.prompt), prompt_seconds=self._prompt_seconds(event, clock)
                )
                started = True
            ids = self._token_ids(event.get("tokens"), event, clock)
            predicted = event.get("tokens_predicted")
            if predicted is not None:  # llama.cpp counts what it generated, held-back ids included
                predicted = self._check.number(predicted, "tokens_predicted", gen.params.max_tokens)
            gap = predicted - count - len(ids) if predicted is not None else 0
            if gap > MAX_WITHHELD:
                msg = (
                    f"{self.base_url} held back {gap} token ids at once; a character split across "
                    f"tokens accounts for at most {MAX_WITHHELD}."
                )
                raise ServerError(msg)
            if gap > 0 and ids:
                ids = self._withheld(event, ids, gap) + ids
            elif gap > 0 and event.get("stop"):  # it ended inside a character: those ids never came
                ids = self._stand_ins(gap)
            for token in ids:
                count += 1
                if gen.sink.token(token) or count >= gen.params.max_tokens:
                    gen.sink.finish(ended)
                    return
            if event.get("stop"):
                stopped = True
                break
        self._end(gen, stopped, count, ended)

    def _cached(self, event: dict[str, Any], prompt: list[int]) -> int:
        """llama.cpp's prompt-cache hit (``timings.cache_n``), at most the prompt."""
        timings = event.get("timings")
        cached = timings.get("cache_n") if isinstance(timings, dict) else None
        return 0 if cached is None else self._check.number(cached, "timings.cache_n", len(prompt))

    def _final_cached(self, event: dict[str, Any], prompt: list[int]) -> int | None:
        """The cache hit in the last chunk's timings; None where it says none."""
        timings = event.get("timings")
        return self._cached(event, prompt) if isinstance(timings, dict) and "cache_n" in timings else None

    def _prompt_seconds(self, event: dict[str, Any], clock: Clock) -> float | None:
        """llama.cpp's prefill time (``timings.prompt_ms``), at most the time since the request; None
        where the server does not say."""
        timings = event.get("timings")
        ms = timings.get("prompt_ms") if isinstance(timings, dict) else None
        if ms is None:
            return None
        elapsed_ms = (time.monotonic() - clock.started) * 1000
        return self._check.number(ms, "timings.prompt_ms", elapsed_ms, real=True) / 1000

    # --- held-back ids -------------------------------------------------------------------------

    @functools.cached_property
    def _by_text(self) -> dict[str, int]:
        """What a token shows (invalid bytes as U+FFFD) -> its id: built only if a stream needs it."""
        by_text: dict[str, int] = {}
        for i, b in sorted(self._id_bytes.items()):
            by_text.setdefault(b.decode("utf-8", "replace"), i)
        return by_text

    @functools.cached_property
    def _longest(self) -> int:
        """The longest token's bytes (no token shows more characters than it has bytes)."""
        return max(map(len, self._token_bytes), default=0)

    def _withheld(self, event: dict[str, Any], ids: list[int], missing: int) -> list[int]:
        """The ids of the ``missing`` tokens llama.cpp held back because their text ended inside a
        UTF-8 character: the chunk's ``content`` is their bytes followed by those of ``ids``."""
        text = event.get("content")
        tail = b"".join(self._id_bytes.get(i, b"") for i in ids)  # control tokens show no text
        data = text.encode("utf-8") if isinstance(text, str) else b""
        head = data[: len(data) - len(tail)] if data.endswith(tail) else None
        found = _split(head, missing, self._token_bytes, self._longest) if head is not None else None
        shown = tail.decode("utf-8", "replace")
        if found is None and isinstance(text, str) and text.endswith(shown) and "\ufffd" in text:
            # The model wrote invalid UTF-8, which llama-server sends as U+FFFD: the ids are lost.
            # Stand-ins: tokens that show the same text (U+FFFD included), else lone 0xFF bytes.
            shown_head = text[: len(text) - len(shown)]
            found = _split(shown_head, missing, self._by_text, self._longest) or self._stand_ins(missing)
        if found is None:
            msg = (
                f"{self.base_url} held back {missing} token ids (text ending inside a UTF-8 character) "
                "and they could not be rebuilt from the streamed text."
            )
            raise ServerError(msg)
        return found

    def _stand_ins(self, count: int) -> list[int]:
        if b"\xff" not in self._token_bytes:
            msg = (
                f"{self.base_url} ended inside a UTF-8 character without sending its last {count} token ids."
            )
            raise ServerError(msg)
        return [self._token_bytes[b"\xff"]] * count


def _llama_seed(seed: int) -> int:
    """Ours (up to 2**64 - 1) as one of llama.cpp's: 32-bit, where 0xFFFFFFFF means "a random seed"."""
    return seed % 0xFFFFFFFF


def _split(data: T, count: int, pieces: Mapping[T, int], longest: int) -> list[int] | None:
    """``count`` token ids whose pieces (bytes, or shown text; none longer than ``longest``) make up
    ``data``, taking the longest piece first where there is a choice, or None. Dynamic programming
    over positions: ``ends[p]`` has bit ``c`` set when ``data[p:]`` is ``c`` pieces (O(len * longest))."""
    size = len(data)
    if size > count * longest:
        return None
    ends = [0] * (size + 1)
    ends[size] = 1  # the empty rest is 0 pieces
    mask = (1 << (count + 1)) - 1
    for p in range(size - 1, -1, -1):
        bits = 0
        for end in range(p + 1, min(size, p + longest) + 1):
            if ends[end] and data[p:end] in pieces:
                bits |= ends[end] << 1
        ends[p] = bits & mask
    if not ends[0] >> count & 1:
        return None
    ids, p = [], 0
    for left in range(count - 1, -1, -1):  # pieces still to take after this one
        end = next(
            e for e in range(min(size, p + longest), p, -1) if ends[e] >> left & 1 and data[p:e] in pieces
        )
        ids.append(pieces[data[p:end]])
        p = end
    return ids
