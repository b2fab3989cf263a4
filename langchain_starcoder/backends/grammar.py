"""Grammars for constrained decoding: a ``json_schema``, ``regex`` or ``grammar`` compiled by llguidance
for one tokenizer, cached, within bounded time and memory, and the verdict on a finished text.

llguidance was chosen over xgrammar and outlines-core by measuring them on a 49,152-token code BPE
(docs/engine.md, "Constrained decoding"): masks as cheap per token as xgrammar's, grammars compiled
about 10x faster, Lark and GBNF besides JSON Schema and regex (outlines-core has no grammars), limits on
every step's work, and no dependencies (xgrammar pulls in triton and torch).

The front compiles (so a bad constraint fails before any decoding, raised in the caller's thread); the
compile itself runs on a thread of a known stack (:mod:`.native`), after a bound on how deep it may
recurse (:mod:`.grammar_depth`): no constraint can overflow the native stack and kill the process. The MLX
backend masks with a fresh matcher per generation (:mod:`.masking`); the front checks the finished text
(:meth:`Grammar.accepts`), whichever backend produced it.
"""

from __future__ import annotations

import copy
import json
import threading
from collections import OrderedDict
from typing import Any

import llguidance
import numpy as np
from llguidance.gbnf_to_lark import any_to_lark, is_lark_syntax
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from ..errors import GrammarError
from . import grammar_depth
from .native import StackThreads

#: What one grammar may cost (llguidance's ``LLParserLimits``): work per mask step (lexer fuel, Earley
#: items), building the lexer, and memory (lexer states, about 1-2 kB each; grammar symbols). A grammar
#: past them is refused with its reason, before decoding or at the step that hits the limit.
LIMITS = {
    # Earley items in one row: a grammar ambiguous enough to parse "aaa..." in ways that grow with its
    # length is refused after about 160 tokens (at 2,000, llguidance's default: 330 tokens and 100 s);
    # a JSON Schema of 250 optional properties still fits.
    "max_items_in_row": 1_000,
    "initial_lexer_fuel": 1_000_000,  # about 20 ms of lexer building (a 100,000-item enum: refused in ~1 s)
    "step_lexer_fuel": 200_000,  # about 15 ms of lexing per mask
    "step_max_items": 20_000,  # about 1 ms of Earley items per mask
    # Lexer states are built as the text needs them, 1-2 kB each, into the cached grammar (its copies
    # share them): at most about 40 MB per grammar, which MAX_CACHED_BYTES does not see (a full cache of
    # the worst: 1.3 GB), where a 10-field schema, a 20,000-word alternation and an expression grammar
    # each needed under 10,000 on a 49,152-token vocabulary.
    "max_lexer_states": 20_000,
    "max_grammar_size": 500_000,
    # An error says what went wrong in a line, not with the whole grammar and parser state (55 KB for
    # a 3,000-rule grammar, echoed in every refused answer).
    "verbose_errors": False,
}
#: JSON's whitespace between tokens where a schema asks for it (``"x-guidance": {"whitespace_flexible":
#: true}``), as llama.cpp's json-schema-to-grammar allows it (a space, or one or two newlines and up to 20
#: spaces or tabs of indent): bounded, so a model cannot pad for ever. By default there is none.
JSON_WHITESPACE = r"(?:\x20|\n{1,2}[\x20\t]{0,20})?"
#: Compiled grammars kept per tokenizer (least recently used first out)...
MAX_CACHED_GRAMMARS = 32
#: ... and what they may weigh together, estimated by :func:`weight`. Without it a full cache of big
#: grammars held about 380 MB (32 of 20,000-word enums and alternations; 836 MB in the review's server).
MAX_CACHED_BYTES = 128 << 20
# Where grammars compile: two threads, so that one slow compile (a 60,000-way alternation takes seconds)
# does not hold up every other.
_COMPILE = StackThreads(2, "langchain-starcoder-grammar")


class Grammar:
    """One constraint compiled for one tokenizer: a pristine matcher that each generation copies."""

    def __init__(self, matcher: llguidance.LLMatcher, tokenizer: llguidance.LLTokenizer, vocab_size: int):
        self._matcher = matcher
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size

    def matcher(self) -> llguidance.LLMatcher:
        """A matcher at the start of the grammar, for one generation."""
        return self._matcher.deep_copy()

    def accepts(self, text: str) -> bool:
        """Whether ``text`` matches the grammar in full (the output may end here)."""
        matcher = self.matcher()
        return matcher.consume_tokens(self._tokenizer.tokenize_str(text)) and matcher.is_accepting()

    def allows(self, text: str) -> bool:
        """Whether ``text`` is a valid output or the start of one."""
        return self.matcher().consume_tokens(self._tokenizer.tokenize_str(text))


class GrammarCompiler:
    """Compiles constraints for one tokenizer and keeps the latest :data:`MAX_CACHED_GRAMMARS` (at most
    :data:`MAX_CACHED_BYTES` of them), so a repeated schema costs a dict lookup. Thread-safe.

    Args:
        tokenizer: The engine's tokenizer (mlx-lm's wrapper, a transformers fast tokenizer or a
            ``tokenizers.Tokenizer``); llguidance's copy of it is built on the first compile (about 1 s).
        vocab_size: The model's vocabulary (its logits' width; ids past the tokenizer's are never allowed).
        eos_token_ids: The ids that end a generation where the grammar allows it to end.
    """

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: frozenset[int] | set[int]):
        self._source = tokenizer
        self.vocab_size = vocab_size
        self._eos = sorted(eos_token_ids)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[tuple[str, str], Grammar] = OrderedDict()
        self._cached_bytes = 0  # the cached grammars' weight
        self._lock = threading.Lock()

    def compile(self, constraint: tuple[str, str]) -> Grammar:
        """The compiled grammar of ``(kind, text)`` (:attr:`GenerationParams.constraint
        <langchain_starcoder.types.GenerationParams.constraint>`); :class:`GrammarError` if it is invalid
        or past :data:`LIMITS`."""
        with self._lock:
            grammar = self._cache.get(constraint)
            if grammar is not None:
                self._cache.move_to_end(constraint)
                return grammar
            if self._tokenizer is None:
                self._tokenizer = ll_tokenizer(self._source, self.vocab_size, self._eos)
        matcher = _COMPILE.call(_matcher, self._tokenizer, *constraint)
        grammar = Grammar(matcher, self._tokenizer, self.vocab_size)
        with self._lock:
            if constraint not in self._cache and weight(constraint) <= MAX_CACHED_BYTES:
                self._cache[constraint] = grammar
                self._cached_bytes += weight(constraint)
            while len(self._cache) > MAX_CACHED_GRAMMARS or self._cached_bytes > MAX_CACHED_BYTES:
                self._cached_bytes -= weight(self._cache.popitem(last=False)[0])
        return grammar


def weight(constraint: tuple[str, str]) -> int:
    """A compiled grammar's memory, estimated from its text: 512 KiB and 160 bytes a character, the most
    measured (llguidance 1.9.1, 49,152-token vocabulary, after 40 generations: a 20,000-word Lark
    alternation of 254 KB took 37 MB, a 20,000-value enum of 235 KB 13 MB, a 60-property schema of 2 KB
    1 MB). Lexer states added while decoding are bounded apart (``max_lexer_states`` in :data:`LIMITS`)."""
    return (512 << 10) + 160 * len(constraint[1])


def ll_tokenizer(tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> llguidance.LLTokenizer:
    """llguidance's tokenizer built from ours (its ``tokenizer.json``, as ``llguidance.hf`` does)."""
    from tokenizers import Tokenizer

    inner = getattr(tokenizer, "_tokenizer", tokenizer)  # (mlx-lm's wrapper holds the transformers one)
    backend = inner if isinstance(inner, Tokenizer) else getattr(inner, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        msg = (
            f"Constrained decoding needs a fast tokenizer (a tokenizer.json); {type(inner).__name__} is "
            "not one. Convert the checkpoint's tokenizer with transformers and save it with a tokenizer.json."
        )
        raise GrammarError(msg)
    backend = copy.copy(backend)
    backend.no_padding()
    backend.no_truncation()
    return llguidance.LLTokenizer(backend.to_str(), n_vocab=vocab_size, eos_token=eos_token_ids)


def json_options(schema: Any) -> dict[str, Any] | None:
    """llguidance's JSON options for ``schema``: compact JSON (no whitespace between tokens, as vLLM's
    llguidance writes it) unless the schema's own ``"x-guidance"`` options say otherwise; whitespace they
    ask for (``"whitespace_flexible": true``) is :data:`JSON_WHITESPACE` unless they give a
    ``"whitespace_pattern"`` too. None for a schema that is not an object (llguidance's defaults)."""
    if not isinstance(schema, dict):
        return None
    own = schema.get("x-guidance")
    options = {"whitespace_flexible": False, **(own if isinstance(own, dict) else {})}
    if options["whitespace_flexible"] and "whitespace_pattern" not in options:
        options["whitespace_pattern"] = JSON_WHITESPACE
    return options


def with_json_whitespace(constraint: tuple[str, str], whitespace: str | None) -> tuple[str, str]:
    """``constraint`` as the verdict on a server's answer, where the server allows ``whitespace``
    between JSON tokens (llama.cpp's json-schema-to-grammar does; it ignores "x-guidance"). As it is
    for None, or a constraint that is not a JSON schema."""
    kind, text = constraint
    if whitespace is None or kind != "json_schema":
        return constraint
    schema = json.loads(text)
    if not isinstance(schema, dict):
        return constraint
    options = {"whitespace_flexible": True, "whitespace_pattern": whitespace}
    return kind, json.dumps({**schema, "x-guidance": options}, separators=(",", ":"))


def _matcher(tokenizer: llguidance.LLTokenizer, kind: str, text: str) -> llguidance.LLMatcher:
    """A checked matcher at the start of the grammar, its first mask computed (the lexer's first
    states built, so each copy starts warm; a limit hit there is refused here)."""
    matcher = llguidance.LLMatcher(
        tokenizer, _spec(kind, text), log_level=0, limits=llguidance.LLParserLimits(**LIMITS)
    )
    if not matcher.is_error():
        fill_next_token_bitmask(matcher, allocate_token_bitmask(1, tokenizer.vocab_size))
    if matcher.is_error():
        raise GrammarError(f"The {_NAMES[kind]} is refused: {error_text(matcher)}")
    return matcher


def _spec(kind: str, text: str) -> str:
    """llguidance's grammar of ``(kind, text)``, once :mod:`.grammar_depth` finds it safe to compile."""
    try:
        if kind == "json_schema":
            schema = json.loads(text)
            grammar_depth.check_schema(schema)
            return llguidance.LLMatcher.grammar_from_json_schema(text, defaults=json_options(schema))
        if kind == "regex":  # (llguidance bounds a regex's nesting itself)
            return llguidance.LLMatcher.grammar_from_regex(text)
        if not is_lark_syntax(text):
            grammar_depth.check_gbnf(text)
        try:  # Lark as it is, GBNF converted (as llguidance.grammar_from does)
            lark = any_to_lark(text)
        except Exception as e:
            raise ValueError(f"Failed to convert the grammar from GBNF to Lark: {e}") from None
        grammar_depth.check_lark(lark)
        return llguidance.LLMatcher.grammar_from_lark(lark)
    except GrammarError:
        raise
    except RecursionError:
        raise GrammarError(f"The {_NAMES[kind]} is nested too deeply to read.") from None
    except ValueError as e:
        raise GrammarError(f"The {_NAMES[kind]} is invalid: {e}") from None


def error_text(matcher: llguidance.LLMatcher) -> str:
    """The matcher's error, without the marker llguidance puts where the verbose part would be."""
    return matcher.get_error().replace("\n<non-verbose/>", "").strip()


_NAMES = {"json_schema": "json_schema", "regex": "regex", "grammar": "grammar (Lark or GBNF)"}


def unpack(words: np.ndarray, vocab_size: int) -> np.ndarray:
    """llguidance's bitmasks (int32 words, bit i of word j: token 32j + i) as booleans ``[rows, vocab]``."""
    bits = np.unpackbits(words.view(np.uint8), axis=-1, bitorder="little")
    return bits[..., :vocab_size].view(np.bool_)
