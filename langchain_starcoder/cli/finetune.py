"""``finetune``: train an adapter on a repository's own code (``langchain_starcoder.finetune``).

Every setting is checked before the model loads; the progress bar shows the loss; the held-out loss
before and after, and where the files went, go to stderr. Ctrl-C saves a checkpoint that ``--resume``
continues from, and exits 130.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from pathlib import Path

from ..finetune.settings import DEFAULTS, METHODS
from .output import PROG, _err, _notes


def _finetune_args(p: argparse.ArgumentParser) -> None:
    """finetune's options, named as ``finetune()``'s keywords."""
    p.add_argument("repo", metavar="REPO", type=Path, help="the repository's folder (its code is trained on)")
    p.add_argument("--model", required=True, metavar="M", help="the base checkpoint: folder or hub id")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="the adapter's folder")
    training = p.add_argument_group("what is trained")
    training.add_argument(
        "--method",
        choices=METHODS,
        default=DEFAULTS.method,
        help="LoRA, DoRA (mlx-lm's layers; over a quantized model: QLoRA) or all weights "
        f"(default {DEFAULTS.method})",
    )
    _numbers(
        training,
        ("--steps", int, "N", "training steps (batches)"),
        ("--rank", int, "R", "the LoRA/DoRA rank"),
        ("--num-layers", int, "N", "the last N layers adapted or trained"),
        ("--batch-size", int, "N", "examples per step"),
        ("--learning-rate", float, "LR", "Adam's learning rate"),
        ("--max-tokens", int, "N", "tokens per example at most"),
    )
    training.add_argument(
        "--grad-checkpoint",
        action="store_true",
        help="recompute activations in the backward pass: less memory, more time (mlx-lm's)",
    )
    data = p.add_argument_group("the data")
    _numbers(
        data,
        ("--held-out", float, "FRACTION", "the share of files kept out of training to measure on"),
        ("--fim-rate", float, "F", "the share of examples with fill in the middle"),
        ("--spm-rate", float, "F", "the share of FIM examples in SPM order (the rest PSM)"),
        ("--seed", int, "N", "the split, the examples and the data order"),
    )
    data.add_argument(
        "--since", metavar="REV", help="hold out the files with code added after this git revision instead"
    )
    progress = p.add_argument_group("checkpoints and the held-out loss")
    _numbers(
        progress,
        ("--save-every", int, "N", "a checkpoint every N steps"),
        ("--eval-every", int, "N", "the held-out loss every N steps"),
        ("--eval-batches", int, "N", "the held-out loss over N batches, the same each time"),
    )
    progress.add_argument(
        "--resume", action="store_true", help="continue from the last checkpoint in DIR (the same settings)"
    )


def _numbers(group: argparse._ArgumentGroup, *rows: tuple[str, type, str, str]) -> None:
    """Numeric options (flag, type, metavar, help), each defaulting to ``finetune()``'s own default."""
    for flag, kind, metavar, text in rows:
        default = getattr(DEFAULTS, flag[2:].replace("-", "_"))
        group.add_argument(
            flag,
            type=kind,
            default=default,
            metavar=metavar,
            help=f"{text} (default {'all' if default is None else default})",
        )


def _cmd_finetune(args: argparse.Namespace) -> int:
    """train an adapter on a repository's own code

    Fine-tune a model on a repository's code in StarCoder2's training layout (FIM at --fim-rate), files
    held out to measure on, through mlx-lm's trainer (LoRA, DoRA or all weights); writes mlx-lm's
    adapter files, finetune.json and loss.png to --out (docs/cli.md).
    """
    # Train; say the held-out loss before and after and where the files are. Exit 2 for a bad setting,
    # 130 on Ctrl-C (after the checkpoint is saved).
    from ..errors import InvalidParameterError
    from ..finetune.train import finetune

    keywords = {name: getattr(args, name) for name in asdict(DEFAULTS)}
    try:
        with _notes():
            result = finetune(
                args.repo, model=args.model, out=args.out, since=args.since, resume=args.resume, **keywords
            )
    except InvalidParameterError as e:  # a bad setting or repository: nothing was trained
        _err(f"{PROG}: error: {e}")
        return 2
    except KeyboardInterrupt:
        from ..finetune.checkpoints import has_checkpoint

        kept = (
            f"the checkpoint in {args.out} continues with --resume"
            if has_checkpoint(args.out)
            else "no checkpoint yet"
        )
        _err(f"{PROG}: interrupted; {kept}.")
        return 130
    _err(
        f"Held-out loss {result.held_out_loss_before:.3f} -> {result.held_out_loss_after:.3f} after "
        f"{result.steps} steps ({len(result.train_files)} files trained on, {len(result.held_out_files)} "
        f"held out; {result.tokens_per_second:.0f} tokens/s)."
    )
    plot = f", {result.plot.name}" if result.plot is not None else ""
    _err(
        f"Wrote the adapter to {result.out} (adapters.safetensors, adapter_config.json, finetune.json{plot})."
    )
    return 0
