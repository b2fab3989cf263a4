"""The ``langchain-starcoder`` command: generate, fill in the middle, quantize, inspect and benchmark.

.. code-block:: bash

    langchain-starcoder generate --model mlx-community/starcoder2-3b-4bit --prompt "def fib(n):"
    langchain-starcoder infill --model M --file app.py --context utils.py --repo-name my/app
    langchain-starcoder quantize bigcode/starcoder2-3b ./starcoder2-3b-4bit --bits 4
    langchain-starcoder build-test-model ./tiny --preset tiny
    langchain-starcoder info --model ./starcoder2-3b-4bit
    langchain-starcoder bench --help

Generated text goes to stdout and nothing else does: progress, statistics and errors go to stderr, so
``langchain-starcoder generate ... > out.py`` captures just the code. An error prints one line and
exits non-zero; ``--verbose`` adds the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import shutil
import sys
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .errors import InvalidParameterError, StarCoderError
from .registry import DEFAULT_MODEL

PROG = "langchain-starcoder"
#: Read by the CLI, the examples and the notebooks: the model to use when none is given.
MODEL_ENV = "LANGCHAIN_STARCODER_MODEL"
FILL_MARKER = "<FILL>"

# Files of a checkpoint besides its weights and config that a quantized copy needs (tokenizer,
# generation settings, chat template).
_EXTRA_FILE_PATTERNS = ("*.json", "*.txt", "*.jinja", "tokenizer.model")
_NOT_COPIED = {"config.json", "model.safetensors.index.json"}
_SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "U32": "uint32",
    "I32": "int32", "U8": "uint8", "I8": "int8", "I64": "int64", "BOOL": "bool",
}  # fmt: skip
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "U32": 4, "I32": 4, "U8": 1, "I8": 1, "I64": 8}


class CommandError(StarCoderError):
    """A command-line mistake found by the command itself (a missing marker, an existing folder...)."""


class _ArgumentError(Exception):
    """argparse's complaint, raised instead of printing usage and exiting, so ``main`` says it in one line."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise _ArgumentError(self.prog, message)


# --- output ----------------------------------------------------------------------------------------


def _out(text: str) -> None:
    """Write generated text to stdout as it arrives."""
    sys.stdout.write(text)
    sys.stdout.flush()


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _stats(chunk: Any) -> str:
    """One line of prompt/generation speed from a final chunk (or a Completion)."""
    prompt, cached = chunk.prompt_tokens or 0, chunk.cached_tokens or 0
    prompt_s, gen_s = chunk.prompt_seconds or 0.0, chunk.generation_seconds or 0.0
    prompt_tps = (prompt - cached) / prompt_s if prompt_s > 0 else 0.0
    gen_tps = (chunk.completion_tokens or 0) / gen_s if gen_s > 0 else 0.0
    cached_note = f", {cached} cached" if cached else ""
    return (
        f"[{chunk.finish_reason}] prompt: {prompt} tokens{cached_note}, {prompt_tps:.1f} tokens/s | "
        f"generation: {chunk.completion_tokens} tokens, {gen_tps:.1f} tokens/s"
    )


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    return f"{n:.2f} GB"  # unreachable; keeps type checkers calm


def _human_count(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    if n >= 1e6:
        return f"{n / 1e6:.2f} M"
    return f"{n / 1e3:.1f} K" if n >= 1e3 else str(n)


# --- shared arguments ------------------------------------------------------------------------------


def _unescape(text: str) -> str:
    r"""Turn the escapes ``\n``, ``\t``, ``\r`` and ``\\`` typed on a command line into characters."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "ntr\\":
            out.append({"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    group.add_argument(
        "--model",
        default=os.environ.get(MODEL_ENV, DEFAULT_MODEL),
        help=f"hub id or local checkpoint folder (default: ${MODEL_ENV}, else {DEFAULT_MODEL})",
    )
    group.add_argument("--revision", help="hub branch, tag or commit")
    group.add_argument(
        "--quantize", type=int, choices=(4, 8), help="quantize a full-precision checkpoint on load"
    )
    group.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "float16", "bfloat16"),
        help="compute dtype (auto: float32 on the CPU, the checkpoint's on a GPU)",
    )
    group.add_argument("--kv-bits", type=int, choices=(4, 8), help="quantize the KV cache")


def _generation_args(parser: argparse.ArgumentParser, max_tokens: int) -> None:
    group = parser.add_argument_group("generation")
    group.add_argument("--max-tokens", type=int, default=max_tokens, help=f"default {max_tokens}")
    group.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    group.add_argument("--top-p", type=float, default=1.0)
    group.add_argument("--top-k", type=int, default=0)
    group.add_argument("--min-p", type=float, default=0.0)
    group.add_argument("--repetition-penalty", type=float)
    group.add_argument("--seed", type=int, help="makes sampling reproducible")
    group.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help=r"stop string, repeatable; \n and \t are understood (e.g. --stop '\ndef ')",
    )


def _generation(args: argparse.Namespace) -> dict[str, Any]:
    """The generation settings, validated before any model is loaded."""
    from .engine import GenerationParams

    settings = {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "seed": args.seed,
        "stop": [_unescape(s) for s in args.stop],
    }
    GenerationParams.create(**settings)
    return settings


def _load_engine(args: argparse.Namespace) -> Any:
    from .engine import StarCoderEngine
    from .loading import validate_load_options

    validate_load_options(args.quantize, 64, args.dtype, args.kv_bits)
    started = time.perf_counter()
    engine = StarCoderEngine.load(
        args.model, quantize=args.quantize, dtype=args.dtype, kv_bits=args.kv_bits, revision=args.revision
    )
    _err(f"Loaded {args.model} in {time.perf_counter() - started:.1f} s.")
    return engine


def _read_text(path: Path, what: str) -> str:
    """A UTF-8 text file, line endings kept as they are."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except FileNotFoundError as e:
        msg = f"The {what} {path} does not exist."
        raise CommandError(msg) from e
    except IsADirectoryError as e:
        msg = f"The {what} {path} is a folder; give a file."
        raise CommandError(msg) from e
    except UnicodeDecodeError as e:
        msg = f"The {what} {path} is not UTF-8 text ({e.reason} at byte {e.start})."
        raise CommandError(msg) from e
    except OSError as e:
        msg = f"Cannot read the {what} {path}: {e.strerror or e}."
        raise CommandError(msg) from e


# --- generate --------------------------------------------------------------------------------------


def _cmd_generate(args: argparse.Namespace) -> int:
    if args.file is not None:
        prompt = sys.stdin.read() if str(args.file) == "-" else _read_text(args.file, "prompt file")
    else:
        prompt = args.prompt
    settings = _generation(args)
    engine = _load_engine(args)
    try:
        last = None
        text_ended_with_newline = True
        for chunk in engine.stream(prompt, **settings):
            if chunk.text:
                _out(chunk.text)
                text_ended_with_newline = chunk.text.endswith("\n")
            last = chunk
        if sys.stdout.isatty() and not text_ended_with_newline:
            _out("\n")  # keep the shell prompt off the last line of code; only on a terminal
        if last is not None:
            _err(_stats(last))
    finally:
        engine.close()
    return 0


# --- infill ----------------------------------------------------------------------------------------


def split_marker(text: str, marker: str = FILL_MARKER, source: str = "the file") -> tuple[str, str]:
    """Split ``text`` at its one ``marker`` into (prefix, suffix); none or several is an error."""
    count = text.count(marker)
    if count == 0:
        msg = f"{source} has no {marker} marker: put {marker} where the missing code goes."
        raise CommandError(msg)
    if count > 1:
        lines = [i + 1 for i, line in enumerate(text.splitlines()) if marker in line]
        msg = f"{source} has {count} {marker} markers (lines {lines}); keep exactly one."
        raise CommandError(msg)
    prefix, suffix = text.split(marker)
    return prefix, suffix


def _write_in_place(path: Path, text: str) -> Path:
    """Replace ``path``'s contents with ``text``, keeping the original as ``path.bak``."""
    backup = path.with_name(path.name + ".bak")
    shutil.copy2(path, backup)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        shutil.copymode(path, tmp)
        os.replace(tmp, path)  # atomic: the file is never half-written
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return backup


def _cmd_infill(args: argparse.Namespace) -> int:
    from .fim import ContextFile

    if args.file is not None and (args.prefix is not None or args.suffix is not None):
        msg = "give either --file (with a marker) or --prefix/--suffix, not both."
        raise CommandError(msg)
    if args.file is None and args.prefix is None:
        msg = f"give --file F (a file with one {args.marker} marker) or --prefix TEXT [--suffix TEXT]."
        raise CommandError(msg)
    if args.write and args.file is None:
        msg = "--write fills a file in place: it needs --file."
        raise CommandError(msg)
    if args.file is not None:
        prefix, suffix = split_marker(_read_text(args.file, "file"), args.marker, str(args.file))
    else:
        prefix, suffix = _unescape(args.prefix), _unescape(args.suffix or "")
    context = [ContextFile(p.as_posix(), _read_text(p, "context file")) for p in args.context]
    # The hole's own path is metadata of the repository layout; plain PSM needs none.
    file_path = args.file_path
    if file_path is None and args.file is not None and (context or args.repo_name):
        file_path = args.file.as_posix()
    settings = _generation(args)
    engine = _load_engine(args)
    try:
        pieces: list[str] = []
        last = None
        chunks = engine.stream_infill(
            prefix, suffix, context_files=context, repo_name=args.repo_name, file_path=file_path,
            mode=args.mode, max_prompt_tokens=args.max_prompt_tokens, **settings,
        )  # fmt: skip
        for chunk in chunks:
            if chunk.text:
                pieces.append(chunk.text)
                if not args.write:
                    _out(chunk.text)
            last = chunk
        if last is not None:
            _err(_stats(last))
    finally:
        engine.close()
    if args.write:
        middle = "".join(pieces)
        backup = _write_in_place(args.file, prefix + middle + suffix)
        _err(f"Filled {args.marker} in {args.file} ({len(middle)} characters); the original is in {backup}.")
    return 0


# --- writing a checkpoint folder safely -------------------------------------------------------------


def _check_destination(dst: Path, force: bool) -> None:
    if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
        msg = f"{dst} exists and is not a folder; choose another destination."
        raise CommandError(msg)
    if dst.is_dir() and any(dst.iterdir()) and not force:
        msg = f"{dst} already exists; pass --force to replace it."
        raise CommandError(msg)


@contextlib.contextmanager
def _staged_folder(dst: Path, force: bool) -> Iterator[Path]:
    """Yield a temporary folder beside ``dst``; on success it becomes ``dst``, on any failure
    (Ctrl-C included) it is deleted, so a half-written ``dst`` never exists."""
    _check_destination(dst, force)
    dst.parent.mkdir(parents=True, exist_ok=True)
    # Not tempfile.mkdtemp: its folders are private (0700), and this one becomes dst.
    tmp = dst.parent / f".{dst.name}.{uuid.uuid4().hex[:8]}.partial"
    tmp.mkdir()
    try:
        yield tmp
        _check_destination(dst, force)  # someone may have written dst meanwhile
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


def _folder_bytes(path: Path) -> int:
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
    biases, a ``quantization`` entry in config.json, the tokenizer files copied. ``dst`` appears
    only when it is complete (written beside it, then renamed); with ``verify`` it is first loaded
    with :class:`~langchain_starcoder.StarCoderEngine` and generates one token.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import quantize_model, save_config, save_model
    from tqdm import tqdm

    from .loading import load_model, read_config, resolve_model_path, validate_load_options

    validate_load_options(bits, group_size, "float16", None)
    dst = Path(dst).expanduser()
    _check_destination(dst, force)
    src_path = resolve_model_path(src, revision)
    config = read_config(src_path)
    if "quantization" in config:
        q = config["quantization"]
        msg = (
            f"{src_path} is already quantized ({q.get('bits')}-bit, group size {q.get('group_size')}); "
            "quantize the full-precision checkpoint it came from."
        )
        raise CommandError(msg)
    if dst.exists() and dst.resolve() == src_path.resolve():
        msg = "The destination is the source checkpoint; write the quantized copy elsewhere."
        raise CommandError(msg)

    with _staged_folder(dst, force) as tmp:
        _err(f"Loading {src} ...")
        # float16 like mlx-community checkpoints: the quantization scales take the weights' dtype.
        loaded = load_model(src_path, quantize=None, group_size=group_size, dtype="float16")
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
        _err(f"Saving to {dst} ...")
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
        written = _folder_bytes(tmp)
    _err(f"Wrote {dst}: {bits}-bit, group size {group_size}, {_human_bytes(written)}.")
    return dst


def _verify_checkpoint(path: Path) -> None:
    """Load a written checkpoint with the engine and generate one token."""
    from .engine import StarCoderEngine

    engine = StarCoderEngine.load(path)
    try:
        engine.generate("def main():", max_tokens=1)
    finally:
        engine.close()
    _err("Checked: the quantized checkpoint loads and generates.")


def _cmd_quantize(args: argparse.Namespace) -> int:
    quantize_checkpoint(
        args.src, args.dst, bits=args.bits, group_size=args.group_size, revision=args.revision,
        force=args.force, verify=not args.no_verify,
    )  # fmt: skip
    return 0


# --- build-test-model --------------------------------------------------------------------------------


def _cmd_build(args: argparse.Namespace) -> int:
    from .testing import INSTRUCT_CHAT_TEMPLATE, build_starcoder2

    dst = Path(args.dst).expanduser()
    if args.layers is not None and args.layers < 1:
        msg = f"--layers must be at least 1, not {args.layers}."
        raise InvalidParameterError(msg)
    with _staged_folder(dst, args.force) as tmp:
        build_starcoder2(
            tmp, preset=args.preset, num_layers=args.layers, sliding_window=args.sliding_window,
            seed=args.seed, dtype=args.dtype, quantize=args.quantize,
            chat_template=INSTRUCT_CHAT_TEMPLATE if args.instruct else None,
        )  # fmt: skip
        written = _folder_bytes(tmp)
    _err(f"Built a {args.preset} StarCoder2 checkpoint with random weights ({_human_bytes(written)}):")
    print(dst)
    return 0


# --- info ------------------------------------------------------------------------------------------------


def checkpoint_info(model: str | os.PathLike[str], revision: str | None = None) -> dict[str, Any]:
    """What a checkpoint is, read from its config and safetensors headers (the weights stay on disk)."""
    import mlx.core as mx

    from .loading import read_config, resolve_model_path, safetensors_header, weight_files
    from .models.starcoder2 import ModelArgs

    path = resolve_model_path(model, revision)
    config = read_config(path)
    args = ModelArgs.from_dict(config)
    quant = config.get("quantization")
    tensors: dict[str, dict[str, Any]] = {}
    files = weight_files(path)
    for file in files:
        tensors.update(safetensors_header(file))

    def numel(shape: Sequence[int]) -> int:
        n = 1
        for d in shape:
            n *= d
        return n

    parameters = 0
    float_bytes: Counter[str] = Counter()
    for name, tensor in tensors.items():
        stem = name.rsplit(".", 1)[0]
        packed = tensors.get(stem + ".weight", {}).get("dtype") == "U32"
        if packed and name.endswith((".scales", ".biases")):
            continue  # quantization metadata, not parameters
        count = numel(tensor["shape"])
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
        "quantization": (
            {
                "bits": quant.get("bits"),
                "group_size": quant.get("group_size"),
                "mode": quant.get("mode", "affine"),
            }
            if quant
            else None
        ),
        "context_window": args.max_position_embeddings,
        "sliding_window": args.sliding_window,
        "rope_theta": args.rope_theta,
        "weight_files": len(files),
        "weight_bytes": sum(f.stat().st_size for f in files),
        "fim": {"<fim_prefix>", "<fim_suffix>", "<fim_middle>"} <= added,
        "repo_level_fim": {"<repo_name>", "<file_sep>"} <= added,
        "chat_template": (
            bool(tokenizer_config.get("chat_template")) or (path / "chat_template.jinja").is_file()
        ),
    }


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _format_info(info: dict[str, Any]) -> str:
    q = info["quantization"]
    window = info["sliding_window"]
    rows = [
        ("model", info["model"] if info["model"] == info["path"] else f"{info['model']} ({info['path']})"),
        (
            "architecture",
            f"{info['architecture']}: {info['layers']} layers, hidden {info['hidden_size']}, "
            f"{info['attention_heads']} heads ({info['kv_heads']} KV, head dim {info['head_dim']}), "
            f"MLP {info['intermediate_size']}, vocab {info['vocab_size']}"
            + (", tied embeddings" if info["tied_embeddings"] else ""),
        ),
        ("parameters", f"{_human_count(info['parameters'])} ({info['parameters']:,})"),
        ("dtype", f"{info['dtype']} on disk; computes in {info['compute_dtype']} here (dtype='auto')"),
        ("quantization", f"{q['bits']}-bit, group size {q['group_size']} ({q['mode']})" if q else "none"),
        (
            "context",
            f"{info['context_window']} tokens, "
            + (f"sliding window {window}" if window else "full attention (no sliding window)"),
        ),
        ("rope theta", f"{info['rope_theta']:g}"),
        ("weights", f"{_human_bytes(info['weight_bytes'])} in {info['weight_files']} file(s)"),
        (
            "tokens",
            f"FIM {_yes(info['fim'])}, repository FIM {_yes(info['repo_level_fim'])}, "
            f"chat template {_yes(info['chat_template'])}",
        ),
    ]
    return "\n".join(f"{k + ':':<14}{v}" for k, v in rows)


def _cmd_info(args: argparse.Namespace) -> int:
    info = checkpoint_info(args.model, args.revision)
    print(json.dumps(info, indent=2) if args.json else _format_info(info))
    return 0


# --- bench ------------------------------------------------------------------------------------------------


def _run_bench(argv: list[str]) -> int:
    """Run ``benchmarks.__main__.main(argv)``. The benchmarks live in the repository, not the wheel."""
    # The console script's sys.path lacks the working directory; a checkout's benchmarks are there.
    if (Path.cwd() / "benchmarks" / "__main__.py").is_file() and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        bench = importlib.import_module("benchmarks.__main__")
    except ModuleNotFoundError as e:
        if e.name not in ("benchmarks", "benchmarks.__main__"):
            raise
        msg = (
            "The benchmarks are not installed with the package. Run them from a checkout of the "
            "repository: `git clone <repo> && cd langchain-starcoder && pip install -e '.[test]' && "
            f"{PROG} bench` (or `python -m benchmarks`) from its root folder."
        )
        raise CommandError(msg) from e
    result = bench.main(argv)
    return int(result or 0)


# --- the parser --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand's default must not overwrite a --verbose given before it.
    common.add_argument(
        "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors"
    )
    parser = _Parser(
        prog=PROG,
        description="StarCoder2 code models on MLX: generate, fill in the middle, quantize, inspect.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser(
        "generate",
        parents=[common],
        help="complete a prompt, streaming the text",
        description="Complete a prompt, streaming the text to stdout; speeds go to stderr.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="the prompt text (special tokens such as <fim_prefix> are parsed)")
    source.add_argument("--file", type=Path, help="read the prompt from a file ('-' for stdin)")
    _model_args(p)
    _generation_args(p, max_tokens=256)
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser(
        "infill",
        parents=[common],
        help="fill in the middle of a file",
        description=(
            f"Fill the hole marked {FILL_MARKER} in a file (or between --prefix and --suffix). Prints "
            "the middle only, or with --write fills the file in place, keeping F.bak."
        ),
    )
    p.add_argument("--file", type=Path, help=f"a file with exactly one {FILL_MARKER} marker")
    p.add_argument("--prefix", help=r"the code before the hole, instead of --file (\n understood)")
    p.add_argument("--suffix", help="the code after the hole")
    p.add_argument("--marker", default=FILL_MARKER, help=f"the hole marker (default {FILL_MARKER})")
    p.add_argument(
        "--context", type=Path, nargs="+", default=[], metavar="FILE", help="other files of the repository"
    )
    p.add_argument("--repo-name", help="the repository's name (StarCoder2 repository-level FIM)")
    p.add_argument(
        "--file-path", help="the hole's path in the repository (default: --file, when there is context)"
    )
    p.add_argument("--mode", choices=("psm", "spm"), default="psm")
    p.add_argument("--max-prompt-tokens", type=int, help="token budget of the prompt (default: the context)")
    p.add_argument("--write", action="store_true", help="fill the file in place (the original goes to F.bak)")
    _model_args(p)
    _generation_args(p, max_tokens=128)
    p.set_defaults(func=_cmd_infill)

    p = sub.add_parser(
        "quantize",
        parents=[common],
        help="write an MLX-quantized checkpoint",
        description="Quantize a full-precision StarCoder2 checkpoint (folder or hub id) into the folder DST.",
    )
    p.add_argument("src", metavar="SRC", help="full-precision checkpoint: folder or hub id")
    p.add_argument("dst", metavar="DST", type=Path, help="folder to write")
    p.add_argument("--bits", type=int, choices=(4, 8), default=4)
    p.add_argument("--group-size", type=int, choices=(32, 64, 128), default=64)
    p.add_argument("--revision", help="hub branch, tag or commit of SRC")
    p.add_argument("--force", action="store_true", help="replace DST if it exists")
    p.add_argument("--no-verify", action="store_true", help="skip loading the result to check it")
    p.set_defaults(func=_cmd_quantize)

    from .testing import PRESETS

    p = sub.add_parser(
        "build-test-model",
        parents=[common],
        help="build a checkpoint with random weights, offline",
        description="Build a StarCoder2 checkpoint with random weights (the real layout), offline.",
    )
    p.add_argument("dst", metavar="DST", type=Path, help="folder to write")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--layers", type=int, help="number of layers (keeps a big preset small)")
    p.add_argument("--sliding-window", type=int, help="attention window (0: full attention)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    p.add_argument("--quantize", type=int, choices=(4, 8), help="write it quantized (float16 scales)")
    p.add_argument("--instruct", action="store_true", help="give it an instruct chat template")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="replace DST if it exists")
    p.set_defaults(func=_cmd_build)

    p = sub.add_parser(
        "info",
        parents=[common],
        help="describe a checkpoint",
        description="Architecture, parameters, dtype, quantization, context and weight size of a checkpoint.",
    )
    p.add_argument(
        "--model",
        default=os.environ.get(MODEL_ENV, DEFAULT_MODEL),
        help=f"hub id or local checkpoint folder (default: ${MODEL_ENV}, else {DEFAULT_MODEL})",
    )
    p.add_argument("--revision", help="hub branch, tag or commit")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_info)

    # Parsed by hand in main(): everything after "bench" goes to the benchmarks untouched.
    sub.add_parser("bench", help="run the benchmarks (from a checkout): bench --help", add_help=False)
    return parser


def _split_bench(argv: list[str]) -> tuple[bool, list[str]] | None:
    """``[-v] bench ARGS...`` -> (verbose, ARGS); None for any other command."""
    verbose = False
    for i, arg in enumerate(argv):
        if arg in ("-v", "--verbose"):
            verbose = True
        elif arg == "bench":
            return verbose, argv[i + 1 :]
        else:
            return None
    return None


def _dispatch(argv: list[str]) -> int:
    bench = _split_bench(argv)
    if bench is not None:
        return _run_bench(bench[1])
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


def _quiet_broken_pipe() -> None:
    """stdout's reader went away (``| head``): stop writing to it without a second error at exit."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (0 on success)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    bench = _split_bench(argv)
    verbose = bench[0] if bench is not None else any(a in ("-v", "--verbose") for a in argv)
    try:
        return _dispatch(argv)
    except _ArgumentError as e:
        _err(f"{e.prog}: error: {e} (see {e.prog} --help)")
        return 2
    except SystemExit as e:  # --help, or a benchmark that exits itself
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        if verbose:
            traceback.print_exc()
        _err(f"{PROG}: interrupted.")
        return 130
    except BrokenPipeError:
        _quiet_broken_pipe()
        return 0
    except StarCoderError as e:
        if verbose:
            traceback.print_exc()
        _err(f"{PROG}: error: {e}")
        return 1
    except Exception as e:
        if verbose:
            traceback.print_exc()
            _err(f"{PROG}: unexpected error: {type(e).__name__}: {e}")
        else:
            _err(f"{PROG}: unexpected error: {type(e).__name__}: {e} (run with --verbose for the traceback)")
        return 1


if __name__ == "__main__":
    sys.exit(main())
