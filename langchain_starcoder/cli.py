"""The ``langchain-starcoder`` command: generate, fill in the middle, quantize, inspect and benchmark.

One file: argparse and one function per command; the library work is in the checkpoints package.

.. code-block:: bash

    langchain-starcoder generate --model mlx-community/starcoder2-3b-4bit --prompt "def fib(n):"
    langchain-starcoder infill --model M --file app.py --context utils.py --repo-name my/app
    langchain-starcoder quantize bigcode/starcoder2-3b ./starcoder2-3b-4bit --bits 4
    langchain-starcoder convert starcoder2-3b-Q4_0.gguf ./starcoder2-3b-q4
    langchain-starcoder build-test-model ./tiny --preset tiny
    langchain-starcoder info --model ./starcoder2-3b-4bit
    langchain-starcoder serve --model ./starcoder2-3b-4bit --port 8080
    langchain-starcoder bench --help

Generated text goes to stdout and nothing else does: progress, statistics and errors go to stderr, so
``langchain-starcoder generate ... > out.py`` captures just the code. An error prints one line and
exits non-zero; ``--verbose`` adds the traceback. Argparse and commands only (the library behind them is
:mod:`langchain_starcoder.checkpoints`); MLX loads inside the commands that need it, so ``--help`` is instant.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.machinery
import json
import os
import re
import stat
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .checkpoints import check_in_place, folder_bytes, format_info, human_bytes, staged_folder, write_in_place
from .errors import InvalidParameterError, StarCoderError

#: The same as ``registry.DEFAULT_MODEL``, repeated because importing the registry imports MLX.
DEFAULT_MODEL = "mlx-community/starcoder2-3b-4bit"
#: ``testing.PRESETS``'s names, repeated because importing it imports numpy (checked by a test).
PRESET_NAMES = ("tiny", "small", "3b", "7b", "15b")
PROG = "langchain-starcoder"
#: ``testing.MODEL_ENV`` (the model when none is given), repeated: importing testing imports numpy.
MODEL_ENV = "LANGCHAIN_STARCODER_MODEL"
FILL_MARKER = "<FILL>"
#: Read by ``serve`` when --api-key is not given (keeps the key out of the process list).
API_KEY_ENV = "LANGCHAIN_STARCODER_API_KEY"


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
    prompt_s, gen_s = chunk.prompt_seconds, chunk.generation_seconds or 0.0
    prompt_rate = f"{(prompt - cached) / prompt_s:.1f} tokens/s" if prompt_s else "speed unknown"
    gen_tps = (chunk.completion_tokens or 0) / gen_s if gen_s > 0 else 0.0
    cached_note = f", {cached} cached" if cached else ""
    return (
        f"[{chunk.finish_reason}] prompt: {prompt} tokens{cached_note}, {prompt_rate} | "
        f"generation: {chunk.completion_tokens} tokens, {gen_tps:.1f} tokens/s"
    )


# --- shared arguments ------------------------------------------------------------------------------


_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def _unescape(text: str) -> str:
    r"""Turn the escapes ``\n``, ``\t``, ``\r`` and ``\\`` typed on a command line into characters."""
    return re.sub(r"\\([ntr\\])", lambda m: _ESCAPES[m.group(1)], text)


def _model_option(group: argparse.ArgumentParser | argparse._ArgumentGroup, gguf: bool = False) -> None:
    kinds = "hub id, local checkpoint folder or .gguf file" if gguf else "hub id or local checkpoint folder"
    group.add_argument(
        "--model",
        default=os.environ.get(MODEL_ENV, DEFAULT_MODEL),
        help=f"{kinds} (default: ${MODEL_ENV}, else {DEFAULT_MODEL})",
    )
    group.add_argument("--revision", help="hub branch, tag or commit")


def _gguf_options(group: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--gguf-file", metavar="NAME", help="the GGUF file to load from the folder or hub repo"
    )
    group.add_argument(
        "--sliding-window",
        type=int,
        metavar="N",
        help="GGUF only: the attention window (0: full attention; default StarCoder2's 4096)",
    )


def _model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("model")
    _model_option(group, gguf=True)
    _gguf_options(group)
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
    from .types import GenerationParams

    names = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed")
    settings = {name: getattr(args, name) for name in names}
    settings["stop"] = [_unescape(s) for s in args.stop]
    GenerationParams.create(**settings)
    return settings


@contextlib.contextmanager
def _notes() -> Iterator[None]:
    """Notices of the library (GGUF defaults, memory costs) as one ``note:`` line each on stderr."""
    from .gguf_format import GGUFNotice

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", GGUFNotice)
        try:
            yield
        finally:
            for w in caught:
                if issubclass(w.category, GGUFNotice):
                    _err(f"{PROG}: note: {w.message}")
                else:
                    warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def _load_engine(args: argparse.Namespace) -> Any:
    from .engine import StarCoderEngine

    started = time.perf_counter()
    # mlx-lm prints "[INFO] Quantized model ..." when quantizing on load; stdout is only for the text.
    with contextlib.redirect_stdout(sys.stderr), _notes():
        engine = StarCoderEngine.load(
            args.model, quantize=args.quantize, dtype=args.dtype, kv_bits=args.kv_bits,
            revision=args.revision, gguf_file=args.gguf_file, sliding_window=args.sliding_window,
        )  # fmt: skip
    _err(f"Loaded {args.model} in {time.perf_counter() - started:.1f} s.")
    return engine


def _read_text(path: Path, what: str) -> str:
    """A UTF-8 text file, line endings kept as they are."""
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except UnicodeDecodeError as e:
        msg = f"The {what} {path} is not UTF-8 text ({e.reason} at byte {e.start})."
        raise CommandError(msg) from e
    except OSError as e:  # missing, a folder, not readable...
        msg = f"Cannot read the {what} {path}: {e.strerror or e}."
        raise CommandError(msg) from e


def _stream(engine: Any, chunks: Iterator[Any], echo: bool) -> str:
    """Consume ``chunks`` (closing the engine after), echoing the text to stdout as it arrives if asked;
    the speeds go to stderr. Returns the whole text."""
    pieces: list[str] = []
    last = None
    try:
        for chunk in chunks:
            if chunk.text:
                pieces.append(chunk.text)
                if echo:
                    _out(chunk.text)
            last = chunk
    finally:
        chunks.close()  # type: ignore[attr-defined]  # Ctrl-C: stop the generation, also mid-prefill
        engine.close()
    apart = ""
    if echo and pieces and not pieces[-1].endswith("\n"):
        if sys.stdout.isatty():
            _out("\n")  # keep the shell prompt and the speeds off the last line of code
        elif _stderr_shows_stdout():
            apart = "\n"  # on stderr: stdout stays exactly the generated text
    if last is not None:
        _err(apart + _stats(last))
    return "".join(pieces)


def _stderr_shows_stdout() -> bool:
    """Whether what reads stderr also shows stdout: one pipe or file for both (``2>&1``, an IDE's console,
    a CI log), or stdout piped on (``| tee``, ``| less``) to the terminal stderr writes to."""
    try:
        out, err = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):  # streams that are not files (captured, notebooks)
        return False
    return os.path.samestat(out, err) or (stat.S_ISFIFO(out.st_mode) and sys.stderr.isatty())


# --- generate --------------------------------------------------------------------------------------


def _cmd_generate(args: argparse.Namespace) -> int:
    if args.file is not None:
        prompt = sys.stdin.read() if str(args.file) == "-" else _read_text(args.file, "prompt file")
    else:
        prompt = args.prompt
    settings = _generation(args)
    engine = _load_engine(args)
    _stream(engine, engine.stream(prompt, **settings), echo=True)
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


def _cmd_infill(args: argparse.Namespace) -> int:
    from .types import ContextFile

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
    if args.write:
        target, backup = check_in_place(args.file)  # before generating, not after
    context = [ContextFile(p.as_posix(), _read_text(p, "context file")) for p in args.context]
    root = _repo_root(args) if not context else None  # given context files win over the repository
    # The hole's own path is metadata of the repository layout; plain PSM needs none.
    file_path = args.file_path
    if file_path is None and args.file is not None and (context or args.repo_name or root):
        file_path = args.file.as_posix()
    if root is not None and file_path is None:
        msg = "--repo needs the hole's path in the repository: give --file-path PATH (or --file)."
        raise CommandError(msg)
    settings = _generation(args)
    repo = _repo_index(root) if root is not None else None
    engine = _load_engine(args)
    chunks = engine.stream_infill(
        prefix, suffix, context_files=context, repo_name=args.repo_name, file_path=file_path,
        mode=args.mode, max_prompt_tokens=args.max_prompt_tokens, repo=repo, **settings,
    )  # fmt: skip
    middle = _stream(engine, chunks, echo=not args.write)
    if args.write:
        try:
            write_in_place(target, backup, prefix + middle + suffix)
        except OSError as e:
            _out(middle)  # the generated code is not lost
            msg = f"Cannot write {target}: {e.strerror or e}; the middle went to stdout instead."
            raise CommandError(msg) from e
        _err(f"Filled {args.marker} in {target} ({len(middle)} characters); the original is in {backup}.")
    return 0


def _repo_root(args: argparse.Namespace) -> Path | None:
    """The repository whose code is context: --repo, else the git root of --file, else none."""
    if args.no_repo:
        if args.repo is not None:
            msg = "give --repo DIR or --no-repo, not both."
            raise CommandError(msg)
        return None
    if args.repo is not None:
        if not args.repo.is_dir():
            msg = f"--repo {args.repo} is not a folder: give the repository's root folder."
            raise CommandError(msg)
        return args.repo
    if args.file is None or str(args.file) == "-":
        return None
    return git_root(args.file)


def git_root(path: Path) -> Path | None:
    """The nearest folder at or above ``path``'s folder that holds ``.git`` (a folder or, in a
    worktree or submodule, a file), or None."""
    folder = path.resolve().parent
    for candidate in (folder, *folder.parents):
        if (candidate / ".git").exists():
            return candidate
    return None


def _repo_index(root: Path) -> Any:
    from .repo import RepoIndex

    index = RepoIndex(root)
    _err(f"Repository context from {root} ({len(index.files)} files indexed).")
    return index


# --- quantize --------------------------------------------------------------------------------------


def _cmd_quantize(args: argparse.Namespace) -> int:
    from .checkpoints import quantize_checkpoint

    quantize_checkpoint(
        args.src, args.dst, bits=args.bits, group_size=args.group_size, revision=args.revision,
        force=args.force, verify=not args.no_verify,
    )  # fmt: skip
    return 0


# --- convert ----------------------------------------------------------------------------------------


def _cmd_convert(args: argparse.Namespace) -> int:
    from .gguf_format import convert_gguf, is_gguf, resolve_gguf_file
    from .loading import check_weights_match_config, read_config, weight_headers

    if not is_gguf(args.src, args.gguf_file):
        msg = "convert reads GGUF files: give a .gguf file, or --gguf-file NAME with a folder or hub id."
        raise CommandError(msg)
    src = resolve_gguf_file(args.src, args.gguf_file, args.revision)
    dst = Path(args.dst).expanduser()
    with staged_folder(dst, args.force, source=src, command="convert") as tmp, _notes():
        convert_gguf(src, tmp, sliding_window=args.sliding_window)
        check_weights_match_config(tmp, read_config(tmp), weight_headers(tmp))  # loads as a checkpoint
        written = folder_bytes(tmp)
    _err(f"Converted {src.name} into an MLX checkpoint ({human_bytes(written)}):")
    print(dst)
    return 0


# --- build-test-model --------------------------------------------------------------------------------


def _cmd_build(args: argparse.Namespace) -> int:
    from .testing import INSTRUCT_CHAT_TEMPLATE, build_starcoder2

    dst = Path(args.dst).expanduser()
    if args.layers is not None and args.layers < 1:
        msg = f"--layers must be at least 1, not {args.layers}."
        raise InvalidParameterError(msg)
    with staged_folder(dst, args.force, command="build-test-model") as tmp:
        build_starcoder2(
            tmp, preset=args.preset, num_layers=args.layers, sliding_window=args.sliding_window,
            seed=args.seed, dtype=args.dtype, quantize=args.quantize,
            chat_template=INSTRUCT_CHAT_TEMPLATE if args.instruct else None,
        )  # fmt: skip
        written = folder_bytes(tmp)
    _err(f"Built a {args.preset} StarCoder2 checkpoint with random weights ({human_bytes(written)}):")
    print(dst)
    return 0


# --- info ------------------------------------------------------------------------------------------------


def _cmd_info(args: argparse.Namespace) -> int:
    from .checkpoints import checkpoint_info

    with _notes():
        info = checkpoint_info(
            args.model, args.revision, gguf_file=args.gguf_file, sliding_window=args.sliding_window
        )
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0


# --- serve ------------------------------------------------------------------------------------------------


def _serve_positive(kind: type[int] | type[float]) -> Callable[[str], float]:
    """An argparse type for a serve bound: a number above 0."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not 0 < value < float("inf"):
            msg = f"expected a {kind.__name__} above 0, got {text!r}"
            raise argparse.ArgumentTypeError(msg)
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its error
    return parse


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from .server import BoundedConfig, create_app
    except ImportError as e:  # an optional extra
        msg = f"serve needs the 'server' extra ({e.name} is missing): pip install -e \".[server]\""
        raise CommandError(msg) from e

    if args.api_key is None:
        args.api_key = os.environ.get(API_KEY_ENV) or None
    if args.repo is not None and not args.repo.is_dir():
        msg = f"--repo {args.repo} is not a folder: give the repository's root folder."
        raise CommandError(msg)
    repo = _repo_index(args.repo) if args.repo is not None else None  # scanned before serving
    failed: list[BaseException] = []

    def load() -> Any:
        try:
            return _load_engine(args)
        except BaseException as e:  # stop serving: the command fails with the loader's one-line error
            failed.append(e)
            server.should_exit = True
            raise

    # The model loads in a thread once the server is up: /health says 503 until it is ready.
    app = create_app(
        load, api_key=args.api_key, parse_special_tokens=args.parse_special_tokens,
        model_name=args.model_name, batch_window_ms=args.batch_window_ms,
        max_body_bytes=int(args.max_body_mb * 2**20), repo=repo,
    )  # fmt: skip
    config = BoundedConfig(
        app, host=args.host, port=args.port, log_level=args.log_level, max_connections=args.max_connections,
        request_timeout=args.request_timeout, keep_alive_timeout=args.keep_alive_timeout,
    )  # fmt: skip
    server = uvicorn.Server(config)
    _err(f"Serving {args.model} on http://{args.host}:{args.port} (/v1/completions, /infill, /health).")
    server.run()
    if failed:
        raise failed[0]
    return 0


# --- bench ------------------------------------------------------------------------------------------------


def _run_bench(argv: list[str]) -> int:
    """Run ``python -m benchmarks ARGS`` in a child process. The benchmarks live in the repository, not the
    wheel, and the package never imports them."""
    # The child's sys.path starts with the working directory, as `python -m` does.
    spec = importlib.machinery.PathFinder.find_spec("benchmarks", [os.getcwd(), *sys.path])
    if spec is None or not spec.submodule_search_locations:
        msg = (
            "The benchmarks are not installed with the package. Run them from a checkout of the "
            "repository: `git clone <repo> && cd langchain-starcoder && pip install -e '.[test]' && "
            f"{PROG} bench` (or `python -m benchmarks`) from its root folder."
        )
        raise CommandError(msg)
    # As `python -m benchmarks` (the working directory first on sys.path), but named as it was typed.
    run = "import sys; from benchmarks.__main__ import main; sys.exit(main(sys.argv[2:], prog=sys.argv[1]))"
    return subprocess.call([sys.executable, "-c", run, f"{PROG} bench", *argv])


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
    p.add_argument(
        "--repo",
        type=Path,
        metavar="DIR",
        help=(
            "pick context from this repository's code (docs/repository-context.md); default: the git "
            "root of --file (the nearest folder above it holding .git); without one, and with --prefix, "
            "no repository context. --context files win over it"
        ),
    )
    p.add_argument(
        "--no-repo", action="store_true", help="no repository context, even inside a git repository"
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
    p.add_argument(
        "--force", action="store_true", help="replace DST if it is a checkpoint this command wrote"
    )
    p.add_argument("--no-verify", action="store_true", help="skip loading the result to check it")
    p.set_defaults(func=_cmd_quantize)

    p = sub.add_parser(
        "convert",
        parents=[common],
        help="write an MLX checkpoint from a GGUF file",
        description=(
            "Convert a StarCoder2 GGUF file (llama.cpp, Ollama) into an MLX checkpoint folder DST "
            "(safetensors, config.json, tokenizer.json) that this package and mlx-lm load. Q4_0, Q4_1 "
            "and Q8_0 tensors stay quantized."
        ),
    )
    p.add_argument("src", metavar="SRC", help="a .gguf file, or a folder or hub id with --gguf-file")
    p.add_argument("dst", metavar="DST", type=Path, help="folder to write")
    _gguf_options(p)
    p.add_argument("--revision", help="hub branch, tag or commit of SRC")
    p.add_argument(
        "--force", action="store_true", help="replace DST if it is a checkpoint this command wrote"
    )
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser(
        "build-test-model",
        parents=[common],
        help="build a checkpoint with random weights, offline",
        description="Build a StarCoder2 checkpoint with random weights (the real layout), offline.",
    )
    p.add_argument("dst", metavar="DST", type=Path, help="folder to write")
    p.add_argument("--preset", choices=PRESET_NAMES, default="tiny")
    p.add_argument("--layers", type=int, help="number of layers (keeps a big preset small)")
    p.add_argument("--sliding-window", type=int, help="attention window (0: full attention)")
    p.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32")
    p.add_argument("--quantize", type=int, choices=(4, 8), help="write it quantized (float16 scales)")
    p.add_argument("--instruct", action="store_true", help="give it an instruct chat template")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--force", action="store_true", help="replace DST if it is a checkpoint built here")
    p.set_defaults(func=_cmd_build)

    p = sub.add_parser(
        "info",
        parents=[common],
        help="describe a checkpoint",
        description="Architecture, parameters, dtype, quantization, context and weight size of a checkpoint "
        "(a folder, hub id or .gguf file; the weights are not loaded).",
    )
    _model_option(p, gguf=True)
    _gguf_options(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser(
        "serve",
        parents=[common],
        help="serve the model over HTTP (OpenAI completions, llama.cpp /infill)",
        description=(
            "Serve the model over HTTP: OpenAI-compatible /v1/completions (with suffix for fill in the "
            "middle) and /v1/chat/completions, llama.cpp's /infill (llama.vim, llama.vscode), /health, "
            "/v1/models, /tokenize and /detokenize."
        ),
    )
    _model_args(p)
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=8080, help="default 8080")
    p.add_argument(
        "--api-key", help=f"require 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}, else none)"
    )
    p.add_argument(
        "--parse-special-tokens",
        action="store_true",
        help="parse control-token strings (<fim_prefix>...) in /v1/completions text prompts (default: data)",
    )
    p.add_argument("--model-name", help="the model id the API reports (default: --model)")
    p.add_argument(
        "--repo",
        type=Path,
        metavar="DIR",
        help="add this repository's context to /infill and /v1/completions (with suffix) requests that "
        "send file_path (relative to DIR), after the client's input_extra (default: none)",
    )
    p.add_argument(
        "--batch-window-ms",
        type=float,
        default=0,
        metavar="MS",
        help="batch non-streamed requests with the same settings that arrive within MS of each other "
        "(default 0: off, each request reuses the prompt cache)",
    )
    p.add_argument(
        "--max-body-mb",
        type=_serve_positive(float),
        default=4.0,
        metavar="MB",
        help="refuse (413) a request body over MB MiB before reading it whole (default 4)",
    )
    p.add_argument(
        "--max-connections",
        type=_serve_positive(int),
        metavar="N",
        help="open connections at most; when full, the one waiting longest for its request is closed "
        "(default 512, or half the open-file limit if lower)",
    )
    p.add_argument(
        "--request-timeout",
        type=_serve_positive(float),
        default=20.0,
        metavar="S",
        help="close a connection whose request (headers and body) has not come in S seconds (default 20)",
    )
    p.add_argument(
        "--keep-alive-timeout",
        type=_serve_positive(float),
        default=5.0,
        metavar="S",
        help="close an idle keep-alive connection after S seconds (default 5)",
    )
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=_cmd_serve)

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


def _dispatch(argv: list[str], bench: list[str] | None) -> int:
    if bench is not None:
        return _run_bench(bench)
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
        return _dispatch(argv, bench[1] if bench is not None else None)
    except _ArgumentError as e:
        _err(f"{e.prog}: error: {e} (see {e.prog} --help)")
        return 2
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BrokenPipeError:
        _quiet_broken_pipe()
        return 0
    except (KeyboardInterrupt, Exception) as e:
        if verbose:
            traceback.print_exc()
        if isinstance(e, KeyboardInterrupt):
            _err(f"{PROG}: interrupted.")
            return 130
        if isinstance(e, StarCoderError):
            _err(f"{PROG}: error: {e}")
        else:
            hint = "" if verbose else " (run with --verbose for the traceback)"
            _err(f"{PROG}: unexpected error: {type(e).__name__}: {e}{hint}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
