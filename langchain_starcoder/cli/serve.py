"""The ``serve`` command: the HTTP server (the 'server' extra) over a model loaded once it is up."""

from __future__ import annotations

import argparse
import errno
import socket

from .model import _load_engine, _repo_index
from .options import default_prompt_cache_dir, picked
from .output import CommandError, _err
from .serve_adapters import check_adapters, split_adapters
from .serve_checks import api_keys, check_model_reachable, say_what_is_shared


def _cmd_serve(args: argparse.Namespace) -> int:
    """serve the model over HTTP (OpenAI completions, llama.cpp /infill)

    Serve the model over HTTP: OpenAI-compatible /v1/completions (with suffix for fill in the middle)
    and /v1/chat/completions, llama.cpp's /infill (llama.vim, llama.vscode), /health, /v1/models,
    /tokenize and /detokenize. Each --api-key is a tenant whose documents and prompt cache are its own;
    without a key the server has one tenant, shared by every client.
    """
    try:
        from .. import server  # noqa: F401  # the optional extra, checked before any work
    except ImportError as e:
        msg = f"serve needs the 'server' extra ({e.name} is missing): pip install -e \".[server]\""
        raise CommandError(msg) from e

    args.api_keys = api_keys(args)  # each a tenant (none: one tenant, every client)
    # One bare DIR: the model runs with it; NAME=DIR: served beside the base, each picked per request.
    args.adapter, args.adapters = split_adapters(args.adapter)
    check_adapters(args, args.adapters)  # a missing folder or another base's adapter fails before serving
    if args.repo is not None and not args.repo.is_dir():
        msg = f"--repo {args.repo} is not a folder: give the repository's root folder."
        raise CommandError(msg)
    if args.no_prompt_cache and args.prompt_cache_dir is not None:
        msg = "give --prompt-cache-dir DIR or --no-prompt-cache, not both."
        raise CommandError(msg)
    in_process = args.backend == "mlx" and args.base_url is None  # other servers keep their own caches
    if in_process and not args.no_prompt_cache and args.prompt_cache_dir is None:
        args.prompt_cache_dir = default_prompt_cache_dir()  # on by default: a restart starts warm
    check_model_reachable(args)  # a hub id that cannot be had here fails now, not once the server is up
    # Bound before anything slow (the repository scan, the model): a port in use fails in one line.
    listening = _listen(args.host, args.port)
    try:
        say_what_is_shared(args.api_keys, listening, f"http://{args.host}:{listening[0].getsockname()[1]}")
        return _serve(args, listening)
    finally:
        for sock in listening:
            sock.close()


def _serve(args: argparse.Namespace, listening: list[socket.socket]) -> int:
    """Serve on ``listening`` until stopped; the model loads in a thread once the server is up."""
    import uvicorn

    from ..server import BoundedConfig, create_app

    repo = _repo_index(args.repo) if args.repo is not None else None  # scanned before serving
    failed: list[BaseException] = []

    def stop(error: BaseException) -> None:
        """The model or a served adapter failed to load: stop serving, the command fails with its reason."""
        failed.append(error)
        server.should_exit = True

    # /health says 503 until the model is ready.
    app = create_app(
        lambda: _load_engine(args),
        api_key=args.api_keys,
        parse_special_tokens=args.parse_special_tokens,
        model_name=args.model_name,
        batch_window_ms=args.batch_window_ms,
        max_body_bytes=int(args.max_body_mb * 2**20),
        repo=repo,
        prompt_lookup_num_tokens=args.prompt_lookup,
        supersede=not args.no_supersede,
        fim_mode=args.fim_mode,
        stable_prefix=not args.no_stable_prefix,
        adapters=args.adapters,
    )
    app.state.on_load_error = stop  # called in the loading thread (state.py)
    limits = ("max_connections", "request_timeout", "keep_alive_timeout")
    config = BoundedConfig(app, **picked(args, "host", "port", "log_level", *limits))
    server = uvicorn.Server(config)
    port = listening[0].getsockname()[1]
    _err(f"Serving {args.model} on http://{args.host}:{port} (/v1/completions, /infill, /health).")
    for name, folder in args.adapters.items():
        _err(f"The adapter {folder} is served as model {name!r} (/v1/models; lora ids: /lora-adapters).")
    if args.api_keys:
        _err(f"{len(args.api_keys)} API key(s), each a tenant with its own documents and prompt cache.")
    if args.prompt_cache_dir is not None:
        _err(f"Prompt caches are kept in {args.prompt_cache_dir} (--no-prompt-cache: none).")
    server.run(sockets=listening)  # no other process can take the port between the check and its use
    if failed:
        raise failed[0]
    return 0


def _listen(host: str, port: int) -> list[socket.socket]:
    """Sockets listening on ``host``:``port`` (one per address the host resolves to, as uvicorn binds),
    made before the model loads and handed to uvicorn: a port in use is one line at once, not an
    error after minutes of loading."""
    try:  # "" is every interface, as for uvicorn
        found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        msg = f"--host {host} cannot be listened on ({e.strerror}): give an address of this machine."
        raise CommandError(msg) from e
    listening: list[socket.socket] = []
    try:
        for family, address in dict.fromkeys((info[0], info[4]) for info in found):
            try:
                listening.append(socket.create_server(address, family=family))  # SO_REUSEADDR, as uvicorn
            except OSError as e:  # an IPv6 address where IPv6 is off is skipped, as asyncio skips it
                if not (family == socket.AF_INET6 and e.errno == errno.EADDRNOTAVAIL):
                    raise
        if not listening:
            raise OSError(errno.EADDRNOTAVAIL, "no address of this machine")
    except OSError as e:
        for sock in listening:
            sock.close()
        if e.errno == errno.EADDRINUSE:
            msg = f"port {port} on {host} is in use: stop what holds it, or choose another port with --port."
        else:
            msg = f"cannot listen on {host}:{port} ({e.strerror}): choose another --host or --port."
        raise CommandError(msg) from e
    return listening
