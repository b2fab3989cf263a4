"""The evaluation's checkpoint (issue 40): a model trained here that completes some code.

Random weights complete nothing, so the speculative benchmark's copier (``speculative.build_copier``:
the tiny shape with 4 layers, trained with PyTorch to copy a function from its prompt; that benchmark's
cache, in a shared work folder) is trained further, the same way (one thread, AdamW, seed 0), on FIM
prompts built by this package (``build_fim_prompt``, StarCoder2's repository layout, PSM and SPM, with
and without repository context from ``RepoIndex.context_files``) around ``cross_file`` and ``line``
holes cut by ``cut_holes`` from standard-library packages (``TRAIN_PACKAGES``), each hole's file cut to
the window the evaluation cuts (``windowed``). The loss is on the middle and its ``<|endoftext|>``,
with a tenth of the weight on the prompt's tokens. It never sees the evaluated repositories.
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

from .harness import recipe_key
from .speculative import TRAIN_SECONDS, optimize, schedule

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
#: The copier's training is the speculative benchmark's own (one cache in a shared work folder); then FIM.
COPY_SECONDS, FIM_SECONDS = TRAIN_SECONDS, 480
FIM_LR, PROMPT_WEIGHT, BATCH, HOLES_PER_PACKAGE = 1e-3, 0.1, 4, 600
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


def fim_examples(
    tokenizer: Any, repos: list[Path], per_repo: int, log: Any
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, middle ids + ``<|endoftext|>``) of holes cut from ``repos``: PSM or SPM, with
    repository context or without, each prompt built by this package as the evaluation builds it."""
    from langchain_starcoder.evaluation import cut_holes
    from langchain_starcoder.fim import FIMRequest, build_fim_prompt
    from langchain_starcoder.repo import RepoIndex

    rng = random.Random(0)

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    examples = []
    for repo in repos:
        index = RepoIndex(repo)
        holes = cut_holes(index, kinds=("line", "cross_file"), n=per_repo, seed=0)
        for whole in holes:
            files = with_context(index, whole, count) if rng.random() < 0.7 else ()
            hole = windowed(whole)
            request = FIMRequest(
                hole.prefix,
                hole.suffix,
                context_files=files,
                file_path=hole.file,
                mode=rng.choice(("psm", "spm")),
                max_prompt_tokens=MAX_PROMPT_TOKENS,
            )
            prompt = build_fim_prompt(tokenizer, request).token_ids
            examples.append((prompt, [*tokenizer.encode(hole.truth, add_special_tokens=False).ids, 0]))
        log(f"    {repo.name}: {len(holes)} holes")
    rng.shuffle(examples)
    return examples


def build_fim_copier(
    workdir: Path,
    seconds: tuple[float, float],
    log: Any = print,
    *,
    packages: tuple[str, ...] = TRAIN_PACKAGES,
    per_package: int = HOLES_PER_PACKAGE,
) -> tuple[Path, dict]:
    """The speculative benchmark's copier (``seconds[0]`` CPU s of copying) trained ``seconds[1]`` CPU s
    more on FIM prompts with and without repository context (cached in ``workdir``)."""
    import torch
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer
    from transformers import Starcoder2Config, Starcoder2ForCausalLM

    from .speculative import build_copier

    copier, copied = build_copier(workdir, seconds[0], log)
    recipe = [copier.name, float(seconds[1]), packages, FIM_LR, PROMPT_WEIGHT, BATCH, per_package]
    recipe += [PREFIX_CHARS, SUFFIX_CHARS, REPO_TOKENS, MAX_PROMPT_TOKENS, 1]
    key = recipe_key(recipe)
    folder = Path(workdir) / f"fim-copier-{key}"
    done = folder / "training.json"
    if done.exists():
        return folder, json.loads(done.read_text())
    log(f"  training the copier on FIM prompts for {seconds[1]:.0f} CPU s -> {folder}")
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(copier, tmp)
    tokenizer = Tokenizer.from_file(str(tmp / "tokenizer.json"))
    repos = [package_repo(name, Path(workdir) / "stdlib-repos") for name in packages]
    examples = fim_examples(tokenizer, repos, per_package, log)
    if not examples:
        msg = f"no holes in {', '.join(packages)}: nothing to train on."
        raise RuntimeError(msg)
    config = json.loads((tmp / "config.json").read_text())
    hf_config = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = Starcoder2ForCausalLM(Starcoder2Config(**hf_config))
    model.load_state_dict(load_file(str(tmp / "model.safetensors")))
    optimizer = torch.optim.AdamW(model.parameters(), lr=FIM_LR, betas=(0.9, 0.98), weight_decay=0.0)
    started, steps, losses = time.process_time(), 0, []
    while (spent := time.process_time() - started) < seconds[1]:
        batch = [examples[(steps * BATCH + k) % len(examples)] for k in range(BATCH)]
        schedule(optimizer, FIM_LR, steps, spent / seconds[1], warmup=50)
        losses.append(optimize(model, optimizer, _fim_loss(model, batch)))
        steps += 1
        if steps % 200 == 0:
            log(f"    step {steps}: loss {statistics.mean(losses[-100:]):.3f}")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp / "model.safetensors"))
    info = {
        "copier": copied,
        "steps": steps,
        "examples": len(examples),
        "epochs": round(steps * BATCH / len(examples), 2),
        "cpu_seconds": round(time.process_time() - started, 1),
        "final_loss": round(statistics.mean(losses[-100:]), 4),
    }
    (tmp / "training.json").write_text(json.dumps(info))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder, info


def _fim_loss(model: Any, batch: list[tuple[list[int], list[int]]]) -> Any:
    """Cross-entropy on each example's middle, plus ``PROMPT_WEIGHT`` of it on its prompt (rows padded
    on the right: a causal model's earlier positions never see the padding)."""
    import torch

    rows = [prompt + middle for prompt, middle in batch]
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    weight = torch.zeros((len(rows), width - 1))
    for k, ((prompt, middle), row) in enumerate(zip(batch, rows, strict=True)):
        ids[k, : len(row)] = torch.tensor(row)
        weight[k, : len(prompt) - 1] = PROMPT_WEIGHT / max(1, len(prompt) - 1) * len(middle)
        weight[k, len(prompt) - 1 : len(row) - 1] = 1.0
    logits = model(input_ids=ids[:, :-1]).logits
    losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return (losses * weight).sum() / weight.sum()
