"""Speculative decoding (issue 24): decode tokens/s with and without prompt lookup, and with an 8-bit
draft of the same model, on code edits from a real repository's history and on open-ended prompts.

- Edits: this project's own git history, read offline with ``git``: the first commits (from the root,
  so the set never changes) that changed a Python function of ``langchain_starcoder/``; each edit is
  the function before and after the commit (difflib ratio >= 0.6, 4 to 40 lines). The prompt is
  ``# Before:\\n{old}\\n# After:\\n``, the expected output the new version.
- Open-ended prompts: the first two lines of functions of the standard library's ``difflib``, ``shlex``
  and ``calendar`` (not trained on): code to continue, with nothing to copy but what repeats anyway.
- The checkpoint: the copier (``benchmarks/copier.py``), trained here to copy; the report gives its
  steps, its final loss, and how much its greedy edits copy the old versions.
- Decode tokens/s: completion tokens over generation seconds (prefill excluded), summed over the
  prompts of a set, each greedy, interleaved plain / prompt lookup / draft model. Identical token ids
  across the variants are checked on every prompt.
- Oracle: model-free, prompt lookup run over the edits' real new versions: the tokens each verification
  would yield (accepted run plus the model's own token) if the model wrote exactly the new version.

Run alone: ``python -m benchmarks.speculative [--workdir DIR] [--tiny]`` (the BLAS that
``LANGCHAIN_STARCODER_BLAS`` names: ``openblas`` or ``reference``); in the suite: ``--only speculative``.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .copier import SHAPE, TRAIN_SECONDS, build_copier, definitions, edit_prompt, functions
from .harness import REPO, Row, Section

OPEN_MODULES = ("difflib", "shlex", "calendar")
EDITS, OPEN_PROMPTS, MAX_TOKENS = 12, 12, 160
_PACKAGE = "langchain_starcoder/"


# --- tasks ---------------------------------------------------------------------------------------


def history_edits(repo: Path, limit: int) -> list[tuple[str, str]]:
    """(old, new) versions of functions changed by the repository's first commits, oldest first."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
        ).stdout

    edits: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for commit in git("rev-list", "--reverse", "--topo-order", "HEAD", "--", _PACKAGE).split():
        parents = git("rev-list", "--parents", "-n", "1", commit).split()[1:]
        if len(parents) != 1:
            continue
        changed = git("diff", "--name-only", parents[0], commit, "--", _PACKAGE).split()
        for path in sorted(p for p in changed if p.endswith(".py")):
            try:
                old, new = (definitions(git("show", f"{rev}:{path}")) for rev in (parents[0], commit))
            except subprocess.CalledProcessError:  # added or deleted in this commit
                continue
            for name in sorted(old.keys() & new.keys()):
                a, b = old[name], new[name]
                if a == b or (path, name) in seen or not 4 <= a.count("\n") <= 40:
                    continue
                if difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() >= 0.6:
                    seen.add((path, name))
                    edits.append((a, b))
                    if len(edits) == limit:
                        return edits
    return edits


def open_prompts(limit: int) -> list[str]:
    """The first two lines of functions of modules not trained on: code to continue."""
    heads = []
    for module in OPEN_MODULES:
        for f in functions(module):
            lines = f.splitlines(keepends=True)
            if len(lines) >= 6:
                heads.append("".join(lines[:2]))
    step = max(1, len(heads) // limit)
    return heads[::step][:limit]


# --- measuring -------------------------------------------------------------------------------


def oracle(engine: Any, edits: list[tuple[str, str]], k: int) -> dict[str, float]:
    """Prompt lookup against the true new versions: tokens per verification if the model wrote them."""
    from langchain_starcoder.backends.speculative import PromptLookup

    passes = tokens = accepted = 0
    for old, new in edits:
        prompt = engine.encode(edit_prompt(old), special_tokens=False)
        target = engine.encode(new, special_tokens=False)
        lookup, at = PromptLookup(prompt), 0
        while at < len(target):
            draft = lookup.propose(k)
            n = 0
            while n < len(draft) and at + n < len(target) and draft[n] == target[at + n]:
                n += 1
            step = target[at : at + n + 1]
            lookup.extend(step)
            at += len(step)
            passes, tokens, accepted = passes + 1, tokens + len(step), accepted + n
    return {"tokens_per_verification": tokens / passes, "accepted_per_verification": accepted / passes}


def copying(engine: Any, edits: list[tuple[str, str]], outputs: list[list[int]]) -> dict[str, list[float]]:
    """How much the model's greedy edit copies its prompt, per edit: the difflib ratio of its text to
    the old version and to as much of the old version's start (160 tokens cut some short), and the
    share of its tokens prompt lookup (up to 10) drafts right."""
    from langchain_starcoder.backends.speculative import PromptLookup

    ratios, starts, shares = [], [], []
    for (old, _), out in zip(edits, outputs, strict=True):
        text = engine.decode(out)
        ratios.append(round(difflib.SequenceMatcher(None, text, old, autojunk=False).ratio(), 3))
        starts.append(round(difflib.SequenceMatcher(None, text, old[: len(text)], autojunk=False).ratio(), 3))
        lookup, at, right = PromptLookup(engine.encode(edit_prompt(old), special_tokens=False)), 0, 0
        while at < len(out):
            draft = lookup.propose(10)
            n = 0
            while n < len(draft) and at + n < len(out) and draft[n] == out[at + n]:
                n += 1
            lookup.extend(out[at : at + n + 1])
            at, right = at + n + 1, right + n
        shares.append(round(right / max(len(out), 1), 3))
    return {"ratio_to_old": ratios, "ratio_to_old_start": starts, "lookup_share": shares}


def measure(workdir: Path, *, tiny: bool, reps: int, log: Any = print) -> dict[str, Any]:
    """Train (or reuse) the copier, then time plain, prompt lookup and the 8-bit draft model."""
    from langchain_starcoder import StarCoderEngine
    from langchain_starcoder import _blas as blas
    from langchain_starcoder.checkpoints import quantize_checkpoint

    folder, training = build_copier(workdir, 5 if tiny else TRAIN_SECONDS, log)
    n_edits, n_open, max_tokens = (2, 2, 16) if tiny else (EDITS, OPEN_PROMPTS, MAX_TOKENS)
    edits = history_edits(REPO, n_edits)
    sets = {"edits": [edit_prompt(old) for old, _ in edits], "open": open_prompts(n_open)}
    draft = folder.parent / f"{folder.name}-q8"
    if not (draft / "config.json").exists():
        quantize_checkpoint(folder, draft, bits=8, progress=False)
    engines = {
        "plain": StarCoderEngine.load(folder, max_prompt_caches=0),
        "lookup": StarCoderEngine.load(folder, max_prompt_caches=0),
        "lookup10": StarCoderEngine.load(folder, max_prompt_caches=0),
        "draft": StarCoderEngine.load(folder, max_prompt_caches=0, draft_model=draft),
        "draft4": StarCoderEngine.load(folder, max_prompt_caches=0, draft_model=draft, num_draft_tokens=4),
    }
    # The defaults draft where the measured costs say it pays; "lookup10", "draft4" always draft.
    settings: dict[str, dict[str, Any]] = {name: {} for name in engines}
    settings["plain"] = {"prompt_lookup_num_tokens": 0}
    settings["lookup10"] = {"prompt_lookup_num_tokens": 10}
    for options in settings.values():
        options["parse_special_tokens"] = False  # source code (this package's own) is data
    try:
        for name, engine in engines.items():  # each engine learns its pass costs once, untimed
            for prompt in sets["edits"][:1] + sets["open"][:1]:
                engine.generate(prompt, max_tokens=max_tokens, **settings[name])
        results: dict[str, Any] = {"training": training, "blas": blas.active_blas(), "sets": {}}
        for set_name, prompts in sets.items():
            rates: dict[str, list[float]] = {name: [] for name in engines}
            counts: dict[str, list[int]] = {name: [0, 0] for name in engines}
            ids: dict[str, list[list[int]]] = {}
            for _ in range(reps):
                for name, engine in engines.items():
                    tokens, seconds, out = 0, 0.0, []
                    for prompt in prompts:
                        c = engine.generate(prompt, max_tokens=max_tokens, **settings[name])
                        tokens, seconds = tokens + c.completion_tokens, seconds + c.generation_seconds
                        counts[name][0] += c.accepted_draft_tokens
                        counts[name][1] += c.draft_tokens
                        out.append(c.token_ids)
                    rates[name].append(tokens / seconds)
                    ids.setdefault(name, out)
            if set_name == "edits":
                edit_ids = ids["plain"]
            results["sets"][set_name] = {
                "rates": rates,
                "identical": all(ids[name] == ids["plain"] for name in engines),
                "tokens": sum(len(t) for t in ids["plain"]),
                "accepted_drafted": counts,
                "costs": {
                    name: {
                        kind: {"plain": c.plain, "single": c.single, "per_draft": c.per_draft}
                        for kind, c in engine.backend._costs.items()
                    }
                    for name, engine in engines.items()
                },
            }
        results["oracle"] = oracle(engines["plain"], edits, 10)
        results["copying"] = copying(engines["plain"], edits, edit_ids)
        results["edits"] = len(edits)
        return results
    finally:
        for engine in engines.values():
            engine.close()


TITLE = "Speculative decoding: prompt lookup and a draft model, same output"
#: What training the copier imports (the test extra); without them the section is skipped with a note.
TRAINING_NEEDS = ("torch", "transformers")


def section(results: dict[str, Any], shape: str) -> Section:
    s = Section("speculative", 17, TITLE)
    edits, open_ = results["sets"]["edits"], results["sets"]["open"]

    def rate(
        title: str, a: str, prompts: dict[str, Any], variant: str, goal: Any = None, note: str = ""
    ) -> Row:
        """A decode-speed row: the ``variant`` against plain decoding, on one prompt set's rates."""
        rates_a, rates_b = prompts["rates"][variant], prompts["rates"]["plain"]
        return Row(17, title, "decode tok/s", a, "plain", rates_a, rates_b, "tok/s", shape, goal, note)

    history = f"{results['edits']} edits from this repository's history"
    s.rows = [
        rate("prompt lookup on code edits", "prompt lookup (default)", edits, "lookup", (">=", 2.0), history),
        rate("prompt lookup on open-ended prompts", "prompt lookup (default)", open_, "lookup", (">=", 0.95)),
        rate(
            "prompt lookup, always up to 10 drafted, on code edits", "prompt lookup (10)", edits, "lookup10"
        ),
        rate("8-bit draft model on code edits", "draft model (default)", edits, "draft"),
        rate("8-bit draft model on open-ended prompts", "draft model (default)", open_, "draft"),
        rate("8-bit draft model, always 4 drafted, on code edits", "draft model (4)", edits, "draft4"),
    ]
    o, t = results["oracle"], results["training"]
    s.notes = [
        f"Identical token ids with and without speculation: edits {edits['identical']}, open-ended "
        f"{open_['identical']}.",
        f"Oracle (model-free, the real new versions): {o['tokens_per_verification']:.2f} tokens per "
        f"verification ({o['accepted_per_verification']:.2f} accepted drafts) with drafts of up to 10.",
        f"Accepted / drafted tokens (all reps): edits {edits['accepted_drafted']}, "
        f"open-ended {open_['accepted_drafted']}.",
        f"Checkpoint: tiny shape with {SHAPE} trained to copy, {t['steps']} steps in {t['cpu_seconds']} "
        f"CPU s, final "
        f"loss {t['final_loss']} ({t['corpus_tokens']} tokens of code); its greedy edits vs the old "
        f"versions: difflib ratio {results['copying']['ratio_to_old']} (to as much of their start: "
        f"{results['copying']['ratio_to_old_start']}), share of tokens prompt lookup "
        f"drafts right {results['copying']['lookup_share']}; "
        f"BLAS: {(results['blas'] or {}).get('config', 'bundled reference')}.",
    ]
    s.data = results
    return s


def bench_speculative(ctx: Any) -> Section:
    """Speculative decoding (issue 24), in a fresh process with the optimized BLAS (see the module docs)."""
    missing = [name for name in TRAINING_NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        skipped = Section("speculative", 17, TITLE)
        skipped.skipped = f"{' and '.join(missing)} missing: training its checkpoint needs the test extra"
        return skipped
    results = run(ctx.checkpoints.workdir, tiny=ctx.tiny, reps=ctx.reps, openblas=ctx.openblas, log=ctx.log)
    return section(results, "tiny shape, 4 layers, trained to copy")


def run(workdir: Path, *, tiny: bool, reps: int, openblas: bool, log: Any = print) -> dict[str, Any]:
    """In a fresh process: the optimized BLAS must be loaded before MLX is imported."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    env["LANGCHAIN_STARCODER_BLAS"] = "openblas" if openblas else "reference"
    args = [
        sys.executable,
        "-m",
        "benchmarks.speculative",
        "--workdir",
        str(workdir),
        "--reps",
        str(reps),
        "--json",
    ]
    proc = subprocess.run(
        [*args, *(["--tiny"] if tiny else [])], capture_output=True, text=True, env=env, cwd=REPO
    )
    if proc.returncode != 0:
        msg = f"benchmarks.speculative failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
        raise RuntimeError(msg)
    for line in proc.stderr.splitlines():
        log(line)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.speculative", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--workdir", type=Path, default=REPO / ".bench-work")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="a harness check: seconds of training")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON line")
    args = parser.parse_args(argv)
    import langchain_starcoder  # noqa: F401  (loads the BLAS named by LANGCHAIN_STARCODER_BLAS before MLX)

    results = measure(args.workdir, tiny=args.tiny, reps=args.reps, log=lambda m: print(m, file=sys.stderr))
    if args.json:
        print(json.dumps(results))
    else:
        print(json.dumps(section(results, "trained tiny").to_json(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
