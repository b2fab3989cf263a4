"""Building an engine's parts from its typed options (:mod:`.options`): a local checkpoint's loaders
(and a draft model's checks), and for a remote engine the tokenizer of a served checkpoint and the
byte table the remote backend rebuilds withheld ids with."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._tokens import codec_for
from ..backends import Backend
from ..errors import InvalidParameterError
from .options import LlamaCppOptions, MLXOptions, RemoteOptions

if TYPE_CHECKING:
    from ..loading.adapter import Adapter


def open_checkpoint(
    model: str | os.PathLike[str],
    settings: dict[str, Any],
    *,
    gguf_file: str | None = None,
    revision: str | None = None,
    sliding_window: int | None = None,
) -> tuple[str, Path | None, dict[str, Any], Any, Any]:
    """A checkpoint's name, folder, config, tokenizer maker and weights loader (a GGUF file brings
    its own config, tokenizer and loader); ``settings``: quantize, group_size, dtype."""
    from ..gguf_format import open_gguf
    from ..loading import load_model, load_tokenizer, read_config, resolve_model_path

    gguf = open_gguf(model, gguf_file, revision, sliding_window, settings)
    if gguf is not None:
        return gguf
    name, path = str(model), resolve_model_path(model, revision)
    config = read_config(path)
    return (
        name,
        path,
        config,
        lambda: load_tokenizer(path, config),
        lambda: load_model(path, config=config, **settings),
    )


#: From this many parameters MLX on a CPU is slow enough to say so at load. Its CPU build computes on one
#: core with a reference BLAS (about 1.7 GFLOP/s here) and a token costs about 2 FLOPs a parameter, so
#: from 1B on a token takes a second or more (the 3b shape, 4-bit: 0.2 tokens/s prefill, 0.4 decode).
SLOW_ON_CPU_PARAMETERS = 1_000_000_000


class SlowOnCPUNotice(UserWarning):
    """A big model loaded into MLX on a CPU, where ``backend="llama.cpp"`` runs it many times faster."""


def slow_on_cpu(parameters: int, on_cpu: bool) -> bool:
    """Whether MLX runs a model of ``parameters`` slowly enough to suggest llama.cpp."""
    return on_cpu and parameters >= SLOW_ON_CPU_PARAMETERS


def parameter_count(config: dict[str, Any]) -> int:
    """A checkpoint config's parameters, counted unquantized (a 4-bit weight costs its shape's work)."""
    from ..loading import model_args
    from ..loading.weights import expected_tensors

    def count(layers: int) -> int:
        args = model_args({**config, layer_key: layers})
        return sum(math.prod(shape) for shape in expected_tensors(args).values())

    # Counted from one and two layers: a config's layer count is not yet checked against its weights
    # here, and listing the tensors of an absurd count would never end.
    layer_key = "n_layer" if "n_layer" in config else "num_hidden_layers"
    layers = int(config.get(layer_key) or 1)
    one = count(1)
    return one + (layers - 1) * (count(2) - one)


def warn_if_slow_on_cpu(name: str, config: dict[str, Any]) -> None:
    """One notice at load when MLX would run this model on the CPU at a second or more a token,
    naming the fast path (a Linux user meets the slowness here, not in the docs)."""
    import mlx.core as mx

    from ..gguf_format.write import INSTALL_HINT

    parameters = parameter_count(config)
    if slow_on_cpu(parameters, mx.default_device() == mx.cpu):
        msg = (
            f"{name} has {parameters / 1e9:.1f}B parameters and MLX runs it on the CPU here, on one core: "
            "expect a second or more per token (the 3b model: 0.2 tokens/s prefill, 0.4 decode). "
            'backend="llama.cpp" (--backend llama.cpp) runs it on every core, 10-30x faster; it needs '
            f"the llama-cpp extra: {INSTALL_HINT}."
        )
        if _reference_blas_float32(config):
            msg += (
                " To stay on MLX, load OpenBLAS: its float32 prefill is up to 43x faster "
                "(pip install -e '.[openblas]', then LANGCHAIN_STARCODER_BLAS=openblas before Python starts)."
            )
        warnings.warn(msg, SlowOnCPUNotice, stacklevel=2)


def _reference_blas_float32(config: dict[str, Any]) -> bool:
    """Whether MLX's float32 matmuls of this unquantized float32 checkpoint run on the Linux CPU build's
    reference BLAS (an optimized one is opt-in: langchain_starcoder._blas)."""
    from .._blas import active_blas

    float32 = config.get("torch_dtype", "float32") == "float32" and "quantization" not in config
    return sys.platform == "linux" and float32 and active_blas() is None


def check_same_vocabulary(
    names: tuple[str, str], tokenizers: tuple[Any, Any], sizes: tuple[int, int]
) -> None:
    """A draft model must spell every token with the id the model uses, over the same id range."""
    (name, draft_name), (tokenizer, draft_tokenizer) = names, tokenizers
    if sizes[0] != sizes[1]:
        msg = (
            f"The draft model {draft_name} has {sizes[1]} token ids and {name} has {sizes[0]}; a draft "
            "model must share the model's vocabulary (starcoder2-3b drafts for starcoder2-15b)."
        )
        raise InvalidParameterError(msg)
    if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
        ours, theirs = tokenizer.get_vocab(), draft_tokenizer.get_vocab()
        differ = sorted(t for t in ours.keys() | theirs.keys() if ours.get(t) != theirs.get(t))
        msg = (
            f"The draft model {draft_name} has another vocabulary than {name} ({len(theirs)} tokens "
            f"against {len(ours)}; {len(differ)} differ, e.g. {differ[:3]}). A draft model must share "
            "the model's tokenizer, as StarCoder2's sizes do (starcoder2-3b drafts for starcoder2-15b)."
        )
        raise InvalidParameterError(msg)


def connect_backend(base_url: str, *, model: str, options: RemoteOptions) -> tuple[Backend, Any]:
    """The backend of a vLLM or llama.cpp server and the tokenizer of its model."""
    from ..backends.remote import RemoteBackend
    from ..loading import load_tokenizer, model_args, read_config

    source = model if options.tokenizer is None else options.tokenizer
    from ..gguf_format import gguf_tokenizer, is_gguf, read_gguf

    if is_gguf(source, None) and os.path.isfile(source):
        gguf = read_gguf(source)  # its header: the tokenizer and config, not the weights
        config, tokenizer_ = gguf.config, gguf_tokenizer(gguf)
    else:
        path = _tokenizer_folder(source)
        config = read_config(path)
        tokenizer_ = load_tokenizer(path, config)
    args = model_args(config)
    # The options but the tokenizer are the backend's keywords, under the same names.
    settings = {
        f.name: getattr(options, f.name) for f in dataclasses.fields(options) if f.name != "tokenizer"
    }
    backend = RemoteBackend(
        base_url,
        model=model,
        vocab_size=args.vocab_size,
        context_length=args.max_position_embeddings,
        token_bytes=_token_bytes(tokenizer_),
        sliding_window=getattr(args, "sliding_window", None),
        **settings,
    )
    return backend, tokenizer_


def llama_cpp_backend(model: str | os.PathLike[str], options: LlamaCppOptions) -> tuple[Backend, Any]:
    """The managed llama.cpp backend (a llama-server child) of a checkpoint folder, hub id or GGUF
    file, and its tokenizer; a folder is converted to GGUF once and kept in the cache."""
    from ..backends.managed_llama import LlamaServerProcess, ManagedLlamaBackend
    from ..gguf_format import is_gguf, llama_binary, read_gguf, resolve_gguf_file
    from ..gguf_format.cache import cached_gguf
    from ..loading import model_args, read_config, resolve_model_path

    binary = llama_binary("llama-server")  # missing: say how to install it, before converting
    if is_gguf(model, options.gguf_file):
        gguf = Path(resolve_gguf_file(model, options.gguf_file, options.revision))
        config, folder = read_gguf(gguf).config, None
    else:
        folder = resolve_model_path(model, options.revision)
        config = read_config(folder)
        outtype = _auto_outtype(config) if options.outtype == "auto" else options.outtype
        cache = None if options.cache_dir is None else Path(options.cache_dir)
        gguf = cached_gguf(folder, outtype, cache)
    args = model_args(config)
    window = getattr(args, "sliding_window", None)
    exact = window if window and not options.inexact_past_window else None
    context = options.context or exact or args.max_position_embeddings
    if exact is not None and context > exact:
        msg = (
            f"llama_cpp context={context} is past StarCoder2's {exact}-token sliding window, which "
            "llama.cpp ignores (answers past it differ from the model's): use at most the window, or "
            "set inexact_past_window=True to allow it."
        )
        raise InvalidParameterError(msg)
    lora, adapter = _gguf_adapter(options, gguf)
    threads = options.threads or _idle_cpus()
    slots = options.slots or _slots(args, context)
    alias = Path(os.fspath(model)).name or "model"
    server = LlamaServerProcess(
        binary,
        gguf,
        alias=alias,
        threads=threads,
        slots=slots,
        context=context,
        server_args=options.server_args,
        startup_timeout=options.startup_timeout,
        lora=lora,
    )
    source = gguf if folder is None else folder
    tokenizers: list[Any] = []

    def connect(url: str, api_key: str) -> Any:
        remote_options = RemoteOptions(
            tokenizer=source,
            api_key=api_key,
            timeout=600.0,
            max_retries=0,
            max_concurrency=max(16, slots),
            inexact_past_window=options.inexact_past_window,
        )
        remote, tokenizer = connect_backend(url, model=alias, options=remote_options)
        tokenizers.append(tokenizer)
        return remote

    backend = ManagedLlamaBackend(
        server, connect, name=str(model), path=folder, sliding_window=window, adapter=adapter
    )
    return backend, tokenizers[0]


def _gguf_adapter(options: LlamaCppOptions, gguf: Path) -> tuple[tuple[Path, ...], Any]:
    """The adapter as llama.cpp's GGUF adapter for ``gguf`` (converted once, cached by its digest; the base
    is never converted again per adapter), for ``--lora``; DoRA and full weights: an error naming --fused."""
    if options.adapter_path is None:
        return (), None
    from ..gguf_format.lora import cached_adapter_gguf
    from ..loading.adapter import read_adapter

    adapter = read_adapter(options.adapter_path)
    cache = None if options.cache_dir is None else Path(options.cache_dir)
    return (cached_adapter_gguf(adapter, gguf, cache),), adapter


def _auto_outtype(config: dict[str, Any]) -> str:
    """The GGUF type that keeps a checkpoint's precision: f32, f16, or its MLX quantization's bits."""
    quantization = config.get("quantization")
    if isinstance(quantization, dict):
        return "q8_0" if quantization.get("bits") == 8 else "q4_0"
    return "f32" if config.get("torch_dtype", "float32") == "float32" else "f16"


def _idle_cpus() -> int:
    """The CPUs this process may use, less those other work keeps busy (the load average): llama.cpp's
    threads run in lockstep, so one waiting for a core stalls them all (on 2 cores at a load of 9,
    2 threads decoded 0.08 tokens/s, 1 thread 3.3)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    try:
        busy = os.getloadavg()[0]
    except OSError:
        busy = 0.0
    return max(1, min(cpus, int(cpus + 1 - busy)))


def _slots(args: Any, context: int) -> int:
    """Up to 4 requests at once, as many as a quarter of the free memory holds KV caches for
    (float16 keys and values of ``context`` tokens in every layer)."""
    per_slot = context * args.num_hidden_layers * 2 * args.num_key_value_heads * args.head_dim * 2
    try:
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        free = 8 << 30
    return max(1, min(4, free // 4 // per_slot))


#: The files a remote engine needs from the hub: the tokenizer and configs, never weights.
_TOKENIZER_PATTERNS = ["*.json", "*.txt", "*.jinja", "tokenizer.model"]


def _tokenizer_folder(source: str | os.PathLike[str]) -> Any:
    """A local folder as it is; a hub id's tokenizer and config files, downloaded (and cached)."""
    from ..errors import ModelNotFoundError
    from ..loading import is_hub_id

    path = Path(source).expanduser()
    if path.is_dir():
        return path
    name = os.fspath(source)
    if path.exists() or not is_hub_id(name):
        msg = (
            f"The tokenizer comes from a checkpoint folder or a hub id (owner/name); {name!r} is "
            "neither. Pass tokenizer= with the served model's checkpoint folder or hub id."
        )
        raise ModelNotFoundError(msg)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, allow_patterns=_TOKENIZER_PATTERNS))
    except Exception as e:  # the hub client raises many types; ours says which model, why, what to do
        from huggingface_hub.errors import LocalEntryNotFoundError

        from ..loading.hub import download_error

        if isinstance(e, LocalEntryNotFoundError):
            why = "the hub cannot be reached (or HF_HUB_OFFLINE is set) and its files are not cached here"
        else:
            why = str(download_error(e, name, None)).rstrip(".")
        msg = (
            f"Could not fetch the tokenizer of {name!r} from the hub: {why}. Pass tokenizer= (--tokenizer "
            "on the command line) with the served model's checkpoint folder (its tokenizer and config "
            "files are enough) or its .gguf file."
        )
        raise ModelNotFoundError(msg) from None


def _token_bytes(tokenizer: Any) -> dict[bytes, int] | None:
    """Each non-control token's bytes -> its id, for a byte-level BPE vocabulary (else None)."""
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, _byte_decoder

    if not isinstance(tokenizer.detokenizer, BPEStreamingDetokenizer):
        return None
    codec = codec_for(tokenizer)
    decoder, special = _byte_decoder(), {codec.token_id(t) for t in codec.control_tokens}
    table: dict[bytes, int] = {}
    for token, i in tokenizer.get_vocab().items():
        if i not in special and all(c in decoder for c in token):
            table.setdefault(bytes(decoder[c] for c in token), i)
    return table


def mlx_backend(model: str | os.PathLike[str], options: MLXOptions) -> tuple[Backend, Any]:
    """The in-process MLX backend of a checkpoint (and of its draft model) and its tokenizer."""
    from ..backends.mlx import MLXBackend, kv_group_size
    from ..loading import model_args
    from ..loading.adapter import read_adapter

    cache_dir = _prompt_cache_dir(options.prompt_cache_dir)
    settings = {"quantize": options.quantize, "group_size": options.group_size, "dtype": options.dtype}
    name, path, config, make_tokenizer, loader = open_checkpoint(
        model,
        settings,
        gguf_file=options.gguf_file,
        revision=options.revision,
        sliding_window=options.sliding_window,
    )
    kv_group_size(model_args(config), options.kv_bits)  # refuse a bad kv_bits before loading
    adapter = None
    if options.adapter_path is not None:
        adapter = read_adapter(options.adapter_path)  # a missing or damaged one fails before the weights load
        loader = partial(_adapted, loader, adapter, name)
    warn_if_slow_on_cpu(name, config)  # before the weights load: that alone takes a minute at 3B
    tokenizer = make_tokenizer()  # before the weights: a broken tokenizer fails fast
    front_key = {"tokenizer": _tokenizer_fingerprint(tokenizer), **settings} if cache_dir else None
    draft = None
    if options.draft_model is not None:
        draft_settings = {**settings, "quantize": None}
        draft_name, _, draft_config, make_draft_tokenizer, draft = open_checkpoint(
            options.draft_model, draft_settings
        )
        sizes = (model_args(config).vocab_size, model_args(draft_config).vocab_size)
        check_same_vocabulary((name, draft_name), (tokenizer, make_draft_tokenizer()), sizes)
    backend = MLXBackend(
        loader,
        name=name,
        path=path,
        kv_bits=options.kv_bits,
        max_prompt_caches=options.max_prompt_caches,
        max_prompt_cache_bytes=options.max_prompt_cache_bytes,
        prefill_step_size=options.prefill_step_size,
        prompt_cache_dir=cache_dir,
        max_prompt_cache_dir_bytes=options.max_prompt_cache_dir_bytes,
        prompt_cache_key=front_key,
        draft=draft,
        num_draft_tokens=options.num_draft_tokens,
        adapter=adapter,
    )
    return backend, tokenizer


def _adapted(load: Callable[[], Any], adapter: Adapter, name: str) -> Any:
    """The model ``load`` loads, with ``adapter`` applied (on the backend's worker, as the load is)."""
    from ..loading.adapter import apply_adapter

    loaded = load()
    apply_adapter(loaded.model, loaded.args, adapter, name)
    return loaded


def adapted_backend(backend: Backend, adapter_path: str | os.PathLike[str]) -> Backend:
    """A backend on ``backend``'s base with the adapter in ``adapter_path`` (StarCoderEngine.with_adapter);
    the adapter is read and checked before any work, and a backend that cannot share its base refused.
    Managed llama.cpp: the adapter as llama.cpp's GGUF adapter of the base's GGUF (converted once, cached)."""
    from ..backends.managed_llama import ManagedLlamaBackend
    from ..loading.adapter import read_adapter

    if isinstance(backend, ManagedLlamaBackend):
        from ..gguf_format.lora import cached_adapter_gguf

        adapter = read_adapter(adapter_path)
        return backend.with_adapter(adapter, cached_adapter_gguf(adapter, backend.server.gguf))
    make = getattr(backend, "with_adapter", None)
    if make is None:
        msg = (
            f"{type(backend).__name__} cannot apply an adapter here: a remote server applies its own (vLLM: "
            "--enable-lora --lora-modules NAME=DIR, then connect(..., adapter=NAME)). Load the model with "
            'backend="mlx" or "llama.cpp" to add adapters to it.'
        )
        raise InvalidParameterError(msg)
    return make(read_adapter(adapter_path))


def _prompt_cache_dir(folder: str | os.PathLike[str] | None) -> Path | None:
    """The prompt-cache folder as an absolute path; a path that is a file is refused."""
    if folder is None:
        return None
    path = Path(folder).expanduser().absolute()
    if path.exists() and not path.is_dir():
        msg = f"prompt_cache_dir={os.fspath(folder)!r} is a file; give a folder (it is made if missing)."
        raise InvalidParameterError(msg)
    return path


def _tokenizer_fingerprint(tokenizer: Any) -> str:
    """What shapes the token ids a kept cache is keyed by: the vocabulary and the end ids."""
    from ..backends.prompt_cache import vocab_fingerprint

    return vocab_fingerprint(tokenizer.get_vocab(), sorted(tokenizer.eos_token_ids))
