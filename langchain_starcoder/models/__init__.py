"""MLX modules, one file per architecture."""

import mlx.nn as nn

#: transformers' activation names -> MLX (``gelu_new``/``gelu_fast``/``gelu_pytorch_tanh`` are all
#: the tanh approximation; plain ``gelu`` is erf).
ACTIVATIONS = {
    "gelu_pytorch_tanh": nn.gelu_approx,
    "gelu_new": nn.gelu_approx,
    "gelu_fast": nn.gelu_approx,
    "gelu": nn.gelu,
    "relu": nn.relu,
}
