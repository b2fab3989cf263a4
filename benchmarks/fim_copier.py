"""The evaluation's checkpoint (issue 40): a model trained here to complete code by looking it up.

Random weights complete nothing, so the speculative benchmark's copier (``copier.build_copier``:
the tiny shape with 4 layers, trained with PyTorch to copy a function after ``# After:``; that
benchmark's cache, in a shared work folder) is trained the same way (one thread, AdamW) in
rounds (``ROUNDS``, the k-th seeded k), each from the one before and cached by its recipe, of two
phases:

1. Looking up: rows of standard-library code lines where some lines come back, whole or after the
   start of another line, the loss only on what the line's earlier occurrence predicts
   (``lookup_row``). The copier alone copies only after its ``# After:`` cue.
2. FIM: prompts built by this package (``build_fim_prompt``, StarCoder2's repository layout, mostly
   SPM, with and without repository context from ``RepoIndex.context_files``) around ``line`` and
   ``cross_file`` holes cut by ``cut_holes`` from standard-library packages (``TRAIN_PACKAGES``), each
   file cut to the window the evaluation cuts (``windowed``), only those whose answer the prompt holds
   after the same cue (``copyable``); the loss on the middle and its ``<|endoftext|>``.

It never sees the evaluated repositories; it learns to look up, not to write code.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from .copier import TRAIN_SECONDS, build_copier
from .harness import recipe_key
from .torch_training import adamw, optimize, save_weights, schedule, starcoder2

#: Standard-library packages the FIM training cuts its holes from (never the evaluated ones).
TRAIN_PACKAGES = (
    "asyncio",
    "email",
    "http",
    "logging",
    "unittest",
    "importlib",
    "concurrent",
    "multiprocessing",
    "xml",
    "urllib",
    "json",
    "sqlite3",
    "ctypes",
    "idlelib",
    "tkinter",
    "lib2to3",
)
#: Each hole's file cut to this many characters before and after it; its context and prompt budgets.
PREFIX_CHARS, SUFFIX_CHARS = 1200, 400
REPO_TOKENS, MAX_PROMPT_TOKENS = 1024, 2000
#: The copier's training is the speculative benchmark's own (one cache in a shared work folder).
COPY_SECONDS = TRAIN_SECONDS
#: Rounds of training: each round's look-up phases ((steps, tokens a row, rows a step), short rows
#: first, where look-up forms fast), then its FIM steps. The later ones look up farther back (where the
#: first looked up worst: the context's distance) and train FIM for longer (its loss still fell).
ROUNDS = (
    (((3000, 128, 16), (1500, 512, 4), (3000, 1536, 1)), 400),
    (((3000, 1536, 1),), 1200),
    (((3000, 1536, 1),), 1600),
)
#: Looking up: its learning rate, the tokens of a line's start that identify it, the share of lines
#: that come back.
LOOKUP_LR, CUE_TOKENS, COMEBACK_SHARE = 1e-3, 3, 0.35
#: FIM: learning rate, prompts a step, holes cut from each package (before ``copyable``); the share
#: of prompts given repository context, the share in SPM order, and the characters before the hole
#: that must precede its answer elsewhere in the prompt.
FIM_LR, BATCH, HOLES_PER_PACKAGE = 5e-4, 4, 2000
CONTEXT_SHARE, SPM_SHARE, TAIL_CHARS = 0.7, 0.8, 8
#: What training the checkpoint imports (the test extra); without them the section is skipped.
TRAINING_NEEDS = ("torch", "transformers")


# --- repositories --------------------------------------------------------------------------------


def package_repo(name: str, dest: Path) -> Path:
    """A folder holding a copy of the installed (or standard-library) package ``name``'s source
    (``dest/name/name``)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        msg = f"{name} is not an installed package (a folder of modules)."
        raise RuntimeError(msg)
    source = Path(next(iter(spec.submodule_search_locations)))
    repo = dest / name
    if not (repo / name).is_dir():
        tmp = dest / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(source, tmp / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
        tmp.rename(repo)
    return repo


def windowed(hole: Any) -> Any:
    """The hole with its file cut to ``PREFIX_CHARS`` before it and ``SUFFIX_CHARS`` after it, at lines."""
    prefix, suffix = hole.prefix, hole.suffix
    if len(prefix) > PREFIX_CHARS:
        start = prefix.find("\n", len(prefix) - PREFIX_CHARS)
        prefix = prefix[start + 1 :] if start >= 0 else prefix[-PREFIX_CHARS:]
    if len(suffix) > SUFFIX_CHARS:
        end = suffix.rfind("\n", 0, SUFFIX_CHARS)
        suffix = suffix[: end + 1] if end >= 0 else suffix[:SUFFIX_CHARS]
    return dataclasses.replace(hole, prefix=prefix, suffix=suffix)


def with_context(index: Any, hole: Any, count_tokens: Any) -> tuple[Any, ...]:
    """The repository context of ``hole``, looked up with its whole file (the imports at its top name
    the files it uses), within ``REPO_TOKENS``."""
    found = index.context_files(
        hole.file, hole.prefix, hole.suffix, max_tokens=REPO_TOKENS, count_tokens=count_tokens
    )
    return tuple(found)


# --- the trained checkpoint ----------------------------------------------------------------------


def code_lines(repos: list[Path], tokenizer: Any, rng: random.Random) -> list[list[int]]:
    """The token ids of the non-trivial lines of ``repos``' Python files (each with its newline)."""
    lines = [
        line
        for repo in repos
        for path in sorted(repo.rglob("*.py"))
        for line in path.read_text(errors="ignore").splitlines()
        if len(line.strip()) > 8
    ]
    rng.shuffle(lines)
    encoded = (tokenizer.encode(line + "\n", add_special_tokens=False).ids for line in lines[:80_000])
    return [ids for ids in encoded if len(ids) > CUE_TOKENS + 2]


def lookup_row(lines: list[list[int]], length: int, rng: random.Random) -> tuple[list[int], list[bool]]:
    """``length + 1`` tokens of lines, some of which come back: whole (trained after their first
    ``CUE_TOKENS``) or from a point on, after the start of another line and the ``CUE_TOKENS`` before
    that point (trained from it); and which of the ``length`` predicted tokens are trained."""
    ids: list[int] = []
    mask: list[bool] = []
    seen: list[list[int]] = []
    while len(ids) <= length:
        if len(seen) > 2 and rng.random() < COMEBACK_SHARE:
            line = rng.choice(seen)
            if rng.random() < 0.5:
                head, start = [], CUE_TOKENS
            else:
                other = rng.choice(lines)
                head = other[: rng.randrange(1, len(other) - 1)]
                start = rng.randrange(CUE_TOKENS, len(line) - 1)
            ids += head + line[start - CUE_TOKENS :]
            mask += [False] * (len(head) + CUE_TOKENS) + [True] * (len(line) - start)
        else:
            line = rng.choice(lines)
            seen.append(line)
            ids += line
            mask += [False] * len(line)
    return ids[: length + 1], mask[1 : length + 1]


def copyable(hole: Any, files: tuple[Any, ...]) -> bool:
    """Whether the prompt holds the hole's answer where looking up finds it: its first line, after the
    ``TAIL_CHARS`` characters that end the prefix (not blank), in a context file or elsewhere in the
    file's window."""
    head = hole.prefix[hole.prefix.rfind("\n") + 1 :]
    answer = hole.truth.split("\n", 1)[0]
    if not head[-TAIL_CHARS:].strip() or len(answer.strip()) < 2:
        return False  # after indentation alone, which of the prompt's lines comes is a guess
    elsewhere = [f.text for f in files] + [hole.prefix[: len(hole.prefix) - len(head)], hole.suffix]
    return any(head[-TAIL_CHARS:] + answer in text for text in elsewhere)


def fim_examples(
    tokenizer: Any, repos: list[Path], per_repo: int, seed: int, log: Any
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, middle ids + ``<|endoftext|>``) of the :func:`copyable` holes cut from ``repos``: SPM
    or PSM, with repository context or without, each prompt built by this package as the evaluation
    builds it."""
    from langchain_starcoder.evaluation import cut_holes
    from langchain_starcoder.fim import FIMRequest, build_fim_prompt
    from langchain_starcoder.repo import RepoIndex

    rng = random.Random(seed)

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    examples = []
    for repo in repos:
        index = RepoIndex(repo)
        holes = cut_holes(index, kinds=("line", "cross_file"), n=per_repo, seed=0)
        kept = len(examples)
        for whole in holes:
            files = with_context(index, whole, count) if rng.random() < CONTEXT_SHARE else ()
            hole = windowed(whole)
            if not copyable(hole, files):
                continue
            request = FIMRequest(
                hole.prefix,
                hole.suffix,
                context_files=files,
                file_path=hole.file,
                mode="spm" if rng.random() < SPM_SHARE else "psm",
                max_prompt_tokens=MAX_PROMPT_TOKENS,
            )
            prompt = build_fim_prompt(tokenizer, request).token_ids
            examples.append((prompt, [*tokenizer.encode(hole.truth, add_special_tokens=False).ids, 0]))
        log(f"    {repo.name}: {len(examples) - kept} of {len(holes)} holes")
    rng.shuffle(examples)
    return examples


def build_fim_copier(
    workdir: Path,
    log: Any = print,
    *,
    copy_seconds: float = COPY_SECONDS,
    rounds: tuple[tuple[tuple[tuple[int, int, int], ...], int], ...] = ROUNDS,
    packages: tuple[str, ...] = TRAIN_PACKAGES,
    per_package: int = HOLES_PER_PACKAGE,
) -> tuple[Path, dict]:
    """The speculative benchmark's copier (``copy_seconds`` CPU s of copying) trained in ``rounds`` to
    look up, then on FIM prompts (see the module's docs); each round cached in ``workdir`` by its recipe.
    """
    folder, copied = build_copier(workdir, copy_seconds, log)
    trained = []
    for seed, (lookup_phases, fim_steps) in enumerate(rounds):
        recipe = [folder.name, lookup_phases, LOOKUP_LR, CUE_TOKENS, COMEBACK_SHARE, fim_steps, FIM_LR]
        recipe += [BATCH, packages, per_package, CONTEXT_SHARE, SPM_SHARE, TAIL_CHARS, PREFIX_CHARS]
        recipe += [SUFFIX_CHARS, REPO_TOKENS, MAX_PROMPT_TOKENS, 2]
        done = Path(workdir) / f"fim-copier-{recipe_key(recipe)}"
        if not (done / "training.json").exists():
            log(f"  training round {seed + 1}: looking up, then FIM prompts -> {done}")
            _round(folder, done, seed, lookup_phases, fim_steps, packages, per_package, log)
        folder = done
        trained.append(json.loads((done / "training.json").read_text()))
    return folder, {"copier": copied, "rounds": trained}


def _round(
    start: Path,
    folder: Path,
    seed: int,
    lookup_phases: tuple[tuple[int, int, int], ...],
    fim_steps: int,
    packages: tuple[str, ...],
    per_package: int,
    log: Any,
) -> None:
    """One round of training from the checkpoint in ``start`` to ``folder``."""
    from tokenizers import Tokenizer

    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(start, tmp)
    tokenizer = Tokenizer.from_file(str(tmp / "tokenizer.json"))
    repos = [package_repo(name, folder.parent / "stdlib-repos") for name in packages]
    config = json.loads((tmp / "config.json").read_text())
    model = starcoder2(config, seed, weights=tmp / "model.safetensors")
    started = time.process_time()

    rng = random.Random(seed)
    lines = code_lines(repos, tokenizer, rng)
    rows = (
        [lookup_row(lines, length, rng) for _ in range(per_step)]
        for steps, length, per_step in lookup_phases
        for _ in range(steps)
    )
    lookup_steps = sum(steps for steps, _, _ in lookup_phases)
    lookup_loss = _train(model, rows, lookup_steps, LOOKUP_LR, "looking up", log)
    lookup_seconds = time.process_time() - started

    examples = fim_examples(tokenizer, repos, per_package, seed, log)
    if not examples:
        msg = f"no hole of {', '.join(packages)} has its answer in its prompt: nothing to train on."
        raise RuntimeError(msg)
    batches = (
        [_fim_row(*examples[(step * BATCH + k) % len(examples)]) for k in range(BATCH)]
        for step in range(fim_steps)
    )
    fim_loss = _train(model, batches, fim_steps, FIM_LR, "FIM", log)
    save_weights(model, tmp / "model.safetensors")
    info = {
        "start": start.name,
        "lookup_steps": lookup_steps,
        "lookup_loss": round(lookup_loss, 4),
        "lookup_cpu_seconds": round(lookup_seconds, 1),
        "steps": fim_steps,
        "examples": len(examples),
        "epochs": round(fim_steps * BATCH / len(examples), 2),
        "cpu_seconds": round(time.process_time() - started, 1),
        "final_loss": round(fim_loss, 4),
    }
    (tmp / "training.json").write_text(json.dumps(info))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def _fim_row(prompt: list[int], middle: list[int]) -> tuple[list[int], list[bool]]:
    """A FIM example as a row and the predictions trained: the middle and its end."""
    return prompt + middle, [False] * (len(prompt) - 1) + [True] * len(middle)


def _train(model: Any, batches: Any, steps: int, lr: float, name: str, log: Any) -> float:
    """``steps`` AdamW steps on ``batches`` of (ids, which predictions are trained) rows, padded on the
    right (a causal model's earlier positions never see the padding); the mean loss of the last 100."""
    import torch

    optimizer = adamw(model, lr)
    losses: list[float] = []
    for step, rows in enumerate(batches):
        width = max(len(ids) for ids, _ in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        trained = torch.zeros((len(rows), width - 1), dtype=torch.bool)
        for k, (row, mask) in enumerate(rows):
            ids[k, : len(row)] = torch.tensor(row)
            trained[k, : len(mask)] = torch.tensor(mask)
        schedule(optimizer, lr, step, step / steps, warmup=50)
        logits = model(input_ids=ids[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits[trained], ids[:, 1:][trained])
        losses.append(optimize(model, optimizer, loss))
        if (step + 1) % 500 == 0:
            log(f"    {name}, step {step + 1}: loss {statistics.mean(losses[-100:]):.3f}")
    return statistics.mean(losses[-100:])
