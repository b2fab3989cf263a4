"""Speculative decoding (issue 24): decode tokens/s with and without prompt lookup, and with an 8-bit
draft of the same model, on code edits from a real repository's history and on open-ended prompts.

- Edits: this project's own git history, read offline with ``git``: the first commits (from the root,
  so the set never changes) that changed a Python function of ``langchain_starcoder/``; each edit is
  the function before and after the commit (difflib ratio >= 0.6, 4 to 40 lines). The prompt is
  ``# Before:\\n{old}\\n# After:\\n``, the expected output the new version.
- Open-ended prompts: the first two lines of functions of the standard library's ``difflib``, ``shlex``
  and ``calendar`` (not trained on): code to continue, with nothing to copy but what repeats anyway.
- The checkpoint: random weights copy nothing, so a StarCoder2 of the "tiny" preset's shape (2 layers,
  hidden 64, 4 heads, 2 KV heads, MLP 256, vocabulary 1024) is trained here on a copying task: a
  byte-level BPE trained on the training code, then AdamW (learning rate 1e-3) on
  ``# Before:\\n{s}\\n# After:\\n{s}``, loss on the copy only, one stretch length per batch: first
  batches of 32 random-token stretches of 4 to 24 tokens (only copying predicts them: induction forms
  within one or two thousand such steps) until the loss is below 0.5 or 60% of the time is spent,
  then batches of 16 stretches of 8 to 24..128 tokens (the longest growing with the time spent), half
  random, half from the functions of ``argparse``, ``textwrap``, ``json``, ``pathlib``,
  ``typing``, ``dataclasses``, ``inspect`` and ``configparser`` laid end to end; ``TRAIN_SECONDS`` of
  CPU time with float32 and the optimized BLAS (seed 0). The weights are cached in the work folder;
  the report gives the steps and the final loss.
- Decode tokens/s: completion tokens over generation seconds (prefill excluded), summed over the
  prompts of a set, each greedy, interleaved plain / prompt lookup / draft model. Identical token ids
  across the variants are checked on every prompt.
- Oracle: model-free, prompt lookup run over the edits' real new versions: the tokens each verification
  would yield (accepted run plus the model's own token) if the model wrote exactly the new version.

Run alone: ``python -m benchmarks.speculative [--workdir DIR] [--tiny] [--reference-blas]``; in the suite:
``--only speculative``.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import hashlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from .harness import REPO, Row, Section

TRAIN_MODULES = (
    "argparse", "textwrap", "json.decoder", "json.encoder", "pathlib", "typing", "dataclasses",
    "inspect", "configparser",
)  # fmt: skip
OPEN_MODULES = ("difflib", "shlex", "calendar")
TRAIN_SECONDS = 540
CHUNK_TOKENS, BATCH, LEARNING_RATE, WARM_FRACTION = 128, 16, 1e-3, 0.6
EDITS, OPEN_PROMPTS, MAX_TOKENS = 12, 12, 160
HEADER, SEPARATOR = "# Before:\n", "\n# After:\n"
_PACKAGE = "langchain_starcoder/"


# --- tasks ---------------------------------------------------------------------------------------


def functions(module_name: str) -> list[str]:
    """The source of every function (and method) of a module, dedented, in file order."""
    import importlib

    source = inspect.getsource(importlib.import_module(module_name))
    return [text for _, text in _defs(source).items()]


def _defs(source: str) -> dict[str, str]:
    """Qualified name -> dedented source of each function in ``source`` (empty if it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    out: dict[str, str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    segment = ast.get_source_segment(source, child)
                    if segment:
                        out.setdefault(name, textwrap.dedent(" " * child.col_offset + segment))
                visit(child, name + ".")

    visit(tree, "")
    return out


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
                old, new = (_defs(git("show", f"{rev}:{path}")) for rev in (parents[0], commit))
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


def edit_prompt(old: str) -> str:
    return f"{HEADER}{old}{SEPARATOR}"


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


# --- the trained checkpoint --------------------------------------------------------------------


def training_functions() -> list[str]:
    return [f for module in TRAIN_MODULES for f in functions(module)]


def build_copier(workdir: Path, seconds: float, log: Any = print) -> tuple[Path, dict[str, Any]]:
    """A tiny-shaped StarCoder2 trained to copy the function in its prompt (cached in ``workdir``)."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    import numpy as np
    from mlx.utils import tree_flatten
    from tokenizers import Tokenizer

    from langchain_starcoder.models.starcoder2 import Model, ModelArgs
    from langchain_starcoder.testing import SPECIAL_TOKENS, build_starcoder2
    from langchain_starcoder.testing.tokenizer import write_tokenizer

    corpus = training_functions()
    key = hashlib.sha256(
        json.dumps([corpus, seconds, CHUNK_TOKENS, BATCH, LEARNING_RATE, WARM_FRACTION, 7]).encode()
    ).hexdigest()[:12]
    folder = Path(workdir) / f"copier-{key}"
    done = folder / "training.json"
    if done.exists():
        return folder, json.loads(done.read_text())
    log(f"  training a copying StarCoder2 for {seconds:.0f} s -> {folder}")
    build_starcoder2(folder, preset="tiny", sliding_window=0)
    config = json.loads((folder / "config.json").read_text())
    write_tokenizer(folder, config["vocab_size"], None, corpus=corpus)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    stream = [t for f in corpus for t in [*tokenizer.encode(f).ids, 0]]  # the functions, end to end
    head, sep = tokenizer.encode(HEADER).ids, tokenizer.encode(SEPARATOR).ids
    mx.random.seed(0)
    rng = np.random.default_rng(0)
    model = Model(ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    optimizer = optim.AdamW(learning_rate=LEARNING_RATE, weight_decay=0.0)

    def loss_fn(model: Any, inputs: mx.array, targets: mx.array, mask: mx.array) -> mx.array:
        losses = nn.losses.cross_entropy(model(inputs), targets, reduction="none")
        return (losses * mask).sum() / mask.sum()

    step_fn = nn.value_and_grad(model, loss_fn)
    started, steps, warm_steps, losses = time.process_time(), 0, 0, []
    while time.process_time() - started < seconds:
        # One length per batch (no padding): a stretch, the separator, the same stretch again. First
        # short stretches of random tokens, which only copying predicts, then longer ones, half of them
        # code, so that it copies code from far back.
        progress = (time.process_time() - started) / seconds
        warm = warm_steps == steps and progress < WARM_FRACTION  # once over, it stays over
        warm = warm and (len(losses) < 200 or statistics.mean(losses[-50:]) > 0.5)
        if warm:
            n, warm_steps = int(rng.integers(4, 25)), steps + 1
        else:  # the longest stretch grows with the time left
            n = int(rng.integers(8, 24 + int((CHUNK_TOKENS - 24) * min(1.0, 1.5 * progress)) + 1))
        rows_n = 2 * BATCH if warm else BATCH
        code = 0 if warm else rows_n // 2
        stretches = [stream[i : i + n] for i in rng.integers(0, len(stream) - n, code)]
        stretches += rng.integers(len(SPECIAL_TOKENS), config["vocab_size"], (rows_n - code, n)).tolist()
        rows = [head + x + sep + x for x in stretches]
        ids = np.array(rows, np.int32)
        mask = np.zeros((rows_n, ids.shape[1] - 1), np.float32)
        mask[:, ids.shape[1] - 1 - n :] = 1  # predict the copy only
        loss, grads = step_fn(model, mx.array(ids[:, :-1]), mx.array(ids[:, 1:]), mx.array(mask))
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state, loss)
        losses.append(loss.item())
        steps += 1
        if steps % 100 == 0:
            log(f"    step {steps}: loss {statistics.mean(losses[-100:]):.3f}")
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    info = {
        "steps": steps, "cpu_seconds": round(time.process_time() - started, 1), "corpus_tokens": len(stream),
        "final_loss": round(statistics.mean(losses[-50:]), 4), "random_token_steps": warm_steps,
        "batch": BATCH, "learning_rate": LEARNING_RATE,
    }  # fmt: skip
    done.write_text(json.dumps(info))
    return folder, info


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


def measure(workdir: Path, *, tiny: bool, reps: int, log: Any = print) -> dict[str, Any]:
    """Train (or reuse) the copier, then time plain, prompt lookup and the 8-bit draft model."""
    from langchain_starcoder import StarCoderEngine, blas
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
        results["edits"] = len(edits)
        return results
    finally:
        for engine in engines.values():
            engine.close()


def section(results: dict[str, Any], shape: str) -> Section:
    s = Section("speculative", 17, "Speculative decoding: prompt lookup and a draft model, same output")
    edits, open_ = results["sets"]["edits"], results["sets"]["open"]
    s.rows = [
        Row(17, "prompt lookup on code edits", "decode tok/s", "prompt lookup (default)", "plain",
            edits["rates"]["lookup"], edits["rates"]["plain"], "tok/s", shape, (">=", 2.0),
            f"{results['edits']} edits from this repository's history"),
        Row(17, "prompt lookup on open-ended prompts", "decode tok/s", "prompt lookup (default)", "plain",
            open_["rates"]["lookup"], open_["rates"]["plain"], "tok/s", shape, (">=", 0.95)),
        Row(17, "prompt lookup, always up to 10 drafted, on code edits", "decode tok/s", "prompt lookup (10)",
            "plain", edits["rates"]["lookup10"], edits["rates"]["plain"], "tok/s", shape, None),
        Row(17, "8-bit draft model on code edits", "decode tok/s", "draft model (default)", "plain",
            edits["rates"]["draft"], edits["rates"]["plain"], "tok/s", shape, None),
        Row(17, "8-bit draft model on open-ended prompts", "decode tok/s", "draft model (default)", "plain",
            open_["rates"]["draft"], open_["rates"]["plain"], "tok/s", shape, None),
        Row(17, "8-bit draft model, always 4 drafted, on code edits", "decode tok/s", "draft model (4)",
            "plain", edits["rates"]["draft4"], edits["rates"]["plain"], "tok/s", shape, None),
    ]  # fmt: skip
    o, t = results["oracle"], results["training"]
    s.notes = [
        f"Identical token ids with and without speculation: edits {edits['identical']}, open-ended "
        f"{open_['identical']}.",
        f"Oracle (model-free, the real new versions): {o['tokens_per_verification']:.2f} tokens per "
        f"verification ({o['accepted_per_verification']:.2f} accepted drafts) with drafts of up to 10.",
        f"Accepted / drafted tokens (all reps): edits {edits['accepted_drafted']}, "
        f"open-ended {open_['accepted_drafted']}.",
        f"Checkpoint: tiny shape trained to copy, {t['steps']} steps in {t['cpu_seconds']} CPU s, final "
        f"loss {t['final_loss']} ({t['corpus_tokens']} tokens of code); "
        f"BLAS: {(results['blas'] or {}).get('config', 'bundled reference')}.",
    ]
    s.data = results
    return s


def bench_speculative(ctx: Any) -> Section:
    """Speculative decoding (issue 24), in a fresh process with the optimized BLAS (see the module docs)."""
    results = run(ctx.checkpoints.workdir, tiny=ctx.tiny, reps=ctx.reps, openblas=ctx.openblas, log=ctx.log)
    return section(results, "tiny shape, trained to copy")


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
