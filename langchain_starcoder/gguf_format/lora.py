"""A LoRA adapter in PEFT's layout -> llama.cpp's GGUF adapter file (``llama-server --lora``), as llama.cpp's
``convert_lora_to_gguf.py`` writes it: ``general.type`` "adapter", ``adapter.type`` "lora",
``adapter.lora.alpha``, and per adapted weight ``<llama.cpp name>.lora_a`` (PEFT's A, (r, in)) and
``.lora_b`` (PEFT's B, (out, r)); llama.cpp scales B A by alpha / r, as PEFT does. Written here with the
``gguf`` package rather than through that script, which needs all of ``convert_hf_to_gguf.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..errors import CheckpointError, InvalidParameterError

#: PEFT's name of one factor: ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``.
_PEFT_NAME = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<factor>[AB])\.weight$")
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def write_lora_gguf(
    tensors: Mapping[str, np.ndarray], out: Path, *, alpha: float, architecture: str = "starcoder2"
) -> Path:
    """Write the PEFT-named LoRA ``tensors`` as the GGUF adapter ``out`` (float32) for a base of
    ``architecture`` ("starcoder2" or "starcoder"); removed again if writing fails."""
    from .write import _gguf

    gguf = _gguf()
    arches = {"starcoder2": gguf.MODEL_ARCH.STARCODER2, "starcoder": gguf.MODEL_ARCH.STARCODER}
    arch = arches.get(architecture)
    if arch is None:
        msg = f"architecture must be starcoder2 or starcoder, not {architecture!r}."
        raise InvalidParameterError(msg)
    layers = [int(m[1]) for name in tensors if (m := _LAYER.search(name))]
    names = gguf.get_tensor_name_map(arch, max(layers, default=0) + 1)
    renamed = {}
    for name, value in tensors.items():
        match = _PEFT_NAME.match(name)
        new = names.get_name(match["module"]) if match else None
        if match is None or new is None:
            msg = f"{name} is not a LoRA factor of a {architecture} weight that llama.cpp can adapt."
            raise CheckpointError(msg)
        factor = match["factor"].lower()
        renamed[f"{new}.weight.lora_{factor}"] = np.ascontiguousarray(value, dtype=np.float32)

    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    try:
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
        for name, value in renamed.items():
            writer.add_tensor(name, value)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    except BaseException:
        writer.close()
        out.unlink(missing_ok=True)
        raise
    writer.close()
    return out
