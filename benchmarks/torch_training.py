"""Training a small StarCoder2 with PyTorch, as the benchmarks' trained checkpoints are trained.

transformers' ``Starcoder2ForCausalLM`` on one thread takes a training step 3-4x faster here than MLX's
CPU build, which is what lets induction form in minutes; its weights' names are those our MLX module
loads, so ``save_weights`` writes a checkpoint the package serves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def starcoder2(config: dict[str, Any], seed: int, weights: Path | None = None) -> Any:
    """A ``Starcoder2ForCausalLM`` of ``config`` (a checkpoint's config.json) on one thread, its random
    weights drawn with ``seed``, or ``weights`` (a model.safetensors) loaded when given."""
    import torch
    from safetensors.torch import load_file
    from transformers import Starcoder2Config, Starcoder2ForCausalLM

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    hf_config = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
    model = Starcoder2ForCausalLM(Starcoder2Config(**hf_config))
    if weights is not None:
        model.load_state_dict(load_file(str(weights)))
    return model


def adamw(model: Any, lr: float) -> Any:
    """AdamW as every benchmark checkpoint trains: betas 0.9 and 0.98, no weight decay."""
    import torch

    return torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)


def schedule(optimizer: Any, base: float, steps: int, progress: float, warmup: int) -> None:
    """The learning rate: warmed up over ``warmup`` steps, then decayed over the last fifth of the time
    (``progress`` 0 to 1), to a tenth at the least."""
    decay = 1.0 if progress < 0.8 else max(0.1, (1 - progress) / 0.2)
    for group in optimizer.param_groups:
        group["lr"] = base * min(1.0, (steps + 1) / warmup) * decay


def optimize(model: Any, optimizer: Any, loss: Any) -> float:
    """One step on ``loss``, gradients clipped to norm 1; the loss's value."""
    import torch

    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def save_weights(model: Any, path: Path) -> None:
    """The model's weights as a model.safetensors."""
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
