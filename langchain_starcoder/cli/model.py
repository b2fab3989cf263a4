"""The commands that run or read a model: generate, infill (with its repository context) and info."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from ..checkpoints import check_in_place, format_info, write_in_place
from .options import FILL_MARKER, LOAD_FLAGS, _generation, _unescape, load_settings
from .output import CommandError, _err, _notes, _out, _read_text, _stream


def _load_engine(args: argparse.Namespace) -> Any:
    from ..engine import StarCoderEngine
    from ..engine.options import LlamaCppOptions, MLXOptions, load_options, misplaced

    started = time.perf_counter()
    settings = load_settings(args)
    if args.base_url is not None:
        return _connect(args, settings, started)
    wrong = misplaced(LlamaCppOptions if args.backend == "llama.cpp" else MLXOptions, settings)
    if wrong:
        backends = " or ".join(sorted({kind.backend for kind in wrong.values()}))
        msg = f"{', '.join(LOAD_FLAGS[name] for name in wrong)} need --backend {backends}"
        raise CommandError(msg)
    options = load_options(backend=args.backend, **settings)
    # mlx-lm prints "[INFO] Quantized model ..." when quantizing on load; stdout is only for the text.
    with contextlib.redirect_stdout(sys.stderr), _notes():
        engine = StarCoderEngine.load(args.model, options=options)
    on = " on llama.cpp" if args.backend == "llama.cpp" else ""
    if engine.adapter is not None:
        on += f" with the {engine.adapter.fine_tune_type} adapter {engine.adapter.path}"
    _err(f"Loaded {args.model}{on} in {time.perf_counter() - started:.1f} s.")
    return engine


def _connect(args: argparse.Namespace, settings: dict[str, Any], started: float) -> Any:
    """An engine over the --base-url server (the model's options here are the server's business)."""
    from ..engine import StarCoderEngine
    from ..engine.options import RemoteOptions, misplaced

    given = ["--backend"] if args.backend != "mlx" else []
    given += [LOAD_FLAGS[name] for name in misplaced(RemoteOptions, settings)]
    if given:
        msg = f"{', '.join(given)} apply to a model loaded here, not to --base-url (the server loads it)."
        raise CommandError(msg)
    engine = StarCoderEngine.connect(
        args.base_url,
        model=args.model,
        tokenizer=args.tokenizer,
        api_key=args.remote_api_key,
        inexact_past_window=args.inexact_past_window,
    )
    _err(f"Connected to {args.base_url} ({args.model}) in {time.perf_counter() - started:.1f} s.")
    return engine


# --- generate --------------------------------------------------------------------------------------


def _cmd_generate(args: argparse.Namespace) -> int:
    """complete a prompt, streaming the text

    Complete a prompt, streaming the text to stdout; speeds go to stderr.
    """
    if args.file is not None:
        prompt = sys.stdin.read() if str(args.file) == "-" else _read_text(args.file, "prompt file")
    else:
        prompt = args.prompt
    settings = _generation(args)
    engine = _load_engine(args)
    with _notes():  # a skipped prompt-cache file is noted, not warned
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
    """fill in the middle of a file

    Fill the hole marked <FILL> in a file (or between --prefix and --suffix). Prints the middle only, or
    with --write fills the file in place, keeping F.bak.
    """
    from ..fim.request import ContextFile

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
        prefix,
        suffix,
        context_files=context,
        repo_name=args.repo_name,
        file_path=file_path,
        mode=args.mode,
        end=args.end,
        max_prompt_tokens=args.max_prompt_tokens,
        repo=repo,
        **settings,
    )
    with _notes():
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
    from ..repo import RepoIndex

    index = RepoIndex(root)
    _err(f"Repository context from {root} ({len(index.files)} files indexed).")
    return index


# --- info ------------------------------------------------------------------------------------------------


def _cmd_info(args: argparse.Namespace) -> int:
    """describe a checkpoint

    Architecture, parameters, dtype, quantization, context and weight size of a checkpoint (a folder,
    hub id or .gguf file; the weights are not loaded).
    """
    from ..checkpoints import checkpoint_info

    with _notes():
        info = checkpoint_info(
            args.model, args.revision, gguf_file=args.gguf_file, sliding_window=args.sliding_window
        )
    print(json.dumps(info, indent=2) if args.json else format_info(info))
    return 0
