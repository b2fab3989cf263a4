"""How llama.cpp names and shapes each architecture's tensors, and our (Hugging Face's) names for them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..loading import expected_tensors, model_args


@dataclass(frozen=True)
class _Layout:
    """How llama.cpp names an architecture's tensors, and the names of our (Hugging Face's) module."""

    model_type: str
    top: dict[str, str]  # llama.cpp -> ours, outside the blocks
    blocks: str
    block: dict[str, str]


#: llama.cpp's architectures (``general.architecture``) this package runs: StarCoder2, and StarCoder
#: v1 (GPTBigCode) as llama.cpp's converter writes it (fused QKV, learned positions, one KV head).
LAYOUTS = {
    "starcoder2": _Layout(
        "starcoder2",
        {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"},
        "model.layers",
        {
            "attn_q": "self_attn.q_proj",
            "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj",
            "ffn_up": "mlp.c_fc",
            "ffn_down": "mlp.c_proj",
            "attn_norm": "input_layernorm",
            "ffn_norm": "post_attention_layernorm",
        },
    ),
    "starcoder": _Layout(
        "gpt_bigcode",
        {
            "token_embd": "transformer.wte",
            "position_embd": "transformer.wpe",
            "output_norm": "transformer.ln_f",
            "output": "lm_head",
        },
        "transformer.h",
        {
            "attn_norm": "ln_1",
            "attn_qkv": "attn.c_attn",
            "attn_output": "attn.c_proj",
            "ffn_norm": "ln_2",
            "ffn_up": "mlp.c_fc",
            "ffn_down": "mlp.c_proj",
        },
    ),
}
_NAME = re.compile(r"(?:blk\.(\d+)\.)?(\w+)\.(weight|bias|scales|biases)")


_BLOCK = re.compile(r"blk\.(\d{1,9})\.")


def block_of(name: str) -> int | None:
    """The block (layer) a llama.cpp tensor is in (``blk.3.ffn_up.weight`` -> 3); None outside the blocks."""
    m = _BLOCK.match(name)
    return None if m is None else int(m[1])


def our_name(name: str, arch: str = "starcoder2") -> str | None:
    """llama.cpp's tensor name (``blk.3.ffn_up.weight``, or its ``.scales``/``.biases`` as MLX reads
    a quantized one) -> Hugging Face's (``model.layers.3.mlp.c_fc.weight``); None if unknown."""
    layout, m = LAYOUTS[arch], _NAME.fullmatch(name)
    if m is None:
        return None
    layer, module, part = m.groups()
    if layer is None:
        return f"{layout.top[module]}.{part}" if module in layout.top else None
    return f"{layout.blocks}.{layer}.{layout.block[module]}.{part}" if module in layout.block else None


def expected_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """llama.cpp's name and (numpy) shape of every tensor the config implies: the safetensors
    layout's table (``loading.expected_tensors``), under llama.cpp's names."""
    layout = next(layout for layout in LAYOUTS.values() if layout.model_type == config["model_type"])
    top = {ours: theirs for theirs, ours in layout.top.items()}
    block = {ours: theirs for theirs, ours in layout.block.items()}
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in expected_tensors(model_args(config)).items():
        module, part = name.rsplit(".", 1)
        if module.startswith(f"{layout.blocks}."):
            layer, module = module.removeprefix(f"{layout.blocks}.").split(".", 1)
            shapes[f"blk.{layer}.{block[module]}.{part}"] = shape
        else:
            shapes[f"{top[module]}.{part}"] = shape
    return shapes
