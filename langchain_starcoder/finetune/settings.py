"""The fine-tuning settings' defaults, their one home: ``finetune()``'s keywords and the command line's
flags take them from here. It imports nothing heavy, so ``langchain-starcoder --help`` loads no MLX."""

from __future__ import annotations

from dataclasses import dataclass

METHODS = ("lora", "dora", "full")


@dataclass(frozen=True)
class FinetuneDefaults:
    """What ``finetune()`` does when a setting is not given (its docstring says what each one means)."""

    method: str = "lora"
    steps: int = 200
    rank: int = 8
    num_layers: int | None = None
    grad_checkpoint: bool = False
    held_out: float = 0.1
    fim_rate: float = 0.5
    spm_rate: float = 0.5
    batch_size: int = 4
    learning_rate: float = 1e-5
    max_tokens: int = 2048
    save_every: int = 50
    eval_every: int = 50
    eval_batches: int | None = None
    seed: int = 0


DEFAULTS = FinetuneDefaults()
