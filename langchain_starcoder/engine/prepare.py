"""A request made ready for a backend, in one call: :func:`prepare` (and its infill, batch and
deferred forms) checks the settings, builds the prompt (text, token ids, or a FIM request's prompt
within its budget), checks that it fits, compiles the constraint, and picks the filters its text
passes through. The :class:`~.jobs.Job` it returns is complete: :mod:`.jobs` only submits it.

Each function takes what it needs of the engine (:class:`Parts`), never the engine itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from .._tokens import Codec, codec_for, parsing_encoder
from ..backends import Backend
from ..backends.grammar import Grammar, GrammarCompiler, with_json_whitespace
from ..decoding.filter import Filter
from ..decoding.grammar import GrammarCheck
from ..decoding.middle import MiddleGate
from ..decoding.overlap import OverlapTrim
from ..decoding.stops import StopStrings
from ..ends import MiddleEnd
from ..fim.build import FIMPrompt
from ..fim.request import FIMRequest
from ..types import GenerationParams, check_text
from . import checks, fim_prompts
from .jobs import Job

Prompt = str | Sequence[int] | FIMRequest


@dataclass(frozen=True)
class Parts:
    """What preparing a request needs of an engine: its backend, tokenizer (and text codec), end ids
    and grammar compiler (which caches compiled constraints)."""

    backend: Backend
    tokenizer: Any
    codec: Codec
    encode_parsed: Callable[[str], list[int]]  # text whose control-token strings are control tokens
    eos_token_ids: frozenset[int]
    grammars: GrammarCompiler

    @classmethod
    def of(cls, backend: Backend, tokenizer: Any) -> Parts:
        eos = frozenset(tokenizer.eos_token_ids)
        grammars = GrammarCompiler(tokenizer, backend.vocab_size, eos)
        return cls(backend, tokenizer, codec_for(tokenizer), parsing_encoder(tokenizer), eos, grammars)


def prepare(parts: Parts, prompt: Prompt, settings: dict[str, Any], built: FIMPrompt | None = None) -> Job:
    """The job of ``prompt`` (text, token ids, or a :class:`FIMRequest`, whose prompt is ``built``
    already or built here) with ``settings`` (those of ``StarCoderEngine.generate``)."""
    params, parse = checks.split_settings(dict(settings), parts.backend, parts.eos_token_ids)
    return _job(parts, prompt, params, parse, built)


def prepare_later(parts: Parts, prompt: Prompt, settings: dict[str, Any]) -> Callable[[], Job]:
    """:func:`prepare` in two steps: the settings now (bad ones fail at the call), and the rest (work
    that grows with the prompt) when the result is called, in a thread off the event loop."""
    params, parse = checks.split_settings(dict(settings), parts.backend, parts.eos_token_ids)
    return partial(_job, parts, prompt, params, parse, None)


def prepare_infill(parts: Parts, prefix: str | FIMRequest, suffix: str, settings: dict[str, Any]) -> Job:
    """The job of ``StarCoderEngine.infill``'s arguments: a request (or its fields among ``settings``)."""
    request, rest = fim_prompts.fim_request(prefix, suffix, settings)
    return prepare(parts, request, rest)


def prepare_infill_later(
    parts: Parts, prefix: str | FIMRequest, suffix: str, settings: dict[str, Any]
) -> Callable[[], Job]:
    """:func:`prepare_infill` in the two steps of :func:`prepare_later`."""
    request, rest = fim_prompts.fim_request(prefix, suffix, settings)
    return prepare_later(parts, request, rest)


def prepare_batch(
    parts: Parts, prompts: Sequence[Prompt], settings: dict[str, Any], *, infill: bool = False
) -> list[Job]:
    """The jobs of a batch, each as :func:`prepare` makes it. ``infill``: ``settings``' ``repo`` goes to
    each request that has none (``StarCoderEngine.infill_batch``)."""
    if infill:
        prompts = fim_prompts.with_repo(prompts, settings)
    return [prepare(parts, p, settings) for p in checks.check_batch(prompts)]


# --- the steps -------------------------------------------------------------------------------------


def _job(parts: Parts, prompt: Prompt, params: GenerationParams, parse: bool, built: FIMPrompt | None) -> Job:
    backend = parts.backend
    filters: list[Filter] = [StopStrings(params.stop)] if params.stop else []
    if isinstance(prompt, FIMRequest):  # FIM parts are always data: parse_special_tokens does not apply
        window = backend.context_window
        fim = built or fim_prompts.fim_prompt(parts.tokenizer, window, prompt, params.max_tokens)
        ids = fim.token_ids
        params = dataclasses.replace(params, stop_token_ids=params.stop_token_ids | set(fim.stop_token_ids))
        filters += middle_filters(prompt, params)
    else:
        ids = _prompt_ids(parts, prompt, params, parse)
        checks.check_fits(ids, params.max_tokens, backend.context_window)
    grammar = _grammar(parts, params)
    if grammar is not None:
        filters.append(GrammarCheck(grammar))
    return Job(ids, params, grammar, tuple(filters))


def _prompt_ids(
    parts: Parts, prompt: str | Sequence[int], params: GenerationParams, parse: bool
) -> list[int]:
    """A text prompt tokenized (its size checked first, without tokenizing it), or token ids checked."""
    if not isinstance(prompt, str):
        return checks.prompt_ids(prompt, parts.backend.vocab_size)
    checks.check_text_prompt(prompt)
    checks.check_prompt_size(parts.tokenizer, parts.backend.context_window, len(prompt), params.max_tokens)
    check_text(prompt, "text")
    return parts.encode_parsed(prompt) if parse else parts.codec.encode_data(prompt)


def middle_filters(request: FIMRequest, params: GenerationParams) -> list[Filter]:
    """A FIM middle's filters: where it ends (:class:`MiddleGate`), then a repeat of the suffix trimmed
    (:class:`OverlapTrim`). Neither under a constraint: there the grammar says where the middle ends."""
    if params.constrained:
        return []
    filters: list[Filter] = []
    if request.end != "none" or request.min_indent:
        language = getattr(request.notebook, "language", None)
        end = None
        if request.end != "none":  # reads the hole once, here (off the event loop for async calls)
            end = MiddleEnd(request.prefix, request.suffix, request.file_path, request.end, language=language)
        filters.append(MiddleGate(end, request.min_indent))
    if request.trim_suffix_overlap and request.suffix:
        filters.append(OverlapTrim(request.suffix))
    return filters


def _grammar(parts: Parts, params: GenerationParams) -> Grammar | None:
    """``params``' constraint compiled (cached per constraint) for the backend's answers (a server that
    pads JSON with whitespace is held to its own); a bad one raises
    :class:`~langchain_starcoder.errors.GrammarError` here, before anything is decoded."""
    constraint = params.constraint
    if constraint is None:
        return None
    constraint = with_json_whitespace(constraint, getattr(parts.backend, "json_whitespace", None))
    return parts.grammars.compile(constraint)
