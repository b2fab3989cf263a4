"""Fine-tuning adapters in mlx-lm's layout (LoRA, DoRA or full weights), checked and applied to a model.

An adapter is a folder with ``adapter_config.json`` and ``adapters.safetensors``, as ``mlx_lm.lora`` and
``langchain-starcoder finetune`` write it. mlx-lm's ``load_adapters`` applies it. Before that its files
are checked (present, whole), and after its layers are in place its tensors are checked against the
model's: mlx-lm ignores target modules a model lacks and leaves adapter layers the file has no tensors
for at their random start, so an adapter of another base, rank or target modules would load wrong.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, ModelNotFoundError
from .digests import file_digest
from .weights import safetensors_header

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapters.safetensors"
FINE_TUNE_TYPES = ("lora", "dora", "full")
#: The config key where an adapter records its base's shape (:func:`base_signature`): mlx-lm records
#: only the base's path or hub id (``model``), which says nothing of its vocabulary.
BASE_KEY = "base_model"
_LEAVES = ("lora_a", "lora_b", "m")  # what mlx-lm's LoRA and DoRA layers train
_LAYER = re.compile(r"(?:model\.layers|transformer\.h)\.(\d+)\.")
_REDO = (
    "Pass the adapter folder that `langchain-starcoder finetune` or `mlx_lm.lora` wrote, or train it again."
)


@dataclass(frozen=True, eq=False)
class Adapter:
    """An adapter folder, read and checked: its config, its tensors' names and shapes, and its
    identity (a digest of both files' bytes) that keeps prompt caches of different adapters apart."""

    path: Path
    config: dict[str, Any] = field(repr=False)
    shapes: dict[str, tuple[int, ...]] = field(repr=False)
    digest: str

    @property
    def fine_tune_type(self) -> str:
        return str(self.config.get("fine_tune_type", "lora"))

    @property
    def rank(self) -> int | None:
        """The LoRA or DoRA rank its config gives (None for full weights)."""
        return None if self.fine_tune_type == "full" else self.config["lora_parameters"]["rank"]

    @property
    def base(self) -> str:
        """What the adapter says it was trained on: the base's path or hub id, if it says."""
        return str(self.config.get("model") or "an unnamed base")


def read_adapter(path: str | Path) -> Adapter:
    """The adapter in folder ``path``: both files there, the config one mlx-lm can apply, the tensors'
    file whole (its size is what its header describes). A clear error says what is wrong otherwise."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        msg = f"The adapter folder {folder} {what}. {_REDO}"
        raise ModelNotFoundError(msg)
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE) if not (folder / name).is_file()]
    if missing:
        msg = f"The adapter folder {folder} has no {' or '.join(missing)} (an adapter has both). {_REDO}"
        raise ModelNotFoundError(msg)
    config = _read_config(folder / CONFIG_FILE)
    try:
        header = safetensors_header(folder / WEIGHTS_FILE)
    except CheckpointError as e:
        msg = f"The adapter's {WEIGHTS_FILE} in {folder} is damaged: {_why(e)}. Copy it again or retrain it."
        raise CheckpointError(msg) from None
    shapes = {name: tuple(info["shape"]) for name, info in header.items()}
    if not shapes:
        msg = f"The adapter's {WEIGHTS_FILE} in {folder} holds no tensors. {_REDO}"
        raise CheckpointError(msg)
    digest = hashlib.blake2b(digest_size=20)
    digest.update(json.dumps(config, sort_keys=True).encode())
    digest.update(file_digest(folder / WEIGHTS_FILE).encode())
    return Adapter(folder.absolute(), config, shapes, digest.hexdigest())


def _why(error: Exception) -> str:
    """A weights error's reason without its advice (which is for a model's own weights)."""
    return str(error).split("; delete it")[0].split("; replace it")[0]


def _read_config(file: Path) -> dict[str, Any]:
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        msg = f"{file} is not valid JSON ({e}). {_REDO}"
        raise CheckpointError(msg) from None
    kind = config.get("fine_tune_type", "lora") if isinstance(config, dict) else None
    if kind not in FINE_TUNE_TYPES:
        msg = f"{file}: fine_tune_type must be one of {FINE_TUNE_TYPES}, not {kind!r}. {_REDO}"
        raise CheckpointError(msg)
    if kind != "full":
        lora = config.get("lora_parameters")
        layers = config.get("num_layers")
        ok = isinstance(lora, dict) and all(k in lora for k in ("rank", "scale"))
        if not ok or not isinstance(layers, int) or isinstance(layers, bool):
            msg = (
                f"{file} lacks what mlx-lm applies a {kind} adapter with: num_layers (an integer) and "
                f"lora_parameters with rank and scale. {_REDO}"
            )
            raise CheckpointError(msg)
        lora.setdefault("dropout", 0.0)
    return config


def base_signature(args: Any) -> dict[str, Any]:
    """The shape of a base model that an adapter must match (what ``finetune`` records under
    :data:`BASE_KEY`): its family, width, depth and vocabulary."""
    return {
        "model_type": args.model_type,
        "hidden_size": args.hidden_size,
        "num_hidden_layers": args.num_hidden_layers,
        "vocab_size": args.vocab_size,
    }


def _describe(signature: Mapping[str, Any]) -> str:
    return (
        f"{signature.get('model_type')}, hidden size {signature.get('hidden_size')}, "
        f"{signature.get('num_hidden_layers')} layers, vocabulary {signature.get('vocab_size')}"
    )


def apply_adapter(model: Any, args: Any, adapter: Adapter, model_name: str) -> None:
    """Apply ``adapter`` to ``model`` (of config ``args``) with mlx-lm's ``load_adapters``, unfused,
    in inference mode. An adapter trained on another base, or whose tensors do not fit its own config
    (rank, target modules), is refused naming both sides."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.tuner.utils import load_adapters

    ours = check_base(adapter, args, model_name)
    if adapter.fine_tune_type == "full" and any(
        isinstance(m, nn.QuantizedLinear) for _, m in model.named_modules()
    ):
        msg = (
            f"The adapter {adapter.path} holds full weights, which replace {model_name}'s quantized ones: "
            "load the model unquantized (no quantize=, or its full-precision checkpoint)."
        )
        raise CheckpointError(msg)
    try:
        load_adapters(model, str(adapter.path))
        refused = None
    except ValueError as e:  # mlx-lm's list of misfits: said below with what they mean, if we can
        refused = e
    _check_tensors(model, adapter, ours, model_name)
    if refused is not None:
        msg = f"mlx-lm could not apply the adapter {adapter.path} to {model_name}: {refused}"
        raise CheckpointError(msg)
    model.eval()  # mlx-lm's LoRA dropout is off only in inference mode
    mx.eval(model.parameters())


def check_base(adapter: Adapter, args: Any, model_name: str) -> dict[str, Any]:
    """Refuse ``adapter`` for a model of config ``args`` when the base it records (or the layers it has)
    is not this one, naming both; before any weight loads. Returns the model's :func:`base_signature`."""
    ours = base_signature(args)
    theirs = adapter.config.get(BASE_KEY)
    if isinstance(theirs, dict) and any(theirs.get(k) != v for k, v in ours.items()):
        msg = (
            f"The adapter {adapter.path} was trained on {adapter.base} ({_describe(theirs)}); "
            f"{model_name} is {_describe(ours)}. An adapter works only on the base it was "
            "trained on: load that model, or fine-tune one for this model."
        )
        raise CheckpointError(msg)
    _check_layers(adapter, ours, model_name)
    return ours


def _check_layers(adapter: Adapter, ours: Mapping[str, Any], model_name: str) -> None:
    """An adapter with tensors in layers the model does not have was trained on a deeper base."""
    deepest = max((int(m[1]) for name in adapter.shapes if (m := _LAYER.match(name))), default=-1)
    if deepest >= ours["num_hidden_layers"]:
        msg = (
            f"The adapter {adapter.path} has tensors for layer {deepest}, so it was trained on a base of at "
            f"least {deepest + 1} layers ({adapter.base}); {model_name} is {_describe(ours)}. Load the model "
            "it was trained on, or fine-tune one for this model."
        )
        raise CheckpointError(msg)


def _check_tensors(model: Any, adapter: Adapter, ours: Mapping[str, Any], model_name: str) -> None:
    """Every tensor of the file is one the model (with the adapter's layers) has, of its shape, and
    every adapter layer the config makes has its tensors in the file."""
    from mlx.utils import tree_flatten

    params = dict(tree_flatten(model.parameters()))
    full = adapter.fine_tune_type == "full"
    wanted = {n: tuple(p.shape) for n, p in params.items() if full or n.rsplit(".", 1)[-1] in _LEAVES}
    stray = sorted(set(adapter.shapes) - set(wanted))
    if stray:
        modules = sorted({n.rsplit(".", 1)[0] for n in stray})
        base_has = [m for m in modules if f"{m}.weight" in params or f"{m}.linear.weight" in params]
        if len(base_has) < len(modules):
            foreign = [m for m in modules if m not in base_has]
            msg = (
                f"The adapter {adapter.path} adapts modules {model_name} does not have ({foreign[:3]}): "
                f"it was trained on another architecture ({adapter.base}); {model_name} is {_describe(ours)}."
            )
        else:
            msg = (
                f"The adapter {adapter.path}'s {WEIGHTS_FILE} has tensors for {modules[:3]}, which its "
                f"{CONFIG_FILE} does not target (its lora_parameters keys and num_layers): the two files do "
                f"not belong together. {_REDO}"
            )
        raise CheckpointError(msg)
    if not full:
        lacking = sorted({n.rsplit(".", 1)[0] for n in set(wanted) - set(adapter.shapes)})
        if lacking:
            msg = (
                f"The adapter {adapter.path}'s {CONFIG_FILE} targets {len(lacking)} modules its "
                f"{WEIGHTS_FILE} has no tensors for (e.g. {lacking[:3]}): a target-module or num_layers "
                f"mismatch between the two files. {_REDO}"
            )
            raise CheckpointError(msg)
    for name, shape in sorted(adapter.shapes.items()):
        if shape != wanted[name]:
            raise CheckpointError(_shape_error(adapter, name, shape, wanted[name], ours, model_name))


def _shape_error(
    adapter: Adapter,
    name: str,
    found: tuple[int, ...],
    shape: tuple[int, ...],
    ours: Mapping[str, Any],
    model_name: str,
) -> str:
    """What a tensor of the wrong shape means: another rank (the config disagrees with the file), or
    another base (the layer's size differs)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("lora_a", "lora_b") and len(found) == len(shape) == 2:
        rank_axis = 1 if leaf == "lora_a" else 0
        if found[1 - rank_axis] == shape[1 - rank_axis]:
            return (
                f"The adapter {adapter.path}'s {CONFIG_FILE} says rank {adapter.rank}, but its "
                f"{WEIGHTS_FILE} holds {name} of rank {found[rank_axis]} (shape {list(found)}): the two "
                f"files do not belong together. {_REDO}"
            )
    return (
        f"The adapter {adapter.path} holds {name} of shape {list(found)}, where {model_name} needs "
        f"{list(shape)}: it was trained on another base ({adapter.base}); {model_name} is {_describe(ours)}. "
        "Load the model it was trained on, or fine-tune one for this model."
    )
