"""StarCoder2 for MLX, correct past the sliding window.

mlx-lm ships a StarCoder2 module, but it attends to every earlier token (StarCoder2 attends to the
last ``sliding_window`` tokens only), uses erf GELU where checkpoints ask for ``gelu_pytorch_tanh``,
and ignores ``rope_parameters`` written by transformers 5. This module fixes the three; the layout
and weight names are those of Hugging Face's ``Starcoder2ForCausalLM``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map
from mlx_lm.models.base import BaseModelArgs, create_attention_mask, scaled_dot_product_attention

from ..errors import UnsupportedModelError
from . import ACTIVATIONS


@dataclass
class ModelArgs(BaseModelArgs):
    """A StarCoder2 config.json's settings; ``loading.read_config`` checks their types and ranges."""

    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    norm_epsilon: float = 1e-5
    vocab_size: int = 49152
    rope_theta: float | None = None
    rope_parameters: dict[str, Any] | None = None
    sliding_window: int | None = None
    max_position_embeddings: int = 16384
    hidden_act: str = "gelu_pytorch_tanh"
    use_bias: bool = True
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.hidden_act not in ACTIVATIONS:
            msg = f"Unsupported hidden_act {self.hidden_act!r}; expected one of {sorted(ACTIVATIONS)}."
            raise UnsupportedModelError(msg)
        rope_type = (self.rope_parameters or {}).get("rope_type", "default")
        if rope_type != "default":
            msg = f"Unsupported RoPE scaling {rope_type!r}: StarCoder2 checkpoints use plain RoPE."
            raise UnsupportedModelError(msg)

    @property
    def rope_base(self) -> float:
        """transformers 5 writes ``rope_parameters.rope_theta``; older configs ``rope_theta``."""
        if self.rope_parameters and "rope_theta" in self.rope_parameters:
            return float(self.rope_parameters["rope_theta"])
        return float(self.rope_theta if self.rope_theta is not None else 10000.0)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        dim, head_dim = args.hidden_size, args.head_dim
        self.n_heads = args.num_attention_heads
        self.n_kv_heads = args.num_key_value_heads
        self.scale = head_dim**-0.5
        self.window = args.sliding_window
        self.q_proj = nn.Linear(dim, self.n_heads * head_dim, bias=args.use_bias)
        self.k_proj = nn.Linear(dim, self.n_kv_heads * head_dim, bias=args.use_bias)
        self.v_proj = nn.Linear(dim, self.n_kv_heads * head_dim, bias=args.use_bias)
        self.o_proj = nn.Linear(self.n_heads * head_dim, dim, bias=args.use_bias)
        self.rope = nn.RoPE(head_dim, traditional=False, base=args.rope_base)

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        B, L, _ = x.shape
        queries = self.q_proj(x).reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)
        keys = self.k_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        values = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)

        if cache is not None:
            queries = self.rope(queries, offset=cache.offset)
            keys = self.rope(keys, offset=cache.offset)
            keys, values = cache.update_and_fetch(keys, values)
            # Keys older than the window are never attended: drop them so that attention past
            # the window costs what the window costs (the cache keeps them for prompt reuse).
            span = L + self.window - 1 if self.window else None
            if span is not None and _length(keys) > span:
                keys, values = _last(keys, span), _last(values, span)
                mask = mask[..., -span:] if isinstance(mask, mx.array) else mask
        else:
            queries = self.rope(queries)
            keys = self.rope(keys)

        # mx.fast.scaled_dot_product_attention accumulates scores and softmax in float32 whatever
        # the input dtype (float16 softmax overflows on StarCoder2); the quantized path is precise too.
        output = scaled_dot_product_attention(queries, keys, values, cache=cache, scale=self.scale, mask=mask)
        return self.o_proj(output.transpose(0, 2, 1, 3).reshape(B, L, -1))


def _length(kv: Any) -> int:
    return (kv[0] if isinstance(kv, tuple | list) else kv).shape[-2]


def _last(kv: Any, n: int) -> Any:
    """The last ``n`` positions of a key/value tensor, or of each part of a quantized one."""
    return tree_map(lambda a: a[..., -n:, :], kv)


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.c_fc = nn.Linear(args.hidden_size, args.intermediate_size, bias=args.use_bias)
        self.c_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=args.use_bias)
        self.act = ACTIVATIONS[args.hidden_act]

    def __call__(self, x: mx.array) -> mx.array:
        return self.c_proj(self.act(self.c_fc(x)))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args)
        self.input_layernorm = nn.LayerNorm(args.hidden_size, eps=args.norm_epsilon)
        self.post_attention_layernorm = nn.LayerNorm(args.hidden_size, eps=args.norm_epsilon)

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), mask, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Starcoder2Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = [TransformerBlock(args) for _ in range(args.num_hidden_layers)]
        self.norm = nn.LayerNorm(args.hidden_size, eps=args.norm_epsilon)

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None) -> mx.array:
        h = self.embed_tokens(inputs)
        if cache is None:
            cache = [None] * len(self.layers)
        mask = create_attention_mask(h, cache[0], window_size=self.args.sliding_window)
        for layer, c in zip(self.layers, cache, strict=True):
            h = layer(h, mask, c)
        return self.norm(h)


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.model = Starcoder2Model(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None) -> mx.array:
        out = self.model(inputs, cache)
        if self.args.tie_word_embeddings:
            return self.model.embed_tokens.as_linear(out)
        return self.lm_head(out)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        weights = {k: v for k, v in weights.items() if "rotary_emb.inv_freq" not in k}
        if self.args.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        return weights

    @property
    def layers(self) -> list[TransformerBlock]:
        return self.model.layers
