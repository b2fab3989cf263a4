"""Speculative greedy decoding for the MLX backend: drafts verified in one forward pass, same tokens.

A drafter guesses the next tokens (:class:`PromptLookup`: what followed the last n-gram earlier in
the prompt or the output; :class:`DraftModel`: a smaller model of the same vocabulary); the target
model scores the last token and the draft in one pass and keeps the longest run that equals its own
argmax, plus its own next token. Rejected positions are trimmed from the KV cache, so the cache and
the tokens are those of a plain greedy run. :class:`PassCosts` (per model) and :class:`Acceptance`
(per request) decide whether a draft, and how long a one, pays on the hardware at hand.

mlx-lm's ``speculative_generate_step`` is not used: its draft length is fixed (no adapting to the
acceptance or the cost), it has no cancel between prefill chunks, and it serves a draft model only.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache
from mlx_lm.utils import common_prefix_len

from .grammar import Grammar
from .masking import DraftGuide

#: Longest n-gram prompt lookup matches first, and the shortest it falls back to.
NGRAM_MAX, NGRAM_MIN = 3, 2
#: prompt_lookup_num_tokens=None: the longest draft the backend tries.
DEFAULT_LOOKUP_TOKENS = 10
#: num_draft_tokens=None: the longest draft a draft model writes.
DEFAULT_DRAFT_TOKENS = 4
_EMA = 0.2  # weight of the newest timing in a running mean
_GAIN = 1.03  # draft only when it is expected to be at least this much faster than plain steps
_PROBE_EVERY = 12  # plain-step choices (of _REPLAN_EVERY passes) between re-probes of a draft model
_REPLAN_EVERY = 4
#: Choices against drafting (passes planned, or requests) before the first re-check of that
#: verdict, and the most between two: the interval doubles each time, so re-checks cost little.
_RECHECK_FIRST, _RECHECK_LAST = 128, 4096
#: Draft passes a model's costs are measured over before they decide (a few, once per model).
PROBES = 16


class Drafter(Protocol):
    virtual: bool
    """Whether its drafts can be scored for free against plain-decoded tokens (prompt lookup)."""

    def extend(self, tokens: Sequence[int]) -> None:
        """The sequence grew by ``tokens`` (accepted ones)."""
        ...

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` guesses of the tokens after the sequence so far."""
        ...


class PromptLookup:
    """Drafts the tokens that followed the latest earlier occurrence of the sequence's last n-gram
    (n from 3 down to 2), copied on as far as ``k``.

    Each n-gram size keeps a dict n-gram -> the position after its latest occurrence, built in one
    pass over the prompt and extended by each new token, so a lookup costs a few dict reads.
    """

    virtual = True

    def __init__(self, tokens: Sequence[int]):
        self.tokens = list(tokens)
        n_tok = len(self.tokens)
        # dict(zip(...)) keeps the last position of a repeated n-gram; only n-grams with a continuation.
        self._index = {}
        for n in range(NGRAM_MIN, NGRAM_MAX + 1):
            width = max(n_tok - n, 0)  # n-grams that have a token after them
            grams = zip(*(self.tokens[i : width + i] for i in range(n)), strict=True)
            self._index[n] = dict(zip(grams, range(n, n_tok), strict=False))

    def extend(self, tokens: Sequence[int]) -> None:
        seq = self.tokens
        for token in tokens:
            end = len(seq)  # the new token's position: the continuation of the n-grams before it
            for n, index in self._index.items():
                if end >= n:
                    index[tuple(seq[end - n : end])] = end
            seq.append(token)

    def propose(self, k: int) -> list[int]:
        seq, end = self.tokens, len(self.tokens)
        for n in range(NGRAM_MAX, NGRAM_MIN - 1, -1):
            at = self._index[n].get(tuple(seq[end - n :])) if end >= n else None
            if at is not None:  # a copy that reaches the end goes on copying itself (a repeating run)
                draft = seq[at : min(at + k, end)]
                while len(draft) < k:
                    draft += draft[: k - len(draft)]
                return draft
        return []


class DraftModel:
    """Drafts with a smaller model of the same vocabulary, greedily, from its own KV cache."""

    virtual = False

    def __init__(self, model: Any, cache: list[Any], tokens: Sequence[int]):
        self.model, self.cache = model, cache
        self.tokens = list(tokens)
        self._fed = self.tokens[: self.held]  # what the draft cache holds, position by position

    @property
    def held(self) -> int:
        return self.cache[0].offset

    def extend(self, tokens: Sequence[int]) -> None:
        self.tokens.extend(tokens)

    def settle(self) -> None:
        """Trim the draft cache to the longest prefix of the sequence it holds (drop rejected drafts)."""
        n = common_prefix_len(self._fed, self.tokens)
        if self.held > n:
            trim_prompt_cache(self.cache, self.held - n)
        del self._fed[n:]

    def propose(self, k: int) -> list[int]:
        self.settle()
        if self.held >= len(self.tokens):  # the model must see the last token to predict the next
            trim_prompt_cache(self.cache, self.held - len(self.tokens) + 1)
            del self._fed[len(self.tokens) - 1 :]
        feed = self.tokens[self.held :]
        y = mx.array(feed)
        out = []
        for _ in range(k):  # chained lazily: one sync for the whole draft
            y = mx.argmax(self.model(y[None], cache=self.cache)[0, -1:], axis=-1)
            out.append(y)
        draft = mx.concatenate(out).tolist() if out else []
        self._fed += feed + draft[:-1]
        return draft


class PassCosts:
    """What passes cost on this model and machine, learned from the passes run (kept per model).

    ``plain``: seconds per token of pipelined one-token decoding; ``single``: seconds of a step that
    waits for its token (what a draft needs); ``per_draft``: seconds each drafted token adds
    (drafting it and verifying it). Verifying k tokens costs about k steps where a pass is bound by
    compute (MLX's CPU build with its reference BLAS) and about one where it is bound by memory.

    The choice is about throughput, so each cost is a mean (of its latest timings, the slowest
    eighth left out: a pause that is no pass's cost), not a median, which hides the share of slow
    passes, and which on a busy machine put a waited step at twice a pipelined one. A verdict
    against drafting is re-checked now and then (:meth:`recheck`): it is only as good as the
    timings it came from (cold kernels, a moment's load), and without drafts it would never change.
    """

    def __init__(
        self, plain: float | None = None, single: float | None = None, per_draft: float | None = None
    ):
        self._times: dict[str, deque[float]] = {
            k: deque(maxlen=2 * PROBES) for k in ("plain", "single", "draft")
        }
        for kind, value in (("plain", plain), ("single", single), ("draft", per_draft)):
            if value is not None:
                self._times[kind].extend([value] * PROBES)
        self.needed = PROBES
        """Timings of each kind the costs wait for before they decide."""
        self._means: dict[str, float | None] = {}  # (computed when asked for, kept until a note)
        self._recheck_every = self._recheck_in = _RECHECK_FIRST

    def note(self, drafted: int, seconds: float, pipelined: bool) -> None:
        self._means.clear()
        if pipelined:
            self._times["plain"].append(seconds)
        elif drafted == 0:
            self._times["single"].append(seconds)
        elif self.single is not None:
            self._times["draft"].append((seconds - self.single) / drafted)

    def _mean(self, kind: str) -> float | None:
        if kind not in self._means:
            times = sorted(self._times[kind])
            kept = times[: len(times) - len(times) // 8]
            self._means[kind] = max(statistics.fmean(kept), 0.0) if kept else None
        return self._means[kind]

    @property
    def plain(self) -> float | None:
        return self._mean("plain")

    @property
    def single(self) -> float | None:
        return self._mean("single")

    @property
    def per_draft(self) -> float | None:
        return self._mean("draft")

    def count(self, kind: str) -> int:
        return len(self._times[kind])

    @property
    def known(self) -> bool:
        return all(len(t) >= self.needed for t in self._times.values())

    def recheck(self) -> bool:
        """Count a choice against drafting; True (every so often, then ever more rarely) when the
        waited-pass timings are dropped so that they are probed afresh."""
        self._recheck_in -= 1
        if self._recheck_in > 0:
            return False
        self._recheck_every = min(2 * self._recheck_every, _RECHECK_LAST)
        self._recheck_in = self._recheck_every
        self._times["single"].clear()
        self._times["draft"].clear()
        self.needed = PROBES // 2
        self._means.clear()
        return True

    def drafting(self) -> None:
        """A choice for drafting: the next verdict against it is re-checked soon again."""
        self._recheck_every = self._recheck_in = _RECHECK_FIRST

    def __repr__(self) -> str:
        return f"PassCosts(plain={self.plain}, single={self.single}, per_draft={self.per_draft})"

    def gain(self, k: int, accept: float, match: float) -> float:
        """Expected speed with drafts of ``k`` over plain decoding, for a per-token acceptance
        ``accept`` and a chance ``match`` that a draft is found (geometric model of acceptance)."""
        assert self.plain is not None and self.single is not None and self.per_draft is not None
        tokens = match * _run_length(k, accept) + (1 - match)
        seconds = self.single + match * k * self.per_draft
        return tokens * self.plain / max(seconds, 1e-12)

    def never_pays(self, k_max: int) -> bool:
        """Even a draft that is almost always right would not be faster (a compute-bound pass);
        asked once a request, and re-checked as :meth:`recheck` says."""
        if not self.known or max(self.gain(k, 0.95, 1.0) for k in range(1, k_max + 1)) >= _GAIN:
            return False
        return not self.recheck()


def _run_length(k: int, accept: float) -> float:
    """Tokens one pass yields with a draft of ``k``: the accepted run plus the model's own token."""
    return float(k + 1) if accept >= 1.0 else (1 - accept ** (k + 1)) / (1 - accept)


def _mean(old: float | None, new: float) -> float:
    return new if old is None else old + _EMA * (new - old)


class Acceptance:
    """A request's running acceptance rate per drafted token and rate of found drafts (decaying)."""

    def __init__(self) -> None:
        self.right, self.wrong = 1.0, 1.0  # a neutral prior
        self.found, self.tried = 1.0, 2.0

    def note(self, accepted: int, drafted: int) -> None:
        decay = 0.9
        self.tried = self.tried * decay + 1
        if drafted == 0:
            self.found *= decay
            return
        self.found = self.found * decay + 1
        self.right = self.right * decay + accepted
        self.wrong = self.wrong * decay + (accepted < drafted)

    @property
    def rate(self) -> float:
        return self.right / (self.right + self.wrong)

    @property
    def match(self) -> float:
        return self.found / self.tried


class _Shadow:
    """Scores prompt-lookup drafts against tokens decoded plainly, so the acceptance stays known
    while no draft is verified (a comparison and now and then a lookup per token)."""

    def __init__(self, drafter: Drafter, k_max: int, stats: Acceptance):
        self.drafter, self.k_max, self.stats = drafter, k_max, stats
        self.draft: list[int] | None = None
        self.at = 0

    def see(self, token: int) -> None:
        """Take the next plainly decoded token (the drafter has seen it already)."""
        if self.draft is not None:
            if self.at < len(self.draft) and token == self.draft[self.at]:
                self.at += 1
                return
            self.stats.note(self.at, len(self.draft))  # ``token`` is the model's own, after the run
        self.draft, self.at = self.drafter.propose(self.k_max) or None, 0
        if self.draft is None:
            self.stats.note(0, 0)


class _Planner:
    """Chooses each pass's draft length from the model's pass costs and the request's acceptance."""

    def __init__(self, costs: PassCosts | None, k_max: int, stats: Acceptance, virtual: bool):
        self.costs, self.k_max, self.stats, self.virtual = costs, k_max, stats, virtual
        self.since_probe = 0
        self.chosen = [0, 0]  # the last draft length chosen, and how many more passes it stands for

    def plan(self) -> int:
        """The next draft's length; 0 for a plain, pipelined step, -1 for a waited plain step."""
        costs, k_max = self.costs, self.k_max
        if costs is None:
            return k_max
        if not costs.known:  # probe (once per model, again at a re-check): plain, waited, drafts of 4
            need = costs.needed
            if costs.count("plain") < need:
                return 0
            return -1 if costs.count("single") < min(need, costs.count("draft") + 1) else min(4, k_max)
        if self.chosen[1] > 0:  # a choice stands for a few passes: no arithmetic per token
            self.chosen[1] -= 1
            return self.chosen[0]
        best_k, best = 0, _GAIN
        for k in range(1, k_max + 1):
            gain = costs.gain(k, self.stats.rate, self.stats.match)
            if gain > best:
                best_k, best = k, gain
        self.chosen[:] = [best_k, _REPLAN_EVERY - 1]
        if best_k > 0:
            costs.drafting()
        elif self.virtual:
            if costs.recheck():  # its timings are dropped: the probes above run again
                self.chosen[1] = 0
        else:  # a draft model's acceptance is seen only by drafting
            self.since_probe += 1
            if self.since_probe >= _PROBE_EVERY:
                self.since_probe, best_k = 0, min(2, k_max)
        return best_k


class _Target:
    """The target model's passes over its KV cache; with a grammar's ``guide`` each position's argmax
    is over the tokens it allows."""

    def __init__(self, model: Any, cache: list[Any], guide: DraftGuide | None):
        self.model, self.cache, self.guide = model, cache, guide

    def launch(self, inputs: mx.array, draft: Sequence[int] = ()) -> mx.array:
        logits = self.model(inputs[None], cache=self.cache)[0]
        if self.guide is not None:  # the masks are computed (on a helper thread) while the model runs
            allowed = self.guide.masks(draft)
            mx.async_eval(logits)
            logits = mx.where(mx.array(allowed.result()), logits, -mx.inf)
        out = mx.argmax(logits, axis=-1)
        mx.async_eval(out)
        return out

    def keep(self, n: int) -> None:
        """Trim the cache to its first ``n`` positions."""
        excess = self.cache[0].offset - n
        if excess > 0:
            trim_prompt_cache(self.cache, excess)


class _Decoding:
    """One :func:`decode` call: the sequence, the pass in flight and the draft it verifies, the counts.

    Each pass's tokens are decided, the next pass is launched before they are handed out (chained on
    the lazy token for a plain step, so no wait between steps), and the cache is trimmed to the tokens.
    """

    def __init__(self, target: _Target, planner: _Planner, drafter: Drafter, emit: Callable[[int], bool]):
        self.target, self.planner, self.drafter, self.emit = target, planner, drafter, emit
        self.guide = target.guide
        self.shadow = _Shadow(drafter, planner.k_max, planner.stats) if drafter.virtual else None
        self.seq: list[int] = []  # the prompt and every decided token
        self.prompt_len = self.max_tokens = 0
        self.emitted: list[int] = []
        self.accepted = self.drafted = 0
        self.draft: list[int] = []  # the draft the pass in flight verifies
        self.attempt = False  # whether the pass in flight verifies a draft (or found none to verify)
        self.pipelined = False  # whether the pass in flight was chained on the lazy token before it
        self.clock = 0.0

    def room(self) -> int:
        return self.max_tokens - (len(self.seq) - self.prompt_len)

    def start(self, k: int) -> mx.array:
        """Launch a waited pass on the last token and a draft of up to ``k`` tokens (none for k <= 0)."""
        draft = self.drafter.propose(k) if k > 0 else []
        self.draft = self.guide.clip(draft) if self.guide is not None else draft
        self.attempt = k > 0
        return self.target.launch(mx.array([self.seq[-1], *self.draft]), self.draft)

    def verify(self, pending: mx.array) -> tuple[list[int], list[bool], int]:
        """The waited pass's tokens: the draft's longest run equal to the model's argmax, then the
        model's own token, cut at ``max_tokens``; with which came from the draft, and the run's length."""
        out, draft = pending.tolist(), self.draft
        n = 0
        while n < len(draft) and out[n] == draft[n]:
            n += 1
        room = self.room()
        self.drafted += len(draft)
        return [*draft[:n], out[n]][:room], ([True] * n + [False])[:room], n

    def time_pass(self, pipelined_next: bool) -> None:
        """Note the pass just decided in the costs; ``pipelined_next``: how the next one was launched."""
        now = time.perf_counter()
        if self.planner.costs is not None:
            self.planner.costs.note(len(self.draft), now - self.clock, self.pipelined)
        self.clock, self.pipelined = now, pipelined_next

    def take(self, new: list[int]) -> None:
        self.seq.extend(new)
        self.drafter.extend(new)
        if self.guide is not None:
            self.guide.accept(new)

    def after_waited(self, n: int, next_k: int | None) -> mx.array | None:
        """After a waited pass: note its acceptance, trim the cache to the sequence, and launch the
        next pass (None when ``max_tokens`` is reached)."""
        if self.attempt:
            self.planner.stats.note(n, len(self.draft))
        self.target.keep(len(self.seq) - 1)  # drops rejected draft positions (and any past max_tokens)
        if self.room() <= 0:
            return None
        following = self.start(self.planner.plan() if next_k is None else next_k)
        if self.shadow is not None:
            self.shadow.draft = None  # drafts are scored by passes again
        return following

    def hand_out(self, new: list[int], flags: list[bool]) -> bool:
        """Emit ``new`` in order; True when ``emit`` stopped (the cache then keeps the stop token)."""
        for token, from_draft in zip(new, flags, strict=True):
            self.emitted.append(token)
            self.accepted += from_draft
            if self.emit(token):
                self.target.keep(self.prompt_len + len(self.emitted))  # as a plain run past a stop
                return True
        return False

    def run(self, tokens: list[int], max_tokens: int) -> tuple[list[int], int, int]:
        self.seq, self.prompt_len, self.max_tokens = list(tokens), len(tokens), max_tokens
        pending: mx.array | None = self.start(max(self.planner.plan(), 0))
        self.clock = time.perf_counter()
        while pending is not None:
            # Decide the tokens of the pass in flight; launch the next pass before handing them out.
            next_k = self.planner.plan() if not self.attempt and self.room() > 1 else None
            if next_k == 0 and self.guide is None:
                following = self.target.launch(pending)  # chained on the lazy token: no wait between steps
                new, flags, n = [pending.item()], [False], 0
            else:
                following = None
                new, flags, n = self.verify(pending)
            self.time_pass(pipelined_next=following is not None)
            self.take(new)
            if following is None:
                following = self.after_waited(n, next_k)
            else:
                self.draft, self.attempt = [], False
                if self.shadow is not None:
                    self.shadow.see(new[0])
            if self.hand_out(new, flags):
                break
            pending = following
        return self.emitted, self.accepted, self.drafted


def decode(
    model: Any,
    cache: list[Any],
    tokens: list[int],
    *,
    max_tokens: int,
    drafter: Drafter,
    k_max: int,
    costs: PassCosts | None,
    emit: Callable[[int], bool],
    grammar: Grammar | None = None,
) -> tuple[list[int], int, int]:
    """Greedy decoding after ``tokens`` (the cache holds all but its last), drafting where it pays
    (``costs``: what this model's passes cost), or always up to ``k_max`` tokens (``costs=None``).
    With a ``grammar`` drafts are cut at their first token it rejects, each position's argmax is over
    the tokens it allows (:class:`.masking.DraftGuide`), and no step is chained on a token not yet known.

    ``emit(token)`` takes each token in order; True stops. Returns the emitted tokens, the accepted
    draft tokens among them and the drafted count. The cache is left as a plain greedy run leaves
    it: holding every emitted token, except the last when ``max_tokens`` ended the run.
    """
    guide = None if grammar is None else DraftGuide(grammar.matcher(), grammar.vocab_size)
    planner = _Planner(costs, k_max, Acceptance(), drafter.virtual)
    return _Decoding(_Target(model, cache, guide), planner, drafter, emit).run(tokens, max_tokens)
