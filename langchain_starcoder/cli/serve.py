"""The ``serve`` command: the HTTP server (the 'server' extra) over a model loaded once it is up."""

from __future__ import annotations

import argparse
import os
from typing import Any

from .model import _load_engine, _repo_index
from .options import API_KEY_ENV, default_prompt_cache_dir
from .output import CommandError, _err


def _cmd_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ..server import BoundedConfig, create_app
    except ImportError as e:  # an optional extra
        msg = f"serve needs the 'server' extra ({e.name} is missing): pip install -e \".[server]\""
        raise CommandError(msg) from e

    if args.api_key is None:
        args.api_key = os.environ.get(API_KEY_ENV) or None
    if args.repo is not None and not args.repo.is_dir():
        msg = f"--repo {args.repo} is not a folder: give the repository's root folder."
        raise CommandError(msg)
    if args.no_prompt_cache and args.prompt_cache_dir is not None:
        msg = "give --prompt-cache-dir DIR or --no-prompt-cache, not both."
        raise CommandError(msg)
    in_process = args.backend == "mlx" and args.base_url is None  # other servers keep their own caches
    if in_process and not args.no_prompt_cache and args.prompt_cache_dir is None:
        args.prompt_cache_dir = default_prompt_cache_dir()  # on by default: a restart starts warm
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
        prompt_lookup_num_tokens=args.prompt_lookup,
    )  # fmt: skip
    config = BoundedConfig(
        app, host=args.host, port=args.port, log_level=args.log_level, max_connections=args.max_connections,
        request_timeout=args.request_timeout, keep_alive_timeout=args.keep_alive_timeout,
    )  # fmt: skip
    server = uvicorn.Server(config)
    _err(f"Serving {args.model} on http://{args.host}:{args.port} (/v1/completions, /infill, /health).")
    if args.prompt_cache_dir is not None:
        _err(f"Prompt caches are kept in {args.prompt_cache_dir} (--no-prompt-cache: none).")
    server.run()
    if failed:
        raise failed[0]
    return 0
