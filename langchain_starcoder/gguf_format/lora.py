"""An mlx-lm LoRA adapter -> llama.cpp's GGUF adapter file (``llama-server --lora``), laid out as llama.cpp's
``convert_lora_to_gguf.py`` writes one from PEFT's layout: ``general.type`` "adapter", ``adapter.type``
"lora", ``adapter.lora.alpha``, and per adapted weight ``<llama.cpp name>.lora_a`` (PEFT's A, numpy
(r, in)) and ``.lora_b`` (PEFT's B, (out, r)). llama.cpp scales B A by alpha / r, as PEFT does, so
alpha = mlx-lm's scale * r. Written here with the ``gguf`` package: that script needs all of
``convert_hf_to_gguf.py`` and the base's folder, and takes no MLX names (llama.cpp #10551).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from ..errors import CheckpointError, InvalidParameterError
from ..loading.adapter import CONFIG_FILE, WEIGHTS_FILE, Adapter
from .header import GGUFHeader, read_header

#: mlx-lm's names of one low-rank module's leaves: ``model.layers.N.self_attn.q_proj.lora_a``.
LEAF = re.compile(r"^(?P<module>.+)\.(?P<leaf>lora_a|lora_b|m)$")
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def adapter_tensors(adapter: Adapter) -> dict[str, np.ndarray]:
    """The adapter's tensors in float32 (numpy has no bfloat16), each LoRA factor checked against the
    config's rank."""
    import mlx.core as mx

    file = adapter.path / WEIGHTS_FILE
    try:
        arrays = mx.load(str(file))
    except Exception as e:  # mlx raises bare RuntimeError/ValueError for a garbled file
        msg = f"The adapter's {WEIGHTS_FILE} in {adapter.path} is damaged ({e}). Copy it again or retrain it."
        raise CheckpointError(msg) from None
    assert isinstance(arrays, dict)
    for name, array in arrays.items():
        match = LEAF.match(name)
        if adapter.fine_tune_type != "full" and match is None:
            msg = f"{file} holds {name}, not a {adapter.fine_tune_type} tensor (lora_a, lora_b or m)."
            raise CheckpointError(msg)
        axis = {"lora_a": 1, "lora_b": 0}.get(match["leaf"]) if match else None
        if axis is not None and (array.ndim != 2 or array.shape[axis] != adapter.rank):
            msg = (
                f"The adapter {adapter.path}'s {CONFIG_FILE} says rank {adapter.rank}, but {name} has shape "
                f"{tuple(array.shape)}: the two files do not belong together. Retrain it."
            )
            raise CheckpointError(msg)
    return {name: np.array(a.astype(mx.float32)) for name, a in arrays.items()}


def lora_alpha(adapter: Adapter) -> float:
    """PEFT's and llama.cpp's alpha of a LoRA adapter: they scale by alpha / r, mlx-lm by ``scale``."""
    lora = adapter.config["lora_parameters"]
    return float(lora["scale"]) * int(lora["rank"])


def write_adapter_gguf(
    adapter: Adapter, out: str | os.PathLike[str], *, base: str | os.PathLike[str] | None = None
) -> Path:
    """Write the LoRA ``adapter`` as the GGUF adapter file ``out`` (float32) for a StarCoder2 base; with
    ``base`` (a GGUF file) each factor is first checked against that base's weights. Removed again if
    writing fails."""
    from .write import _gguf, gguf_writer

    if adapter.fine_tune_type != "lora":
        what = "a DoRA adapter" if adapter.fine_tune_type == "dora" else "full fine-tuned weights"
        msg = (
            f"The adapter {adapter.path} holds {what}, which llama.cpp cannot apply to a base: merge it "
            "(langchain-starcoder export-adapter --fused OUT) and serve OUT."
        )
        raise InvalidParameterError(msg)
    gguf = _gguf()
    tensors = adapter_tensors(adapter)
    layers = [int(m[1]) for name in tensors if (m := _LAYER.search(name))]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.STARCODER2, max(layers, default=0) + 1)
    renamed = {}
    for name, value in tensors.items():
        match = LEAF.match(name)
        assert match is not None  # adapter_tensors checked every name
        new = names.get_name(match["module"])
        if new is None:
            msg = f"The adapter {adapter.path} adapts {match['module']}, which llama.cpp's StarCoder2 lacks."
            raise CheckpointError(msg)
        # PEFT's A (r, in) and B (out, r): mlx-lm's, transposed
        renamed[f"{new}.weight.{match['leaf']}"] = np.ascontiguousarray(value.T)
    if base is not None:
        _check_base(adapter, {name: value.shape for name, value in renamed.items()}, read_header(Path(base)))

    out = Path(out)
    with gguf_writer(gguf, out, gguf.MODEL_ARCH.STARCODER2) as writer:
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, lora_alpha(adapter))
        for name, value in renamed.items():
            writer.add_tensor(name, value)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    return out


def _check_base(adapter: Adapter, factors: dict[str, tuple[int, ...]], header: GGUFHeader) -> None:
    """Each factor fits its base weight (llama.cpp checks too, but says it only in the server's log)."""
    if header.arch != "starcoder2":
        msg = f"{header.path} is a {header.arch} model; the adapter {adapter.path} is for StarCoder2."
        raise CheckpointError(msg)
    for name, shape in factors.items():
        weight, _, leaf = name.rpartition(".")
        info = header.tensors.get(weight)
        out_dims, in_dims = info.shape if info is not None and len(info.shape) == 2 else (None, None)
        fits = shape[1] == in_dims if leaf == "lora_a" else shape[0] == out_dims
        if not fits:
            where = f"its {weight} is {info.shape}" if info is not None else f"it has no {weight}"
            msg = (
                f"The adapter {adapter.path} was trained on another base ({adapter.base}) than "
                f"{header.path.name}: {name} has shape {shape}, and {where}. "
                "Use the base it was trained on."
            )
            raise CheckpointError(msg)


def cached_adapter_gguf(adapter: Adapter, base: Path, directory: Path | None = None) -> Path:
    """``adapter`` as a GGUF adapter file for the GGUF ``base``, in the GGUF cache: named by the
    adapter's digest (of both its files), so a changed adapter is converted again, never served stale."""
    from .cache import _private_folder, cache_dir
    from .write import whole_file

    directory = directory or cache_dir()
    _private_folder(directory)
    target = directory / f"adapter-{adapter.digest}.gguf"
    if target.is_file():
        written = {name: info.shape for name, info in read_header(target).tensors.items()}
        _check_base(adapter, written, read_header(base))
        return target
    with whole_file(target) as partial:
        write_adapter_gguf(adapter, partial, base=base)
    return target
