"""The decode time an end of the middle saves (issue 31): the overrun tokens an infill no longer decodes,
times the decode time per token measured on the speculative benchmark's copier checkpoint.

- Tokens: each (hole, overrun) of the measure (``benchmarks/ends_measure.py``), its text ``middle +
  overrun`` tokenized with the copier's tokenizer (a byte-level BPE of 1,024 tokens trained on Python
  code, so other languages take more tokens per line). ``overrun`` tokens: those of ``middle + overrun``
  minus those of ``middle``. Decoded with ``end="auto"``: the tokens fed one by one (each token's text)
  through :class:`~langchain_starcoder.decoding.middle.MiddleGate` as the
  engine's sink feeds them, up to the one
  after which the gate says the middle ended (it decides at newlines, so the first line past the end is
  often decoded before it knows); the rest are not decoded. A pair whose end is never found decodes all.
- ms/token: greedy infills of ``GENERATE_TOKENS`` tokens with ``end="none"`` and no speculation on the
  copier (``copier-*`` in the work folder, when ``python -m benchmarks --only speculative`` trained it),
  else on a checkpoint of its exact shape and tokenizer with random weights (decode time does not depend
  on weight values); the median over ``RUNS`` of generation seconds over the tokens after the first.
- The figure is tokens x measured ms/token: what decoding those overruns would cost on this checkpoint,
  not what a model wrote. The measure's overruns are three lines long; a model that goes on past them
  (to ``max_tokens``) would decode more without the end.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .ends_measure import Hole
from .harness import recipe_key

DECODE_HOLES = 100  # of each kind per repository: the measure's holes are shuffled, so a random sample
GENERATE_TOKENS, RUNS = 128, 9


def checkpoint(workdir: Path, log: Callable[[str], None] = print) -> tuple[Path, str]:
    """The copier if it is cached in ``workdir``, else a checkpoint of its shape and tokenizer (built
    once, kept in ``workdir``); and which of them it is, in words."""
    from .copier import SHAPE, shape_and_tokenizer, training_functions

    trained = sorted(Path(workdir).glob("copier-*/training.json"), key=lambda p: p.stat().st_mtime)
    if trained:
        return trained[-1].parent, f"the copier ({trained[-1].parent.name}, trained)"
    corpus = training_functions()
    key = recipe_key([corpus, SHAPE, 1])
    folder = Path(workdir) / f"copier-shape-{key}"
    what = f"the copier's shape and tokenizer, random weights ({folder.name}; the copier is not cached)"
    if (folder / ".bench-complete").is_file():
        return folder, what
    log(f"  building {folder.name}: the copier's shape and tokenizer")
    shape_and_tokenizer(folder, corpus)
    (folder / ".bench-complete").write_text("1")
    return folder, what


def count_tokens(tokenizer: Any, holes: list[Hole]) -> list[dict[str, Any]]:
    """Per (hole, overrun): tokens of ``middle + overrun`` (``total``), of ``middle``, and how many of
    them a generation with ``end="auto"`` decodes before its gate ends it (``decoded``)."""
    from langchain_starcoder.decoding.middle import MiddleGate
    from langchain_starcoder.ends import MiddleEnd

    pairs = [(hole, name, hole.middle + overrun) for hole in holes for name, overrun in hole.overruns.items()]
    full = tokenizer.encode_batch([text for _, _, text in pairs], add_special_tokens=False)
    middles = tokenizer.encode_batch([hole.middle for hole, _, _ in pairs], add_special_tokens=False)
    ends: dict[int, MiddleEnd] = {}
    out = []
    for (hole, name, text), encoding, middle in zip(pairs, full, middles, strict=True):
        if id(hole) not in ends:  # the hole is read once, as a Job does; fresh() per generation
            ends[id(hole)] = MiddleEnd(hole.prefix, hole.suffix, file_path=hole.path)
        gate = MiddleGate(ends[id(hole)].fresh())
        decoded, at = len(encoding.ids), 0
        for i, (_, stop) in enumerate(encoding.offsets):
            gate.feed(text[at:stop])  # a token's text: from the last token's end to its own
            at = max(at, stop)
            if gate.ended:
                decoded = i + 1
                break
        out.append(
            {
                "kind": hole.kind,
                "overrun": name,
                "total": len(encoding.ids),
                "middle": len(middle.ids),
                "decoded": decoded,
                "ended": gate.ended is not None,
            }
        )
    return out


def ms_per_token(
    folder: Path, hole: Hole, runs: int = RUNS, tokens: int = GENERATE_TOKENS
) -> tuple[list[float], list[int]]:
    """Decode ms per token of greedy infills of ``hole`` with ``end="none"`` (one untimed run first),
    and how many tokens each generated (``tokens`` unless an end-of-text token came first)."""
    from langchain_starcoder import StarCoderEngine

    engine = StarCoderEngine.load(folder)
    settings = {"max_tokens": tokens, "end": "none", "prompt_lookup_num_tokens": 0, "file_path": hole.path}
    try:
        engine.infill(hole.prefix[-4000:], hole.suffix[:2000], **settings)
        samples, counts = [], []
        for _ in range(runs):
            done = engine.infill(hole.prefix[-4000:], hole.suffix[:2000], **settings)
            if done.completion_tokens > 1:  # the first token's time is the prefill's
                samples.append(1000 * done.generation_seconds / (done.completion_tokens - 1))
                counts.append(done.completion_tokens)
        return samples, counts
    finally:
        engine.close()


def summarize(pairs: list[dict[str, Any]], ms: float) -> dict[str, Any]:
    """Mean tokens per completion (with and without the end), the time they take at ``ms`` per token,
    and the share of a completion's decode time the end saves."""
    n = len(pairs)
    total = sum(p["total"] for p in pairs) / n
    decoded = sum(p["decoded"] for p in pairs) / n
    overrun = sum(p["total"] - p["middle"] for p in pairs) / n
    return {
        "pairs": n,
        "tokens_none": total,
        "tokens_auto": decoded,
        "tokens_saved": total - decoded,
        "overrun_tokens": overrun,
        "ms_none": total * ms,
        "ms_auto": decoded * ms,
        "ms_saved": (total - decoded) * ms,
        "share_saved": (total - decoded) / total,
        "ended": sum(p["ended"] for p in pairs) / n,  # the gate ended it before the text ran out
    }


def measure(
    holes: dict[str, list[Hole]], workdir: Path, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Per language (``holes``: a sample of each language's holes), the decode time saved."""
    from tokenizers import Tokenizer

    folder, what = checkpoint(workdir, log)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    first = next(h for sample in holes.values() for h in sample)
    samples, counts = ms_per_token(folder, first)
    ms = statistics.median(samples)
    log(f"  decode {ms:.3f} ms/token on {folder.name} (median of {len(samples)} runs of {counts} tokens)")
    languages = {}
    for language, sample in holes.items():
        languages[language] = summarize(count_tokens(tokenizer, sample), ms)
        s = languages[language]
        log(f"  {language}: {s['tokens_saved']:.1f} of {s['tokens_none']:.1f} tokens not decoded")
    return {
        "checkpoint": what,
        "ms_per_token": samples,
        "ms": ms,
        "tokens": counts,
        "timed_on": f"{first.path} ({first.kind} hole)",
        "per_kind": DECODE_HOLES,
        "languages": languages,
    }
