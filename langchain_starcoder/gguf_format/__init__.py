"""GGUF files (llama.cpp, Ollama) of StarCoder2 and StarCoder (v1): metadata -> config, tensors ->
our modules' weights, tokenizer.

One module per step, each reading the one before's checked view of the file:

- ``header``: the binary header (metadata, tensor table); every count and length it declares is
  checked against the file's size before anything is allocated from it (hostile files fail fast);
- ``ggml_types``: ggml's tensor types and which of them this package reads;
- ``layout``: llama.cpp's tensor names and shapes per architecture, and ours;
- ``checkpoint``: the config the metadata implies, and the tensors it must hold (``read_gguf``);
- ``weights``: the tensors as MLX arrays (``mx.load``; BF16 and Q4_K read here);
- ``tokenizer``: the tokenizer ``tokenizer.ggml.*`` describes;
- ``hub``: where the file is (a path, a folder, a hub repo); ``load``: the engine's entry point;
- ``convert``: GGUF -> an MLX checkpoint folder;
- ``write``: the other way, a checkpoint folder -> a GGUF file in llama.cpp's layout, tensor by tensor
  (the ``gguf`` package; Q4_0 through ``llama-quantize``).

The weights are read by MLX's own GGUF reader (``mx.load``), which returns Q4_0, Q4_1 and Q8_0 as MLX
affine group-32 quantized triples (exactly: no dequantize-requantize round trip) and the K-quants
Q2_K and Q6_K as float16 (Q4_K, which it gets wrong, is dequantized here). K-quants stay dequantized
(one notice says what it costs); every other quantized type is refused with the list of supported ones.
"""

from .checkpoint import STARCODER2_SLIDING_WINDOW, GGUFCheckpoint, GGUFNotice, read_gguf, warn_notices
from .convert import convert_gguf
from .ggml_types import FLOAT_TYPES, GGML_TYPES, GROUP_SIZE, SUPPORTED_TYPES
from .header import GGUFHeader, TensorInfo, read_header
from .hub import is_gguf, resolve_gguf_file
from .layout import LAYOUTS, our_name
from .load import load_gguf_model, open_gguf
from .tokenizer import gguf_tokenizer
from .weights import dequantize_q4_k, quantized_layers, read_weights
from .write import OUTTYPES, convert_to_gguf, llama_binary, write_gguf

__all__ = [
    "FLOAT_TYPES",
    "GGML_TYPES",
    "GROUP_SIZE",
    "LAYOUTS",
    "OUTTYPES",
    "STARCODER2_SLIDING_WINDOW",
    "SUPPORTED_TYPES",
    "GGUFCheckpoint",
    "GGUFHeader",
    "GGUFNotice",
    "TensorInfo",
    "convert_gguf",
    "convert_to_gguf",
    "dequantize_q4_k",
    "gguf_tokenizer",
    "is_gguf",
    "llama_binary",
    "load_gguf_model",
    "open_gguf",
    "our_name",
    "quantized_layers",
    "read_gguf",
    "read_header",
    "read_weights",
    "resolve_gguf_file",
    "warn_notices",
    "write_gguf",
]
