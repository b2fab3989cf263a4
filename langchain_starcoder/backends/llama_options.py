"""The managed llama.cpp server's settings (:class:`LlamaCppOptions`), checked when made: a module of
their own, without httpx, so that the engine's typed options can take these fields without importing
the backend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import InvalidParameterError

#: llama-server options the managed child sets itself: it listens on the loopback only, with our key.
OWN_OPTIONS = ("--host", "--api-key", "--api-key-file")


@dataclass(frozen=True)
class LlamaCppOptions:
    """Settings of the managed llama.cpp backend (``StarCoderEngine.load(..., backend="llama.cpp")``);
    None picks from the machine and the checkpoint.

    Args:
        threads: CPU threads of llama-server (``-t``); default: the CPUs this process may use, less
            those the load average says other work keeps busy (llama.cpp's threads run in lockstep:
            one more than the free cores stalls them all).
        slots: Requests decoded together (``-np``); default: up to 4, as the memory allows.
        context: Tokens each request may hold (prompt and completion); default: StarCoder2's sliding
            window (see ``inexact_past_window``), StarCoder's training context.
        outtype: The GGUF type a checkpoint folder is converted to: "auto" keeps its precision
            (float32 -> f32, float16/bfloat16 -> f16, MLX 8-bit -> q8_0, 4-bit -> q4_0), or "f32",
            "f16", "q8_0", "q4_0". A .gguf model is served as it is.
        inexact_past_window: llama.cpp's StarCoder2 attention ignores the sliding window, so its
            answers past the window (4,096 tokens) differ from the model's. By default a request may
            hold at most the window; True allows the whole training context, inexactly past the window.
        server_args: More llama-server options, e.g. ``("--cache-ram", "0")``; ``("--port", "N")``
            pins the port (by default the child takes a free one). Its address and key are its own:
            ``--host`` and ``--api-key*`` are refused.
        startup_timeout: Seconds llama-server may take to load the model and answer ``/health``.
        cache_dir: Where converted GGUF files are kept (default: ``$LANGCHAIN_STARCODER_CACHE/gguf``,
            else ``~/.cache/langchain-starcoder/gguf``).
    """

    threads: int | None = None
    slots: int | None = None
    context: int | None = None
    outtype: str = "auto"
    inexact_past_window: bool = False
    server_args: tuple[str, ...] = ()
    startup_timeout: float = 300.0
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("threads", "slots", "context"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                msg = f"llama_cpp {name} must be a whole number >= 1 or None, not {value!r}."
                raise InvalidParameterError(msg)
        if self.outtype not in ("auto", "f32", "f16", "q8_0", "q4_0"):
            msg = f"llama_cpp outtype must be auto, f32, f16, q8_0 or q4_0, not {self.outtype!r}."
            raise InvalidParameterError(msg)
        object.__setattr__(self, "server_args", tuple(self.server_args))
        if not all(isinstance(arg, str) for arg in self.server_args):
            msg = f"llama_cpp server_args must be strings, not {self.server_args!r}."
            raise InvalidParameterError(msg)
        for option in OWN_OPTIONS:
            if option_given(self.server_args, option):
                msg = (
                    f"llama_cpp server_args may not set {option}: the managed llama-server listens on "
                    "127.0.0.1 with a key of its own. To serve a model elsewhere, run llama-server "
                    "yourself and connect to it (StarCoderEngine.connect)."
                )
                raise InvalidParameterError(msg)


def option_given(args: Sequence[str], option: str) -> bool:
    """Whether ``args`` set ``option`` (``--name value`` or ``--name=value``)."""
    return any(arg.split("=", 1)[0] == option for arg in args)
