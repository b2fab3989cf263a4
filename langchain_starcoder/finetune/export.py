"""An adapter of ``mlx_lm.lora`` (``adapters.safetensors`` + ``adapter_config.json``) made something other
engines take: the base's weights with it merged (:func:`fuse_adapter`), PEFT's layout (:func:`to_peft`,
a pure function of the adapter's tensors) and llama.cpp's GGUF adapter (:func:`to_gguf_lora`).

mlx-lm's LoRA computes ``y = W x + scale * (x @ A) @ B`` with ``A`` (in, r) and ``B`` (r, out); PEFT
computes ``W x + (lora_alpha / r) * B' A' x`` with ``A'`` (r, in) and ``B'`` (out, r): so ``A' = A.T``,
``B' = B.T`` and ``lora_alpha = scale * r`` (``use_rslora`` off). DoRA's magnitude ``m`` is PEFT's
``lora_magnitude_vector``: both divide by the row norms of ``W + scale * B' A'``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoints.folders import staged_folder
from ..errors import CheckpointError, InvalidParameterError
from ..gguf_format.lora import LEAF, adapter_tensors, lora_alpha, write_adapter_gguf
from ..loading.adapter import CONFIG_FILE, Adapter, read_adapter

__all__ = ["fuse_adapter", "to_gguf_lora", "to_peft"]

PEFT_WEIGHTS = "adapter_model.safetensors"
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
#: PEFT prefixes module names with its wrappers' attributes (PeftModel.base_model.model).
PEFT_PREFIX = "base_model.model."
_COPIED = ("*.json", "*.txt", "*.jinja", "tokenizer.model")
_NOT_COPIED = {"config.json", "model.safetensors.index.json", "langchain-starcoder.json"}


def check_adapter_fits(adapter: Adapter, model_dir: Path, config: dict[str, Any]) -> None:
    """Refuse (:class:`CheckpointError`) an adapter with a tensor that fits no module of the base
    ``model_dir`` (another architecture, size, depth or vocabulary), naming both; from the shapes in
    the files' headers, without loading either."""
    from ..loading import expected_tensors, model_args

    if config.get("model_type") != "starcoder2":
        msg = f"{model_dir} is a {config.get('model_type')} model; adapters are exported for StarCoder2 only."
        raise CheckpointError(msg)
    shapes = expected_tensors(model_args(config))
    for name, shape in adapter.shapes.items():
        module, _, leaf = name.rpartition(".")
        weight = shapes.get(f"{module}.weight")
        if adapter.fine_tune_type == "full":
            fits = tuple(shapes.get(name, ())) == shape
        else:
            fits = weight is not None and len(weight) == 2 and _fits_leaf(leaf, shape, tuple(weight))
        if not fits:
            where = f"its weight {tuple(weight)}" if weight else "no such module"
            msg = (
                f"The adapter {adapter.path} was trained on another base ({adapter.base}) than {model_dir}: "
                f"its {name} has shape {shape}, and {model_dir.name} has {where}. "
                "Export it with the base it was trained on."
            )
            raise CheckpointError(msg)


def _fits_leaf(leaf: str, shape: tuple[int, ...], weight: tuple[int, ...]) -> bool:
    """Whether a LoRA/DoRA leaf of ``shape`` fits a weight of (out, in) ``weight``."""
    out_dims, in_dims = weight
    if leaf == "lora_a":
        return len(shape) == 2 and shape[0] == in_dims
    if leaf == "lora_b":
        return len(shape) == 2 and shape[1] == out_dims
    return shape == (out_dims,)


def _load_base(model_dir: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    from ..loading import read_config, resolve_model_path

    path = resolve_model_path(model_dir)
    return path, read_config(path)


def fuse_adapter(
    model_dir: str | os.PathLike[str],
    adapter_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    dequantize: bool = False,
) -> Path:
    """Write ``out``, a checkpoint folder of the base ``model_dir`` with the adapter merged into its
    weights (mlx-lm's layers' ``fuse()``, as ``mlx_lm.fuse`` does): this package's loader and GGUF
    converter, transformers and mlx-lm load it. A quantized base stays quantized unless ``dequantize``.
    ``out`` must not exist or be empty; it appears only once complete."""
    import mlx.core as mx
    from mlx.utils import tree_unflatten
    from mlx_lm.utils import dequantize_model, save_config, save_model

    from ..loading import load_model
    from ..loading.adapter import apply_adapter

    base, config = _load_base(model_dir)
    adapter = read_adapter(adapter_dir)
    check_adapter_fits(adapter, base, config)
    with staged_folder(Path(out).expanduser(), False, source=base, command="export-adapter") as tmp:
        dtype = _stored_dtype(config)
        loaded = load_model(base, quantize=None, group_size=64, dtype=dtype, config=config)
        model = loaded.model
        apply_adapter(model, loaded.args, adapter, str(base))
        fused = [(n, m.fuse(dequantize=dequantize)) for n, m in model.named_modules() if hasattr(m, "fuse")]
        if fused:
            model.update_modules(tree_unflatten(fused))
        if dequantize:
            model = dequantize_model(model)
            config = {k: v for k, v in config.items() if k not in ("quantization", "quantization_config")}
        mx.eval(model.parameters())
        save_model(tmp, model, donate_model=True)
        save_config(config, tmp / "config.json")
        for pattern in _COPIED:
            for file in base.glob(pattern):
                if file.name not in _NOT_COPIED and file.is_file():
                    shutil.copy2(file, tmp / file.name)
    return Path(out)


def _stored_dtype(config: dict[str, Any]) -> str:
    """The dtype the base is kept in, so that fusing changes the weights by the adapter only."""
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return dtype if dtype in ("float32", "float16", "bfloat16") else "float32"


def peft_tensors(adapter: Adapter) -> dict[str, np.ndarray]:
    """The adapter's tensors under PEFT's names and shapes (A (r, in), B (out, r), the DoRA magnitude)."""
    if adapter.fine_tune_type == "full":
        msg = (
            f"{adapter.path} is a full fine-tune: it has no low-rank factors for PEFT's layout. "
            "Export it with --fused instead."
        )
        raise InvalidParameterError(msg)
    names = {"lora_a": "lora_A.weight", "lora_b": "lora_B.weight", "m": "lora_magnitude_vector"}
    out = {}
    for name, array in adapter_tensors(adapter).items():
        match = LEAF.match(name)
        assert match is not None  # adapter_tensors checked every name
        value = array.T if array.ndim == 2 else array
        out[f"{PEFT_PREFIX}{match['module']}.{names[match['leaf']]}"] = np.ascontiguousarray(value)
    return out


def peft_config(adapter: Adapter, *, base_model_name_or_path: str | None = None) -> dict[str, Any]:
    """PEFT's ``adapter_config.json`` for ``adapter``: ``lora_alpha = scale * r`` (PEFT scales by
    alpha / r), the modules' last names as ``target_modules``, and the layers it holds."""
    lora = adapter.config["lora_parameters"]
    modules = list(dict.fromkeys(name.rpartition(".")[0] for name in adapter.shapes))
    layers = sorted({int(m[1]) for name in modules if (m := _LAYER.match(name))})
    targets = sorted({name.rpartition(".")[2] for name in modules})
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path or adapter.config.get("model"),
        "r": int(lora["rank"]),
        "lora_alpha": lora_alpha(adapter),
        "lora_dropout": float(lora["dropout"]),
        "target_modules": targets,
        # exact: PEFT would otherwise add (zero) factors to every layer mlx-lm's num_layers left out
        "layers_to_transform": layers,
        "layers_pattern": "layers",
        "use_dora": adapter.fine_tune_type == "dora",
        "use_rslora": False,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
        "init_lora_weights": True,
    }


def to_peft(
    adapter_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    model_dir: str | os.PathLike[str] | None = None,
    base_model_name_or_path: str | None = None,
) -> Path:
    """Write the adapter in PEFT's layout to the folder ``out`` (``adapter_config.json``,
    ``adapter_model.safetensors``), from its tensors alone; with ``model_dir`` it is first checked
    against that base. llama.cpp's ``convert_lora_to_gguf.py`` and PEFT's ``PeftModel.from_pretrained``
    read the result."""
    from safetensors.numpy import save_file

    adapter = read_adapter(adapter_dir)
    source = None
    if model_dir is not None:
        source, config = _load_base(model_dir)
        check_adapter_fits(adapter, source, config)
    tensors = peft_tensors(adapter)
    settings = peft_config(adapter, base_model_name_or_path=base_model_name_or_path)
    with staged_folder(Path(out).expanduser(), False, source=source, command="export-adapter") as tmp:
        save_file(tensors, str(tmp / PEFT_WEIGHTS), metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
    return Path(out)


def to_gguf_lora(
    adapter_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    base: str | os.PathLike[str] | None = None,
) -> Path:
    """Write the LoRA adapter as llama.cpp's GGUF adapter file ``out`` (``llama-server -m BASE.gguf --lora
    OUT``), as llama.cpp's ``convert_lora_to_gguf.py`` writes its PEFT layout; with ``base`` (a GGUF file,
    or a checkpoint folder or hub id) checked against that base first. ``out`` must not exist."""
    from ..checkpoints.folders import DestinationError
    from ..gguf_format import is_gguf, resolve_gguf_file
    from ..gguf_format.write import whole_file

    adapter = read_adapter(adapter_dir)
    out = Path(out).expanduser()
    if out.exists() or out.is_symlink():
        msg = f"{out} already exists; choose another file, or remove it first."
        raise DestinationError(msg)
    base_gguf = None
    if base is not None and is_gguf(base, None):
        base_gguf = resolve_gguf_file(base, None, None)
    elif base is not None:
        folder, config = _load_base(base)
        check_adapter_fits(adapter, folder, config)
    with whole_file(out) as partial:
        write_adapter_gguf(adapter, partial, base=base_gguf)
    return out
