"""The copier: a StarCoder2 of the "tiny" preset's shape trained here to copy what its prompt holds.

Random weights copy nothing, so the speculative benchmark (issue 24) and the evaluation's checkpoint
(issue 40, ``fim_copier``, trained on from this one) start from a model of the tiny preset's shape with
4 layers (``SHAPE``; hidden 64, 4 heads, 2 KV heads, MLP 256, vocabulary 1024, no window) trained to
copy (2 layers copied the start of most edits and then slipped; hidden 128 formed no induction in the
time):

- a byte-level BPE trained on the training code, then PyTorch (``torch_training``, one thread, seed 0)
  with AdamW (learning rate 3e-3, warmed up over 100 steps, decayed to a tenth over the last 20% of the
  time, gradients clipped at 1) on rows packed with examples
  ``# Before:\\n{x}\\n# After:\\n{x}<|endoftext|>``, the loss on the copy and its end only;
- ``x`` a third random tokens (only copying predicts them), the rest a function of ``argparse``,
  ``textwrap``, ``json``, ``pathlib``, ``typing``, ``dataclasses``, ``inspect`` or ``configparser`` (at
  most 700 tokens; never the speculative benchmark's edits or open-ended modules), its prompt tokenized
  whole as the benchmark's are;
- 3% of the copied input tokens replaced by random ones (the targets stay right), so that it goes on
  copying after a slip of its own;
- rows of 64 tokens (32 a step) for the first 35% of ``TRAIN_SECONDS`` of CPU time (induction forms
  there), then 256 (8 a step) to 60%, then 1024 (2 a step), so that it copies from as far back as an
  edit prompt needs.

The weights are cached in the work folder by their recipe.
"""

from __future__ import annotations

import ast
import inspect
import json
import statistics
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .harness import recipe_key
from .torch_training import adamw, optimize, save_weights, schedule, starcoder2

TRAIN_MODULES = (
    "argparse",
    "textwrap",
    "json.decoder",
    "json.encoder",
    "pathlib",
    "typing",
    "dataclasses",
    "inspect",
    "configparser",
)
TRAIN_SECONDS = 900
#: (until this share of the training time, rows of n tokens, rows per step): short rows first, where
#: induction forms fast, then long ones, so that it copies from as far back as the edit prompts need.
PHASES = ((0.35, 64, 32), (0.6, 256, 8), (1.0, 1024, 2))
LEARNING_RATE, MAX_COPY, RANDOM_SHARE, SLIPS = 3e-3, 700, 1 / 3, 0.03
#: The copier's shape: the "tiny" preset with these changes (4 layers: induction by step 2,500, and edits
#: copied verbatim for 160 tokens where 2 layers slipped every few lines).
SHAPE: dict[str, int] = {"num_hidden_layers": 4}
#: The copy examples' (and the speculative benchmark's edit prompts') marks around the original.
HEADER, SEPARATOR = "# Before:\n", "\n# After:\n"


def edit_prompt(old: str) -> str:
    return f"{HEADER}{old}{SEPARATOR}"


def functions(module_name: str) -> list[str]:
    """The source of every function (and method) of a module, dedented, in file order."""
    import importlib

    source = inspect.getsource(importlib.import_module(module_name))
    return [text for _, text in definitions(source).items()]


def definitions(source: str) -> dict[str, str]:
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


def training_functions() -> list[str]:
    return [f for module in TRAIN_MODULES for f in functions(module)]


def build_copier(workdir: Path, seconds: float, log: Any = print) -> tuple[Path, dict[str, Any]]:
    """A StarCoder2 of the tiny preset (with ``SHAPE``) trained for ``seconds`` of CPU time to copy the
    function in its prompt (see the module's docs); cached in ``workdir``."""
    import numpy as np

    corpus = training_functions()
    # float(seconds): 900 and 900.0 are the same recipe, one key.
    recipe = [corpus, float(seconds), PHASES, LEARNING_RATE, MAX_COPY, RANDOM_SHARE, SLIPS, SHAPE, 9]
    folder = Path(workdir) / f"copier-{recipe_key(recipe)}"
    done = folder / "training.json"
    if done.exists():
        return folder, json.loads(done.read_text())
    log(f"  training a copying StarCoder2 for {seconds:.0f} CPU s -> {folder}")
    config, tokenizer = shape_and_tokenizer(folder, corpus)
    rows = CopyRows.of(tokenizer, corpus, config["vocab_size"], np.random.default_rng(0))
    model = starcoder2(config, seed=0)
    started = time.process_time()
    steps, losses = _train(model, rows, seconds, log)
    save_weights(model, folder / "model.safetensors")
    info = {
        "steps": steps,
        "cpu_seconds": round(time.process_time() - started, 1),
        "corpus_tokens": sum(len(x) for _, x in rows.examples),
        "final_loss": round(statistics.mean(losses[-100:]), 4),
        "learning_rate": LEARNING_RATE,
        "phases": PHASES,
    }
    done.write_text(json.dumps(info))
    return folder, info


def shape_and_tokenizer(folder: Path, corpus: list[str]) -> tuple[dict[str, Any], Any]:
    """A checkpoint of the copier's shape in ``folder``: the tiny preset with ``SHAPE`` (no window, random
    weights), with a BPE trained on ``corpus``; its config and tokenizer."""
    from tokenizers import Tokenizer

    from langchain_starcoder.testing import build_starcoder2
    from langchain_starcoder.testing.tokenizer import write_tokenizer

    build_starcoder2(folder, preset="tiny", num_layers=SHAPE["num_hidden_layers"], sliding_window=0)
    config = {**json.loads((folder / "config.json").read_text()), **SHAPE}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    write_tokenizer(folder, config["vocab_size"], None, corpus=corpus)
    return config, Tokenizer.from_file(str(folder / "tokenizer.json"))


@dataclass
class CopyRows:
    """Training rows of copy examples laid end to end."""

    examples: list[tuple[list[int], list[int]]]
    """Each function as an edit prompt tokenized whole (as the benchmark's are) and its copy."""
    marks: tuple[list[int], list[int]]
    """The ids of ``HEADER`` and ``SEPARATOR``."""
    vocab: int
    first: int
    """The first id that is not a special token (random copies draw from ``first`` to ``vocab``)."""
    rng: Any

    @classmethod
    def of(cls, tokenizer: Any, corpus: list[str], vocab: int, rng: Any) -> CopyRows:
        from langchain_starcoder.testing import SPECIAL_TOKENS

        examples = [
            (tokenizer.encode(edit_prompt(f)).ids, tokenizer.encode(f).ids)
            for f in corpus
            if 4 <= len(tokenizer.encode(f).ids) <= MAX_COPY
        ]
        marks = (tokenizer.encode(HEADER).ids, tokenizer.encode(SEPARATOR).ids)
        return cls(examples, marks, vocab, len(SPECIAL_TOKENS), rng)

    def row(self, length: int) -> tuple[list[int], list[int], list[bool]]:
        """``# Before:\\n{x}\\n# After:\\n{x}<|endoftext|>`` examples, the loss on the copy and its end
        only; a third random tokens (only copying predicts them), the rest code. Inputs only: a few
        copied tokens are wrong (as a model's slips are), so that it learns to go on copying after one."""
        import numpy as np

        rng, (head, sep) = self.rng, self.marks
        ids: list[int] = []
        mask: list[bool] = []
        while len(ids) <= length:
            if rng.random() < RANDOM_SHARE:
                n = int(rng.integers(4, max(8, min(MAX_COPY, length // 2 - 8))))
                x = rng.integers(self.first, self.vocab, n).tolist()
                prompt = head + x + sep
            else:
                prompt, x = self.examples[int(rng.integers(len(self.examples)))]
            ids += [*prompt, *x, 0]
            mask += [False] * len(prompt) + [True] * (len(x) + 1)
        ids, mask = ids[: length + 1], mask[1 : length + 1]
        slips = (rng.random(length) < SLIPS) & np.array(mask)
        inputs = np.where(slips, rng.integers(self.first, self.vocab, length), ids[:-1]).tolist()
        return inputs, ids[1:], mask


def _train(model: Any, rows: CopyRows, seconds: float, log: Any) -> tuple[int, list[float]]:
    """Steps on ``rows`` for ``seconds`` of CPU time, their lengths by ``PHASES``; the steps and losses."""
    import torch

    optimizer = adamw(model, LEARNING_RATE)
    started, steps, losses = time.process_time(), 0, []
    while (spent := time.process_time() - started) < seconds:
        progress = spent / seconds
        length, batch = next((n, b) for until, n, b in PHASES if progress < until)
        schedule(optimizer, LEARNING_RATE, steps, progress, warmup=100)
        batch_rows = [rows.row(length) for _ in range(batch)]
        inputs, targets, mask = (torch.tensor([r[i] for r in batch_rows]) for i in range(3))
        hidden = model.model(input_ids=inputs).last_hidden_state[mask]  # the scored positions only
        loss = torch.nn.functional.cross_entropy(model.lm_head(hidden), targets[mask])
        losses.append(optimize(model, optimizer, loss))
        steps += 1
        if steps % 500 == 0:
            log(f"    step {steps} (rows of {length}): loss {statistics.mean(losses[-100:]):.3f}")
    return steps, losses
