"""``serve --adapter``: one bare ``DIR`` (the model runs with it, as before) or several ``NAME=DIR``, each
served beside the base under its name; read and checked against the model before the port is bound."""

from __future__ import annotations

import argparse
from pathlib import Path

from .output import CommandError

#: What a named adapter looks like on the command line.
NAMED = "--adapter NAME=DIR"


def split_adapters(values: list[str] | None) -> tuple[Path | None, dict[str, Path]]:
    """The values of ``--adapter`` (repeated): a bare folder given alone, or adapters by name. A value is
    ``NAME=DIR`` when it has an ``=`` and is not itself a folder (a folder's name may hold one)."""
    bare: list[Path] = []
    named: dict[str, Path] = {}
    for value in values or []:
        name, equals, folder = value.partition("=")
        if not equals or Path(value).is_dir():
            bare.append(Path(value))
            continue
        name = name.strip()
        if not name or not folder:
            msg = f"--adapter {value!r}: give NAME=DIR (a name to request it by, and the adapter's folder)."
            raise CommandError(msg)
        if name in named:
            twice = f"{named[name]} and {folder}"
            msg = f"--adapter names {name!r} twice ({twice}): give each adapter a name of its own."
            raise CommandError(msg)
        named[name] = Path(folder)
    if bare and (named or len(bare) > 1):
        msg = (
            f"--adapter {bare[0]} has no name: one adapter alone may be given as DIR (the model runs with "
            f"it); several are each given a name ({NAMED}), by which a request picks one."
        )
        raise CommandError(msg)
    return (bare[0] if bare else None), named


def check_adapters(args: argparse.Namespace, named: dict[str, Path]) -> None:
    """Each named adapter read (a missing or damaged folder fails here) and, for a local model (a folder
    or a .gguf file), checked against its config: an adapter of another base fails before serving."""
    if not named:
        return
    if args.base_url is not None:
        msg = (
            f"{NAMED} serves adapters on a model loaded here; a --base-url server applies its own (vLLM: "
            "--enable-lora --lora-modules NAME=DIR)."
        )
        raise CommandError(msg)
    if args.model_name is not None and args.model_name in named:
        msg = f"--adapter {args.model_name}=... has the base model's name (--model-name): give it another."
        raise CommandError(msg)
    from ..loading.adapter import check_base, read_adapter

    adapters = {name: read_adapter(folder) for name, folder in named.items()}
    unrunnable = [a for a in adapters.values() if a.fine_tune_type != "lora"]
    if args.backend == "llama.cpp" and unrunnable:  # (llama.cpp's adapters are LoRA's: others merge)
        adapter = unrunnable[0]
        msg = (
            f"The adapter {adapter.path} is {adapter.fine_tune_type}, which llama.cpp cannot run: merge it "
            "(langchain-starcoder export-adapter --fused OUT) and serve OUT, or serve it on MLX."
        )
        raise CommandError(msg)
    config = _local_config(args)
    if config is None:
        return  # a hub id's config is read when it loads, where the adapter is checked again
    from ..loading import model_args

    for adapter in adapters.values():
        check_base(adapter, model_args(config), str(args.model))


def _local_config(args: argparse.Namespace) -> dict | None:
    """The config of a model at hand: a checkpoint folder, a .gguf file, or a hub id whose config.json is in
    the local hub cache (nothing is downloaded here); else None."""
    from ..loading import is_hub_id, read_config

    model = Path(args.model).expanduser()
    if model.is_dir() and (model / "config.json").is_file():
        return read_config(model)
    if model.is_file() and model.suffix == ".gguf":
        from ..gguf_format import read_gguf

        return read_gguf(model).config
    if model.exists() or not is_hub_id(str(args.model)) or args.gguf_file is not None:
        return None
    from huggingface_hub import hf_hub_download

    try:
        config = hf_hub_download(
            str(args.model), "config.json", revision=args.revision, local_files_only=True
        )
    except Exception:  # not cached (or a damaged cache): the adapter is checked when the model loads
        return None
    return read_config(Path(config).parent)
