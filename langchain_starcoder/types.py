"""The values every layer passes around: results and generation settings (the FIM request is
:mod:`langchain_starcoder.fim.request`).

This module imports nothing from the package but its errors, so every other module can use it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from .errors import GrammarError, InvalidParameterError, StarCoderError


@dataclass(frozen=True)
class Completion:
    """The result of one generation request."""

    text: str
    token_ids: list[int]
    finish_reason: str
    """"stop" (an end-of-text token or a stop string) or "length" (``max_tokens`` reached)."""
    prompt_tokens: int
    cached_tokens: int
    """Prompt tokens served from a reused KV cache instead of being prefilled."""
    completion_tokens: int
    stop_sequence: str | None = None
    """The stop string that ended the generation, if one did."""
    prompt_seconds: float | None = None
    """The prefill's time; None where it is not known (a server that does not report it)."""
    generation_seconds: float = 0.0
    accepted_draft_tokens: int = 0
    """Generated tokens that came from a verified draft (prompt lookup or a draft model); 0 without
    speculative decoding."""
    draft_tokens: int = 0
    """Tokens drafted for verification, accepted or not; 0 without speculative decoding."""
    constrained: bool = False
    """Whether a ``json_schema``, ``regex`` or ``grammar`` constrained the decoding. Then
    ``finish_reason`` "stop" means the text matches the constraint in full (a valid output), and
    "length" means it does not: the text is an incomplete prefix of a valid output, cut by
    ``max_tokens`` or by a stop string (named in ``stop_sequence``) or stop id."""
    middle_end: str | None = None
    """Set when the end of a FIM middle stopped the generation (``FIMRequest.end``, ``min_indent``):
    "syntax" (the code says the hole is filled) or "indent" (a line indented below ``min_indent``);
    the text ends there and ``finish_reason`` is "stop"."""

    @property
    def prompt_tps(self) -> float | None:
        """Prefilled prompt tokens per second (cached tokens excluded); None where the time is unknown."""
        new = self.prompt_tokens - self.cached_tokens
        return new / self.prompt_seconds if self.prompt_seconds else None

    @property
    def generation_tps(self) -> float:
        return self.completion_tokens / self.generation_seconds if self.generation_seconds > 0 else 0.0

    def usage(self) -> dict[str, int]:
        """OpenAI-style token counts (``cached_tokens`` included)."""
        return usage([self])


@dataclass(frozen=True)
class CompletionChunk:
    """A piece of a streamed completion. Only the last chunk has ``finish_reason`` and the counts."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    stop_sequence: str | None = None
    prompt_seconds: float | None = None
    """On the last chunk: the prefill's time, or None where it is not known."""
    generation_seconds: float | None = None
    accepted_draft_tokens: int | None = None
    """On the last chunk: generated tokens that came from a verified draft."""
    draft_tokens: int | None = None
    """On the last chunk: tokens drafted for verification."""
    constrained: bool | None = None
    """On the last chunk: whether a constraint applied (see :attr:`Completion.constrained`)."""
    middle_end: str | None = None
    """On the last chunk: see :attr:`Completion.middle_end`."""


def join_chunks(chunks: Iterable[CompletionChunk]) -> Completion:
    """The completion that a stream's chunks add up to (the last chunk carries the counts)."""
    texts: list[str] = []
    ids: list[int] = []
    for chunk in chunks:
        texts.append(chunk.text)
        ids.extend(chunk.token_ids)
        if chunk.finish_reason is not None:
            return Completion(
                text="".join(texts),
                token_ids=ids,
                finish_reason=chunk.finish_reason,
                prompt_tokens=chunk.prompt_tokens or 0,
                cached_tokens=chunk.cached_tokens or 0,
                completion_tokens=chunk.completion_tokens or 0,
                stop_sequence=chunk.stop_sequence,
                prompt_seconds=chunk.prompt_seconds,
                generation_seconds=chunk.generation_seconds or 0.0,
                accepted_draft_tokens=chunk.accepted_draft_tokens or 0,
                draft_tokens=chunk.draft_tokens or 0,
                constrained=bool(chunk.constrained),
                middle_end=chunk.middle_end,
            )
    msg = "The generation ended without a final chunk."
    raise StarCoderError(msg)


def usage(completions: Iterable[Completion]) -> dict[str, int]:
    """Token counts summed over ``completions``, in OpenAI's shape plus ``cached_tokens``."""
    done = list(completions)
    prompt = sum(c.prompt_tokens for c in done)
    completion = sum(c.completion_tokens for c in done)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "cached_tokens": sum(c.cached_tokens for c in done),
        "accepted_draft_tokens": sum(c.accepted_draft_tokens for c in done),
        "draft_tokens": sum(c.draft_tokens for c in done),
    }


def counts(completion: Completion | CompletionChunk) -> dict[str, Any]:
    """Why a generation ended and its token counts (LangChain's ``generation_info``, LlamaIndex's
    ``additional_kwargs``)."""
    return {
        "finish_reason": completion.finish_reason,
        "prompt_tokens": completion.prompt_tokens,
        "cached_tokens": completion.cached_tokens,
        "completion_tokens": completion.completion_tokens,
        "stop_sequence": completion.stop_sequence,
        "accepted_draft_tokens": completion.accepted_draft_tokens,
        "draft_tokens": completion.draft_tokens,
        "constrained": completion.constrained,
        "middle_end": completion.middle_end,
    }


# Below this a temperature is greedy: 1/T would overflow float32 and turn sampling uniform, and
# logits scaled by 1e6 already pick the top token whenever the top two differ by more than 1e-4.
GREEDY_BELOW = 1e-6
#: Tokens the repetition penalty looks back over (mlx-lm's default; the remote backends send it too).
PENALTY_CONTEXT = 20
_MAX_SEED = 2**64 - 1
#: New tokens at most when a call does not say (every surface's default max_tokens / n_predict).
DEFAULT_MAX_TOKENS = 256
#: New tokens at most when a ghost-text request does not say (a line or a short block).
GHOST_TEXT_MAX_TOKENS = 64
#: The longest draft a speculative decoder verifies in one pass (prompt lookup or a draft model).
MAX_DRAFT_TOKENS = 64  # MLX seeds are unsigned 64-bit


@dataclass(frozen=True)
class GenerationParams:
    """Validated generation settings: the one home of their defaults.

    Every generation method takes these as keywords, and the wrappers' fields take their defaults
    from here (``GenerationParams.max_tokens`` is the default ``max_tokens``).
    """

    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    prompt_lookup_num_tokens: int | None = None
    """Prompt-lookup speculative decoding (greedy only): drafts of up to this many tokens copied from
    the prompt and the text so far, verified in one forward pass; the output is unchanged. None:
    the backend's default (up to 10, only where its measured costs say a draft pays); 0: off.
    Under a constraint only a set length drafts, and drafts stop at the first token it rejects."""
    json_schema: dict[str, Any] | str | None = None
    """Constrain the output to JSON that validates against this JSON Schema (a dict, or its JSON
    text; kept as a dict). At most one of ``json_schema``, ``regex`` and ``grammar``; see
    :attr:`Completion.constrained` for what ``finish_reason`` then says."""
    regex: str | None = None
    """Constrain the output to a full match of this regular expression (Rust's ``regex`` syntax)."""
    grammar: str | None = None
    """Constrain the output to this context-free grammar: a Lark grammar in llguidance's dialect
    (``start: ...``, with ``/regex/`` terminals and ``%json {...}`` schemas), or llama.cpp's GBNF
    (``root ::= ...``). Text with a line that begins ``start:`` (or ``%llguidance``) is Lark;
    anything else is read as GBNF and converted to Lark by llguidance."""
    cache_salt: str | None = None
    """The prompt cache's partition (vLLM's ``cache_salt``): a request reuses only KV computed for
    requests with the same salt (None is a partition of its own), and ``cached_tokens`` counts only
    what its own partition held. A server gives each user a salt of its own (docs/security.md)."""

    @classmethod
    def create(cls, **settings: Any) -> GenerationParams:
        """Validate keyword settings (the fields above; ``stop`` may be a string or a list)."""
        unknown = sorted(set(settings) - {f.name for f in fields(cls)})
        if unknown:
            msg = f"Unknown generation setting(s) {unknown}; the settings are {list(GENERATION_KEYS)}."
            raise InvalidParameterError(msg)
        values = {**_DEFAULTS, **settings}
        _check_settings(values)
        stop = values["stop"]
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        temperature = float(values["temperature"])
        return cls(
            max_tokens=int(values["max_tokens"]),
            temperature=0.0 if temperature < GREEDY_BELOW else temperature,
            top_p=float(values["top_p"]),
            top_k=int(values["top_k"]),
            min_p=float(values["min_p"]),
            repetition_penalty=_opt(float, values["repetition_penalty"]),
            seed=_opt(int, values["seed"]),
            stop=tuple(dict.fromkeys(stops)),
            stop_token_ids=frozenset(int(t) for t in values["stop_token_ids"]),
            prompt_lookup_num_tokens=_opt(int, values["prompt_lookup_num_tokens"]),
            json_schema=_schema(values["json_schema"]),
            regex=values["regex"],
            grammar=values["grammar"],
            cache_salt=values["cache_salt"],
        )

    def settings(self) -> dict[str, Any]:
        """The settings as keywords of :meth:`create` (``stop_token_ids`` included)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def partition(self) -> CachePartition:
        """The part of the prompt cache this request may reuse and fill."""
        return CachePartition(salt=self.cache_salt)

    @property
    def constrained(self) -> bool:
        """Whether a ``json_schema``, ``regex`` or ``grammar`` is set."""
        return self.json_schema is not None or self.regex is not None or self.grammar is not None

    @property
    def constraint(self) -> tuple[str, str] | None:
        """The constraint as ``(kind, text)``: kind "json_schema" (its compact JSON text), "regex"
        or "grammar"; None without one. Compiled grammars are cached under it."""
        if self.json_schema is not None:
            # (keys in their order: a schema's property order is the order the output has)
            return "json_schema", json.dumps(self.json_schema, separators=(",", ":"))
        if self.regex is not None:
            return "regex", self.regex
        if self.grammar is not None:
            return "grammar", self.grammar
        return None


@dataclass(frozen=True)
class CachePartition:
    """What keeps one request's prompt cache apart from another's: KV computed under one partition
    is never handed to a request of another, in memory or on disk. ``salt``: the request's
    ``cache_salt``; ``adapter``: the digest of the fine-tuning adapter the model runs with.

    The default partition (no salt, no adapter) is the cache every request shared before partitions existed.
    """

    salt: str | None = None
    adapter: str | None = None

    @property
    def is_default(self) -> bool:
        return self == _DEFAULT_PARTITION

    @property
    def digest(self) -> str:
        """A hex digest that names the partition without showing its salt (what files record)."""
        # (the adapter only when there is one: a salt's files written before adapters existed stay its own)
        named = {"salt": self.salt} if self.adapter is None else {"salt": self.salt, "adapter": self.adapter}
        text = json.dumps(named, separators=(",", ":"))
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


_DEFAULT_PARTITION = CachePartition()

#: The settings a caller sets by name (``stop_token_ids`` is filled in by the front).
GENERATION_KEYS = tuple(f.name for f in fields(GenerationParams) if f.name != "stop_token_ids")
_DEFAULTS = GenerationParams().settings()


def _opt(kind: type, value: Any) -> Any:
    return None if value is None else kind(value)


#: The settings that constrain the output; at most one per request.
CONSTRAINT_KEYS = ("json_schema", "regex", "grammar")


def _schema(schema: dict[str, Any] | str | None) -> dict[str, Any] | None:
    """A JSON Schema given as a dict or as JSON text, as a dict of its own (checked: JSON, an object)."""
    if schema is None:
        return None
    try:
        value = json.loads(schema if isinstance(schema, str) else json.dumps(schema))
    except RecursionError:
        msg = "json_schema is nested too deeply to read; flatten it (or use $defs and $ref)."
        raise GrammarError(msg) from None
    except (TypeError, ValueError) as e:  # (json.JSONDecodeError is a ValueError)
        what = "JSON text" if isinstance(schema, str) else "made of JSON values (dict, list, str, number...)"
        msg = f"json_schema must be {what}: {e}."
        raise GrammarError(msg) from None
    if not isinstance(value, dict):
        msg = f"json_schema must be a JSON object (a dict), not {type(value).__name__}."
        raise GrammarError(msg)
    return value


def _check_constraint(v: dict[str, Any]) -> None:
    given = [key for key in CONSTRAINT_KEYS if v[key] is not None]
    if len(given) > 1:
        msg = f"Give at most one of json_schema, regex and grammar, not {' and '.join(given)}."
        raise GrammarError(msg)
    schema = v["json_schema"]
    if schema is not None and not isinstance(schema, dict | str):
        msg = f"json_schema must be a dict or JSON text, not {type(schema).__name__}."
        raise GrammarError(msg)
    for key in ("regex", "grammar"):
        value = v[key]
        if value is None:
            continue
        if not isinstance(value, str) or not value:
            msg = f"{key} must be a non-empty string, not {value!r}."
            raise GrammarError(msg)
        check_text(value, key)


def _check_settings(v: dict[str, Any]) -> None:
    def bad(msg: str) -> InvalidParameterError:
        return InvalidParameterError(msg)

    if not is_int(v["max_tokens"]) or v["max_tokens"] < 1:
        raise bad(f"max_tokens must be a positive integer, not {v['max_tokens']!r}.")
    if not is_real(v["temperature"]) or v["temperature"] < 0:
        raise bad(f"temperature must be a number >= 0 (0 is greedy), not {v['temperature']!r}.")
    if not is_real(v["top_p"]) or not 0 < v["top_p"] <= 1:
        raise bad(f"top_p must be in (0, 1], not {v['top_p']!r}.")
    if not is_int(v["top_k"]) or v["top_k"] < 0:
        raise bad(f"top_k must be an integer >= 0 (0 turns it off), not {v['top_k']!r}.")
    if not is_real(v["min_p"]) or not 0 <= v["min_p"] < 1:
        raise bad(f"min_p must be in [0, 1), not {v['min_p']!r}.")
    penalty = v["repetition_penalty"]
    if penalty is not None and (not is_real(penalty) or penalty <= 0):
        raise bad(f"repetition_penalty must be a number > 0, not {penalty!r}.")
    seed = v["seed"]
    if seed is not None and (not is_int(seed) or not 0 <= seed <= _MAX_SEED):
        raise bad(f"seed must be an integer from 0 to 2**64 - 1, not {seed!r}.")
    lookup = v["prompt_lookup_num_tokens"]
    if lookup is not None and (not is_int(lookup) or not 0 <= lookup <= MAX_DRAFT_TOKENS):
        raise bad(
            f"prompt_lookup_num_tokens must be an integer from 0 (off) to {MAX_DRAFT_TOKENS}, "
            f"or None (the backend's default), not {lookup!r}."
        )
    stop = v["stop"]
    if isinstance(stop, bytes | bytearray) or not isinstance(stop, str | Sequence | type(None)):
        raise bad(f"stop must be a string or a list of strings, not {type(stop).__name__}.")
    for s in (stop,) if isinstance(stop, str) else stop or ():
        if not isinstance(s, str) or not s:
            raise bad(f"stop strings must be non-empty strings, not {s!r}.")
        check_text(s, "stop string")
    ids = v["stop_token_ids"]
    if isinstance(ids, str | bytes) or not isinstance(ids, Iterable) or not all(is_int(t) for t in ids):
        raise bad(f"stop_token_ids must be a list of token ids (integers), not {ids!r}.")
    salt = v["cache_salt"]
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise bad(f"cache_salt must be a non-empty string or None, not {salt!r}.")
    if salt is not None:
        check_text(salt, "cache_salt")
    _check_constraint(v)


def is_int(x: Any) -> bool:
    return isinstance(x, int | np.integer) and not isinstance(x, bool)


def is_real(x: Any) -> bool:
    return isinstance(x, int | float | np.number) and not isinstance(x, bool) and math.isfinite(x)


def check_text(text: Any, what: str) -> str:
    """``text`` if it is a ``str`` that UTF-8 can encode, else a clear error naming ``what``."""
    if not isinstance(text, str):
        msg = f"The {what} must be text (str), not {type(text).__name__}."
        raise InvalidParameterError(msg)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        msg = f"The {what} is not valid Unicode (a lone surrogate at index {e.start}); fix the text."
        raise InvalidParameterError(msg) from e
    return text
