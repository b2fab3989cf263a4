"""StarCoder (v1) for MLX: the GPTBigCode architecture, as transformers runs it.

StarCoder, StarCoderBase, StarCoderPlus, WizardCoder-15B, StarChat and SantaCoder are GPTBigCode
models: fused ``c_attn``, multi-query attention (one key/value head) or multi-head attention, learned
absolute positions (``wpe``), LayerNorm, biases everywhere. mlx-lm 0.32 ships a gpt_bigcode module,
but it uses erf GELU where checkpoints ask for ``gelu_pytorch_tanh``, cannot build a config whose
``n_inner`` is null, splits a multi-head ``c_attn`` as ``[q | k | v]`` where transformers interleaves
it per head, and takes positions from one integer offset, which a batch cache (an offset per left-padded
row) does not have. This module fixes the four; the weight names are those of Hugging Face's
``GPTBigCodeForCausalLM`` (and of mlx-lm's conversions), so their safetensors load as they are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import BaseModelArgs, create_attention_mask, scaled_dot_product_attention

from ..errors import UnsupportedModelError
from . import ACTIVATIONS


@dataclass
class ModelArgs(BaseModelArgs):
    """A GPTBigCode config.json's settings (defaults: transformers' ``GPTBigCodeConfig``);
    ``loading.read_config`` checks their types and ranges."""

    model_type: str
    n_embd: int
    n_layer: int
    n_head: int
    n_positions: int = 1024
    vocab_size: int = 50257
    n_inner: int | None = None
    activation_function: str = "gelu_pytorch_tanh"
    layer_norm_epsilon: float = 1e-5
    multi_query: bool = True
    scale_attn_weights: bool = True
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.activation_function not in ACTIVATIONS:
            msg = (
                f"Unsupported activation_function {self.activation_function!r}; "
                f"expected one of {sorted(ACTIVATIONS)}."
            )
            raise UnsupportedModelError(msg)

    # The names the rest of the package reads, shared with StarCoder2's settings.
    @property
    def hidden_size(self) -> int:
        return self.n_embd

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layer

    @property
    def num_attention_heads(self) -> int:
        return self.n_head

    @property
    def num_key_value_heads(self) -> int:
        return 1 if self.multi_query else self.n_head

    @property
    def intermediate_size(self) -> int:
        """``n_inner``; null means 4 x ``n_embd`` (as in transformers)."""
        return self.n_inner if self.n_inner is not None else 4 * self.n_embd

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def max_position_embeddings(self) -> int:
        """The context window: learned positions exist for ``n_positions`` tokens only."""
        return self.n_positions

    @property
    def sliding_window(self) -> None:
        return None


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.dim, self.head_dim = args.n_embd, args.head_dim
        self.n_heads = args.n_head
        self.multi_query = args.multi_query
        self.kv_dim = args.num_key_value_heads * self.head_dim
        self.scale = self.head_dim**-0.5 if args.scale_attn_weights else 1.0
        self.c_attn = nn.Linear(self.dim, self.dim + 2 * self.kv_dim)
        self.c_proj = nn.Linear(self.dim, self.dim)

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        B, L, _ = x.shape
        qkv = self.c_attn(x)
        if self.multi_query:  # [q (all heads) | k | v], one key/value head
            queries, keys, values = mx.split(qkv, [self.dim, self.dim + self.kv_dim], axis=-1)
            queries = queries.reshape(B, L, self.n_heads, -1).transpose(0, 2, 1, 3)
            keys = keys.reshape(B, L, 1, -1).transpose(0, 2, 1, 3)
            values = values.reshape(B, L, 1, -1).transpose(0, 2, 1, 3)
        else:  # per head [q | k | v], as transformers views it
            qkv = qkv.reshape(B, L, self.n_heads, 3 * self.head_dim).transpose(0, 2, 1, 3)
            queries, keys, values = mx.split(qkv, [self.head_dim, 2 * self.head_dim], axis=-1)

        if cache is not None:
            keys, values = cache.update_and_fetch(keys, values)
        # mx.fast.scaled_dot_product_attention accumulates scores and softmax in float32 whatever
        # the input dtype (transformers' attention_softmax_in_fp32); the quantized path is precise too.
        output = scaled_dot_product_attention(queries, keys, values, cache=cache, scale=self.scale, mask=mask)
        return self.c_proj(output.transpose(0, 2, 1, 3).reshape(B, L, -1))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.c_fc = nn.Linear(args.n_embd, args.intermediate_size)
        self.c_proj = nn.Linear(args.intermediate_size, args.n_embd)
        self.act = ACTIVATIONS[args.activation_function]

    def __call__(self, x: mx.array) -> mx.array:
        return self.c_proj(self.act(self.c_fc(x)))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.ln_1 = nn.LayerNorm(args.n_embd, eps=args.layer_norm_epsilon)
        self.attn = Attention(args)
        self.ln_2 = nn.LayerNorm(args.n_embd, eps=args.layer_norm_epsilon)
        self.mlp = MLP(args)

    def __call__(self, x: mx.array, mask: Any = None, cache: Any = None) -> mx.array:
        h = x + self.attn(self.ln_1(x), mask, cache)
        return h + self.mlp(self.ln_2(h))


class GPTBigCodeModel(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.wte = nn.Embedding(args.vocab_size, args.n_embd)
        self.wpe = nn.Embedding(args.n_positions, args.n_embd)
        self.h = [TransformerBlock(args) for _ in range(args.n_layer)]
        self.ln_f = nn.LayerNorm(args.n_embd, eps=args.layer_norm_epsilon)

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None) -> mx.array:
        h = self.wte(inputs) + self.wpe(self.positions(inputs.shape[1], cache))
        if cache is None:
            cache = [None] * len(self.h)
        mask = create_attention_mask(h, cache[0])
        for layer, c in zip(self.h, cache, strict=True):
            h = layer(h, mask, c)
        return self.ln_f(h)

    def positions(self, length: int, cache: list[Any] | None) -> mx.array:
        """Position ids of the next ``length`` tokens: ``[length]``, or ``[batch, length]`` for a
        batch cache, whose offset is per row (tokens so far minus that row's left padding)."""
        offset = cache[0].offset if cache and cache[0] is not None else 0
        if isinstance(offset, mx.array):
            # Left padding has negative positions (its keys are masked), and a finished row may run
            # past the table while others go on (its output is dropped): any valid id will do.
            return mx.clip(offset[:, None] + mx.arange(length)[None], 0, self.args.n_positions - 1)
        if offset + length > self.args.n_positions:  # an embedding lookup past the table is garbage
            msg = (
                f"{offset + length} positions, but this model has learned {self.args.n_positions} "
                "(n_positions): shorten the prompt or generate fewer tokens."
            )
            raise ValueError(msg)
        return mx.arange(offset, offset + length)


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.transformer = GPTBigCodeModel(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.n_embd, args.vocab_size, bias=False)

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None) -> mx.array:
        out = self.transformer(inputs, cache)
        if self.args.tie_word_embeddings:
            return self.transformer.wte.as_linear(out)
        return self.lm_head(out)

    def sanitize(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        # Older checkpoints store the causal-mask buffers (``transformer.bias``, ``attn.masked_bias``).
        weights = {k: v for k, v in weights.items() if not _BUFFER.search(k)}
        if self.args.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        return weights

    @property
    def layers(self) -> list[TransformerBlock]:
        return self.transformer.h


_BUFFER = re.compile(r"(^transformer\.bias$|\.attn\.bias$|\.attn\.masked_bias$)")
