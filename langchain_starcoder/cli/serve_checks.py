"""What ``serve`` settles before it binds its port: the API keys (tenants), whether the model can be had
here, and what to say when the server is reachable from other machines without a key."""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
from pathlib import Path

from ..loading.hub import download_error, is_hub_id
from .options import API_KEY_ENV
from .output import CommandError, _err

#: Seconds to wait for the hub's answer about a model that is not in the local hub cache.
HUB_PROBE_TIMEOUT = 10.0


def api_keys(args: argparse.Namespace) -> list[str]:
    """The keys of ``--api-key`` (repeated) and ``--api-key-file``; without either, ``$API_KEY_ENV`` if
    set; else none (one tenant)."""
    keys = list(args.api_key or [])
    if args.api_key_file is not None:
        keys += read_key_file(args.api_key_file)
    if not keys and os.environ.get(API_KEY_ENV):
        keys.append(os.environ[API_KEY_ENV])
    if any(not key.strip() for key in keys):
        msg = "an API key is empty or only spaces: give each key its text (--api-key KEY)."
        raise CommandError(msg)
    return list(dict.fromkeys(key.strip() for key in keys))


def read_key_file(path: Path) -> list[str]:
    """One key per line; blank lines and lines starting with ``#`` are skipped (llama-server's
    ``--api-key-file`` reads a list too). A file that holds no key is an error: it would serve everyone."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        msg = f"--api-key-file {path} cannot be read ({getattr(e, 'strerror', None) or e})."
        raise CommandError(msg) from e
    keys = [line.strip() for line in text.splitlines()]
    keys = [key for key in keys if key and not key.startswith("#")]
    if not keys:
        msg = f"--api-key-file {path} holds no key: write one key per line (# starts a comment)."
        raise CommandError(msg)
    return keys


def say_what_is_shared(keys: list[str], listening: list[socket.socket], url: str) -> None:
    """Without a key, on an address other machines reach, say what any client sees of another's."""
    if keys or all(_loopback(sock) for sock in listening):
        return
    _err(
        f"No --api-key: every client that reaches {url} is one tenant, so any of them can see another's "
        "work: the lines above its cursor that another sent for the same file_path or id_slot (the stable "
        "prefix, when its window matches the other's last lines), cancel another's request for that "
        "document (supersession), and tell which text another has sent from the prompt cache's counts "
        "(tokens_cached, timings.cache_n, usage cached_tokens) and timing. Give each user a key of their "
        "own (--api-key, repeated, or --api-key-file) to keep them apart (docs/security.md)."
    )


def _loopback(sock: socket.socket) -> bool:
    host = sock.getsockname()[0]
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


def check_model_reachable(args: argparse.Namespace) -> None:
    """Fail at once, before binding, when ``--model`` is a hub id that is not in the local hub cache and
    the hub cannot be reached: the server would otherwise start, then stop when its loader fails. The
    examples and Jupyter fall back to a checkpoint with random weights; serve says how to make one."""
    model = str(args.model)
    if args.base_url is not None or Path(model).expanduser().exists() or not is_hub_id(model):
        return  # a remote server's name, or a local path (whose errors the loader says)
    from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        if args.gguf_file is not None:
            hf_hub_download(model, args.gguf_file, revision=args.revision, local_files_only=True)
        else:
            snapshot_download(model, revision=args.revision, local_files_only=True)
        return  # in the local hub cache
    except LocalEntryNotFoundError:
        pass
    except Exception:  # a damaged cache and the like: the loader says it in its own words
        return
    if constants.HF_HUB_OFFLINE:
        raise CommandError(_offline_message(model, "HF_HUB_OFFLINE is set"))
    try:
        HfApi().model_info(model, revision=args.revision, timeout=HUB_PROBE_TIMEOUT)
    except (GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError) as e:  # the hub said no
        raise CommandError(str(download_error(e, model, args.revision))) from None
    except Exception as e:  # no answer: offline, or the hub is down
        why = f"the hub cannot be reached ({type(e).__name__})"
        raise CommandError(_offline_message(model, why)) from None


def _offline_message(model: str, why: str) -> str:
    return (
        f"--model {model} is a hub id that is not in the local hub cache, and {why}: serve would stop once "
        "it tried to load it. Connect once to download it, or serve a local checkpoint. The examples and "
        "Jupyter fall back to one with random weights (nonsense output, every step real); to serve such a "
        "checkpoint, build it with `langchain-starcoder build-test-model ./tiny` and run "
        "`langchain-starcoder serve --model ./tiny`."
    )
