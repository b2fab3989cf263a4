"""Checkpoint folders on disk: quantize a copy, describe one, and write folders safely.

Importing this module imports nothing heavy: MLX and mlx-lm load inside the functions that need them,
so the command line starts fast.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import math
import os
import re
import shutil
import sys
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .errors import InvalidParameterError, StarCoderError

#: Written into every folder this package creates (quantize, build-test-model). ``force`` replaces only
#: folders that hold it, so a mistyped destination (a project, a home folder) is never deleted.
MARKER = "langchain-starcoder.json"
_WRITTEN_BY = "langchain-starcoder"

# Files of a checkpoint besides its weights and config that a quantized copy needs (tokenizer,
# generation settings, chat template).
_EXTRA_FILE_PATTERNS = ("*.json", "*.txt", "*.jinja", "tokenizer.model")
_NOT_COPIED = {"config.json", "model.safetensors.index.json", MARKER}
_SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "U32": "uint32",
    "I32": "int32", "U8": "uint8", "I8": "int8", "I64": "int64", "BOOL": "bool",
}  # fmt: skip
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "U8": 1, "I8": 1, "I64": 8}


class DestinationError(StarCoderError):
    """A write was refused before anything changed: it could destroy something, or could not finish."""


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"


def human_count(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    if n >= 1e6:
        return f"{n / 1e6:.2f} M"
    return f"{n / 1e3:.1f} K" if n >= 1e3 else str(n)


# --- writing a folder safely -------------------------------------------------------------------------


def written_by_us(folder: Path) -> bool:
    """Whether ``folder`` holds the marker this package writes into the folders it creates."""
    try:
        marker = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("written_by") == _WRITTEN_BY


def _protected_paths(src: Path) -> list[Path]:
    """``src`` and, through symlinks, the files it is made of (a hub snapshot links into blobs/)."""
    paths = [src.resolve()]
    with contextlib.suppress(OSError):
        paths += [f.resolve() for f in src.iterdir()]
    return paths


def check_destination(dst: Path, force: bool, source: Path | None = None) -> None:
    """Refuse a destination whose writing could destroy anything: a file or link, the ``source``
    checkpoint, a folder that contains it or lies inside it, or (even with ``force``) any non-empty
    folder that is not a checkpoint this package wrote."""
    if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
        msg = f"{dst} exists and is not a folder; choose another destination."
        raise DestinationError(msg)
    real = dst.resolve()
    if source is not None:
        src = source.resolve()
        for path in _protected_paths(source):
            if real == path or real in path.parents:
                msg = f"{dst} is or contains the source checkpoint {src}; choose a folder outside it."
                raise DestinationError(msg)
        if src in real.parents:
            msg = f"{dst} is inside the source checkpoint {src}; choose a folder outside it."
            raise DestinationError(msg)
    if dst.is_dir() and any(dst.iterdir()):
        if not force:
            msg = f"{dst} already exists; pass --force to replace it (if it is a checkpoint written here)."
            raise DestinationError(msg)
        if not written_by_us(dst):
            msg = (
                f"{dst} is not a checkpoint written by langchain-starcoder (it has no {MARKER}), so "
                "--force will not replace it; remove it yourself or choose another destination."
            )
            raise DestinationError(msg)


#: Inside a staging folder while its writer lives, locked by it: a folder whose lock nobody holds is the
#: leftover of a run that was killed (out of memory, SIGKILL), and the next run removes it.
_STAGING_LOCK = "langchain-starcoder.partial"


def _claim(tmp: Path) -> int:
    """Lock ``tmp`` as this process's staging folder; the lock lives as long as the returned descriptor
    (or the process: the kernel drops it even on SIGKILL). The file appears under its name already locked,
    so another run never sees it unlocked."""
    pending = tmp / f"{_STAGING_LOCK}.new"
    fd = os.open(pending, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"written_by": _WRITTEN_BY, "pid": os.getpid()}).encode())
    os.rename(pending, tmp / _STAGING_LOCK)
    return fd


def _abandoned(folder: Path) -> bool:
    """Whether ``folder`` is a staging folder of this package whose writer is gone. Folders without the
    lock file (another program's, or an older version's) are never taken for one."""
    try:
        fd = os.open(folder / _STAGING_LOCK, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False  # its writer is still at work
    try:
        return json.loads(os.read(fd, 4096) or b"{}").get("written_by") == _WRITTEN_BY
    except (ValueError, AttributeError):
        return False
    finally:
        os.close(fd)


def _remove_abandoned(dst: Path) -> None:
    """Delete what killed runs writing ``dst`` left beside it; name, but keep, lookalikes that are not
    provably abandoned builds of ours."""
    pattern = re.compile(rf"\.{re.escape(dst.name)}\.[0-9a-f]{{8}}\.partial")
    for folder in sorted(dst.parent.iterdir()):
        if not (pattern.fullmatch(folder.name) and folder.is_dir() and not folder.is_symlink()):
            continue
        if _abandoned(folder):
            shutil.rmtree(folder, ignore_errors=True)
            _log(f"Removed {folder}, left by an earlier run that did not finish.")
        elif not (folder / _STAGING_LOCK).exists():
            _log(f"Left {folder} alone (no lock file: not a run of this version); delete it if it is stale.")


@contextlib.contextmanager
def staged_folder(dst: Path, force: bool, *, source: Path | None = None, command: str) -> Iterator[Path]:
    """Yield a temporary folder beside ``dst``; on success it gets the marker and becomes ``dst``, on
    any failure (Ctrl-C included) it is deleted, so a half-written ``dst`` never exists. Staging folders
    of earlier runs for ``dst`` that were killed before they could clean up are removed first."""
    check_destination(dst, force, source)
    given, dst = dst, dst.resolve()  # "." or "a/.." have no usable name or parent; links were checked
    dst.parent.mkdir(parents=True, exist_ok=True)
    # Not tempfile.mkdtemp: its folders are private (0700), and this one becomes dst.
    tmp = dst.parent / f".{dst.name}.{uuid.uuid4().hex[:8]}.partial"
    tmp.mkdir()
    lock = _claim(tmp)
    try:
        _remove_abandoned(dst)
        yield tmp
        (tmp / _STAGING_LOCK).unlink()  # still held through ``lock`` until the end
        marker = {"written_by": _WRITTEN_BY, "command": command}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        check_destination(given, force, source)  # someone may have written dst meanwhile
        old = None
        if dst.exists():
            old = dst.parent / f".{dst.name}.{uuid.uuid4().hex[:8]}.old"
            os.rename(dst, old)
        try:
            os.rename(tmp, dst)
        except BaseException:
            if old is not None:
                os.rename(old, dst)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        os.close(lock)


# --- filling a file in place -----------------------------------------------------------------------


def _writable(path: Path) -> bool:
    """We may write ``path`` and it is not marked read-only. root passes every access check, but a file
    or folder without any write permission bit was made read-only on purpose, so it is refused for all."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return bool(mode & 0o222) and os.access(path, os.W_OK)


def check_in_place(path: Path) -> tuple[Path, Path]:
    """(the file to write, its backup) for :func:`write_in_place`, checked before any work is done: a
    symlink is written through to its target, which must be writable, and so must its folder (the new
    text is written beside it, then renamed) and an existing ``.bak``."""
    target = path.resolve()
    backup = target.with_name(target.name + ".bak")
    what = f"{path} (a link to {target})" if path.is_symlink() else str(path)
    if not _writable(target):
        msg = f"{what} is read-only; make it writable (chmod u+w) or leave out --write to print the middle."
        raise DestinationError(msg)
    folder = target.parent
    if not (_writable(folder) and os.access(folder, os.X_OK)):
        msg = f"Cannot write in the folder {folder} (read-only); make it writable or leave out --write."
        raise DestinationError(msg)
    if backup.is_symlink() or (backup.exists() and not (backup.is_file() and _writable(backup))):
        msg = f"The backup {backup} exists and cannot be replaced; move it away or leave out --write."
        raise DestinationError(msg)
    return target, backup


def write_in_place(target: Path, backup: Path, text: str) -> None:
    """Copy ``target`` to ``backup``, then replace its contents with ``text`` atomically (written
    beside it and renamed, so it is never half-written), keeping its mode and owner."""
    shutil.copy2(target, backup)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8", newline="") as f:
            f.write(text)
        shutil.copymode(target, tmp)
        st = target.stat()
        with contextlib.suppress(OSError):  # root keeps the owner; others may not change it
            os.chown(tmp, st.st_uid, st.st_gid)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# --- quantize --------------------------------------------------------------------------------------


def quantize_checkpoint(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    bits: int = 4,
    group_size: int = 64,
    revision: str | None = None,
    force: bool = False,
    verify: bool = True,
    progress: bool = True,
) -> Path:
    """Write an MLX-quantized copy of the StarCoder2 checkpoint ``src`` to the folder ``dst``.

    The layout is mlx-community's (``mlx_lm.convert``): packed weights with float16 scales and
    biases, a ``quantization`` entry in config.json, the tokenizer files copied, plus this package's
    marker file. ``dst`` appears only when it is complete (written beside it, then renamed); with
    ``force`` it replaces only a checkpoint this package wrote, never the source or a folder around
    it. With ``verify`` the copy is first loaded and generates one token. ``progress`` shows what
    happens on stderr.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import quantize_model, save_config, save_model
    from tqdm import tqdm

    from .loading import load_model, read_config, resolve_model_path, validate_load_options

    log = _log if progress else (lambda _: None)
    validate_load_options(bits, group_size, "float16", None)
    dst = Path(dst).expanduser()
    local = Path(src).expanduser()
    check_destination(dst, force, local if local.exists() else None)  # before any hub download
    src_path = resolve_model_path(src, revision)
    check_destination(dst, force, src_path)
    config = read_config(src_path)
    if "quantization" in config:
        q = config["quantization"]
        msg = (
            f"{src_path} is already quantized ({q.get('bits')}-bit, group size {q.get('group_size')}); "
            "quantize the full-precision checkpoint it came from."
        )
        raise InvalidParameterError(msg)

    with staged_folder(dst, force, source=src_path, command="quantize") as tmp:
        log(f"Loading {src} ...")
        # float16 like mlx-community checkpoints: the quantization scales take the weights' dtype.
        loaded = load_model(src_path, quantize=None, group_size=group_size, dtype="float16", config=config)
        # mlx-lm reports the bits per weight on stdout; stdout is only for generated text here.
        with contextlib.redirect_stdout(sys.stderr):
            model, qconfig = quantize_model(loaded.model, loaded.config, group_size=group_size, bits=bits)
        del loaded
        # Quantizing is lazy: evaluating tensor by tensor does the work and drives the bar.
        tensors = tree_flatten(model.parameters())
        for _, array in tqdm(
            tensors, desc=f"Quantizing to {bits}-bit", unit="tensor", file=sys.stderr, disable=not progress
        ):
            mx.eval(array)
        del tensors
        log(f"Saving to {dst} ...")
        save_model(tmp, model, donate_model=True)
        del model
        qconfig["torch_dtype"] = "float16"
        save_config(qconfig, tmp / "config.json")
        for pattern in _EXTRA_FILE_PATTERNS:
            for file in src_path.glob(pattern):
                if file.name not in _NOT_COPIED and file.is_file():
                    shutil.copy2(file, tmp / file.name)
        gc.collect()
        mx.clear_cache()
        if verify:
            _verify_checkpoint(tmp)
            log("Checked: the quantized checkpoint loads and generates.")
        written = folder_bytes(tmp)
    log(f"Wrote {dst}: {bits}-bit, group size {group_size}, {human_bytes(written)}.")
    return dst


def _verify_checkpoint(path: Path) -> None:
    """Load a written checkpoint with the engine and generate one token."""
    from .engine import StarCoderEngine

    engine = StarCoderEngine.load(path)
    try:
        engine.generate("def main():", max_tokens=1)
    finally:
        engine.close()


# --- info ------------------------------------------------------------------------------------------


def checkpoint_info(
    model: str | os.PathLike[str],
    revision: str | None = None,
    *,
    gguf_file: str | None = None,
    sliding_window: int | None = None,
) -> dict[str, Any]:
    """What a checkpoint is, read from its config and safetensors headers, or from a GGUF file's metadata
    and tensor table (the weights stay on disk). ``gguf_file`` and ``sliding_window`` as in
    ``StarCoderEngine.load``; a GGUF file's notices (defaults it filled in) are warnings (``GGUFNotice``)."""
    from .gguf_format import is_gguf

    if is_gguf(model, gguf_file):
        return _gguf_info(model, gguf_file, revision, sliding_window)
    if sliding_window is not None:
        msg = "--sliding-window applies to GGUF files only; a checkpoint folder's config.json sets it."
        raise InvalidParameterError(msg)
    return _folder_info(model, revision)


def _folder_info(model: str | os.PathLike[str], revision: str | None) -> dict[str, Any]:
    from .loading import read_config, resolve_model_path, weight_headers

    path = resolve_model_path(model, revision)
    config = read_config(path)
    quant = config.get("quantization")
    tensors: dict[str, dict[str, Any]] = {}
    headers = weight_headers(path)
    for header in headers.values():
        tensors.update(header)

    parameters = 0
    float_bytes: Counter[str] = Counter()
    for name, tensor in tensors.items():
        stem = name.rsplit(".", 1)[0]
        packed = tensors.get(stem + ".weight", {}).get("dtype") == "U32"
        if packed and name.endswith((".scales", ".biases")):
            continue  # quantization metadata, not parameters
        count = math.prod(tensor["shape"])
        if tensor["dtype"] == "U32" and quant:
            layer_bits = (quant.get(stem) or {}).get("bits", quant.get("bits", 4))
            count = count * 32 // layer_bits
        else:
            float_bytes[tensor["dtype"]] += count * _DTYPE_BYTES.get(tensor["dtype"], 4)
        parameters += count
    stored = _SAFETENSORS_DTYPES.get(float_bytes.most_common(1)[0][0], "?") if float_bytes else "?"
    tokenizer_config: dict[str, Any] = {}
    with contextlib.suppress(OSError, json.JSONDecodeError):
        tokenizer_config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    added = {t.get("content") for t in tokenizer_config.get("added_tokens_decoder", {}).values()}
    with contextlib.suppress(OSError, json.JSONDecodeError):
        tok = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
        added |= {t.get("content") for t in tok.get("added_tokens", [])}
    chat_template = bool(tokenizer_config.get("chat_template")) or (path / "chat_template.jinja").is_file()
    quantization = None
    if quant:
        quantization = {"bits": quant.get("bits"), "group_size": quant.get("group_size")}
        quantization["mode"] = quant.get("mode", "affine")
    return _describe(
        model, path, config, parameters, stored, quantization, list(headers), added, chat_template
    )


def _gguf_info(
    model: str | os.PathLike[str], gguf_file: str | None, revision: str | None, sliding_window: int | None
) -> dict[str, Any]:
    from .gguf_format import (
        FLOAT_TYPES,
        GROUP_SIZE,
        quantized_layers,
        read_gguf,
        resolve_gguf_file,
        warn_notices,
    )

    checkpoint = read_gguf(resolve_gguf_file(model, gguf_file, revision), sliding_window=sliding_window)
    warn_notices(checkpoint)
    tensors = checkpoint.header.tensors.values()
    float_bytes: Counter[str] = Counter()
    for t in tensors:
        if t.type_name in FLOAT_TYPES:
            float_bytes[t.type_name] += t.nbytes
    stored = _SAFETENSORS_DTYPES.get(float_bytes.most_common(1)[0][0], "?") if float_bytes else "?"
    bits = Counter(q["bits"] for q in quantized_layers(checkpoint.header).values())
    quantization = None  # the bits most tensors kept (a file may mix Q4_0 and Q8_0)
    if bits:
        quantization = {"bits": bits.most_common(1)[0][0], "group_size": GROUP_SIZE, "mode": "affine"}
    meta = checkpoint.header.metadata
    tokens = meta.get("tokenizer.ggml.tokens") or []
    name = os.fspath(model) if gguf_file is None else f"{os.fspath(model)}/{gguf_file}"
    info = _describe(
        name, checkpoint.path, checkpoint.config, sum(math.prod(t.shape) for t in tensors), stored,
        quantization, [checkpoint.path], set(tokens), bool(meta.get("tokenizer.chat_template")),
    )  # fmt: skip
    info["gguf_types"] = dict(Counter(t.type_name for t in tensors).most_common())
    return info


def _describe(
    model: str | os.PathLike[str],
    path: Path,
    config: dict[str, Any],
    parameters: int,
    stored: str,
    quantization: dict[str, Any] | None,
    files: list[Path],
    tokens: set[str | None],
    chat_template: bool,
) -> dict[str, Any]:
    """The info dict of a checkpoint, from what its format says."""
    import mlx.core as mx

    from .loading import model_args

    args = model_args(config)  # the family's settings (StarCoder2 or GPTBigCode)
    on_cpu = mx.default_device() == mx.cpu
    return {
        "model": str(model),
        "path": str(path),
        "architecture": config.get("model_type"),
        "layers": args.num_hidden_layers,
        "hidden_size": args.hidden_size,
        "attention_heads": args.num_attention_heads,
        "kv_heads": args.num_key_value_heads,
        "head_dim": args.head_dim,
        "intermediate_size": args.intermediate_size,
        "vocab_size": args.vocab_size,
        "tied_embeddings": bool(config.get("tie_word_embeddings", True)),
        "parameters": parameters,
        "dtype": stored,
        "compute_dtype": "float32" if on_cpu else stored,
        "quantization": quantization,
        "context_window": args.max_position_embeddings,
        "sliding_window": args.sliding_window,
        "rope_theta": getattr(args, "rope_base", None),  # None: GPTBigCode's learned positions
        "weight_files": len(files),
        "weight_bytes": sum(f.stat().st_size for f in files),
        "fim": {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"} <= tokens,
        "repo_level_fim": {"<repo_name>", "<file_sep>"} <= tokens,
        "chat_template": chat_template,
    }


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def format_info(info: dict[str, Any]) -> str:
    """:func:`checkpoint_info` as aligned ``key: value`` lines for people."""
    q = info["quantization"]
    window = info["sliding_window"]
    types = info.get("gguf_types")
    gguf = f" (GGUF tensors: {', '.join(f'{n} {t}' for t, n in types.items())})" if types else ""
    rows: Sequence[tuple[str, str]] = [
        ("model", info["model"] if info["model"] == info["path"] else f"{info['model']} ({info['path']})"),
        (
            "architecture",
            f"{info['architecture']}: {info['layers']} layers, hidden {info['hidden_size']}, "
            f"{info['attention_heads']} heads ({info['kv_heads']} KV, head dim {info['head_dim']}), "
            f"MLP {info['intermediate_size']}, vocab {info['vocab_size']}"
            + (", tied embeddings" if info["tied_embeddings"] else ""),
        ),
        ("parameters", f"{human_count(info['parameters'])} ({info['parameters']:,})"),
        ("dtype", f"{info['dtype']} on disk; computes in {info['compute_dtype']} here (dtype='auto')"),
        ("quantization", f"{q['bits']}-bit, group size {q['group_size']} ({q['mode']})" if q else "none"),
        (
            "context",
            f"{info['context_window']} tokens, "
            + (f"sliding window {window}" if window else "full attention (no sliding window)"),
        ),
        (
            "rope theta",
            "none (learned positions)" if info["rope_theta"] is None else f"{info['rope_theta']:g}",
        ),
        ("weights", f"{human_bytes(info['weight_bytes'])} in {info['weight_files']} file(s){gguf}"),
        (
            "tokens",
            f"FIM {_yes(info['fim'])}, repository FIM {_yes(info['repo_level_fim'])}, "
            f"chat template {_yes(info['chat_template'])}",
        ),
    ]
    return "\n".join(f"{k + ':':<14}{v}" for k, v in rows)
