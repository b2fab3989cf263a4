"""What every wrapper shares: which checkpoint, how it loads, how it generates, and its engine.

``StarCoderLLM``, ``ChatStarCoder`` and the LlamaIndex ``StarCoder`` inherit these fields (their
defaults come from :class:`~langchain_starcoder.types.GenerationParams`) and the engine plumbing:
weights load on first use through the shared registry, never on construction.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.language_models import LangSmithParams
from langchain_core.utils import secret_from_env
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from . import _registry as registry
from ._registry import DEFAULT_MODEL
from .engine import StarCoderEngine
from .errors import InvalidParameterError
from .types import CONSTRAINT_KEYS, GENERATION_KEYS, GenerationParams

if TYPE_CHECKING:
    from typing_extensions import Self

_DEFAULTS = GenerationParams()

MODEL_CONFIG = ConfigDict(
    extra="forbid", arbitrary_types_allowed=True, protected_namespaces=(), use_attribute_docstrings=True
)


#: What LangChain's ``generate`` takes besides generation settings.
RUN_ARGS = frozenset({"callbacks", "tags", "metadata", "run_name", "run_id"})

# How a remote engine talks to its server: part of the engine's identity, not of the output's.
_CONNECTION = ("timeout", "deadline", "max_retries")


def json_schema_of(value: Any) -> Any:
    """A Pydantic model class as its JSON Schema; anything else as it is (the engine checks it)."""
    if isinstance(value, type) and issubclass(value, BaseModel):
        return value.model_json_schema()
    return value


def merge_stops(*stops: Sequence[str] | str | None) -> list[str]:
    """The stop strings of the field and of the call, in that order, without duplicates."""
    merged: list[str] = []
    for group in stops:
        for stop in [group] if isinstance(group, str) else group or ():
            if stop not in merged:
                merged.append(stop)
    return merged


class StarCoderSettings(BaseModel):
    """The fields and engine plumbing of every wrapper."""

    model_config = MODEL_CONFIG

    model: str = DEFAULT_MODEL
    """Hugging Face hub id (``mlx-community/starcoder2-3b-4bit``), a local checkpoint folder, or a
    local ``.gguf`` file (llama.cpp, Ollama)."""

    gguf_file: str | None = None
    """A GGUF file in the folder or hub repo ``model`` to load (the hub download fetches only it)."""

    quantize: Literal[4, 8] | None = None
    """4 or 8 to quantize a full-precision checkpoint while loading; None loads it as it is."""

    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    """Compute dtype. "auto": float32 on the CPU, the checkpoint's dtype on a GPU."""

    kv_bits: Literal[4, 8] | None = None
    """4 or 8 to keep the KV cache quantized (smaller, slightly less exact)."""

    adapter_path: str | None = None
    """A fine-tuning adapter's folder (LoRA, DoRA or full weights, as ``langchain-starcoder finetune``
    or ``mlx_lm.lora`` writes it), applied when the model loads (``StarCoderEngine.load``'s
    ``adapter_path``). Wrappers with different adapters use different engines."""

    prompt_cache_dir: str | None = None
    """A folder that keeps long prompt caches across processes, so a restarted notebook or editor
    reuses a repository context prefilled before (``StarCoderEngine.load``'s ``prompt_cache_dir``)."""

    max_tokens: int = _DEFAULTS.max_tokens
    """The most tokens to generate per call."""

    temperature: float = _DEFAULTS.temperature
    """Sampling temperature; 0 is greedy (deterministic)."""

    top_p: float = _DEFAULTS.top_p
    """Nucleus sampling: keep the smallest set of tokens whose probability adds up to ``top_p``."""

    top_k: int = _DEFAULTS.top_k
    """Sample among the ``top_k`` most likely tokens only; 0 turns it off."""

    min_p: float = _DEFAULTS.min_p
    """Drop tokens less likely than ``min_p`` times the most likely one; 0 turns it off."""

    repetition_penalty: float | None = _DEFAULTS.repetition_penalty
    """Penalty (> 1 discourages) for tokens seen in the last 20 tokens; None turns it off."""

    seed: int | None = _DEFAULTS.seed
    """Seed of the sampler, for reproducible sampling (``temperature > 0``)."""

    prompt_lookup_num_tokens: int | None = _DEFAULTS.prompt_lookup_num_tokens
    """Prompt-lookup speculative decoding (greedy, MLX backend): drafts of up to this many tokens
    copied from the prompt and the text so far, verified in one pass; the output is the same.
    None: where the engine measures that it pays; 0: off. Remote servers ignore it (docs/scaling-out.md)."""

    stop: list[str] | None = None
    """Stop strings: the text ends before the first one that appears. A call's ``stop`` is added
    to these (both apply)."""

    json_schema: dict[str, Any] | str | None = None
    """Constrained decoding: every answer is JSON valid against this JSON Schema (a dict, its JSON text,
    or a Pydantic model class). An answer that runs out of ``max_tokens`` first ends with
    ``finish_reason="length"``: it is incomplete, not valid. At most one of ``json_schema``, ``regex``
    and ``grammar``; a call that gives one (``invoke(p, regex=...)``) replaces this one."""

    regex: str | None = None
    """Constrained decoding: every answer matches this regular expression in full."""

    grammar: str | None = None
    """Constrained decoding: every answer is a sentence of this grammar (Lark in llguidance's dialect,
    or llama.cpp's GBNF)."""

    cache_salt: str | None = _DEFAULTS.cache_salt
    """The prompt cache's partition (vLLM's ``cache_salt``): a call reuses only cached prompts of
    calls with the same salt. Give each user of a shared engine a salt of its own."""

    streaming: bool = False
    """If True, ``invoke`` generates through the streaming path, so callbacks see every token."""

    parse_special_tokens: bool = True
    """Whether control-token strings in a text prompt (``<fim_prefix>``, ``<|endoftext|>``...) are
    control tokens, as in a hand-written prompt. Set False when prompts hold text you did not write
    (retrieved files, user input): all of it is then data. ``StarCoderPromptTemplate`` and
    ``FIMPromptTemplate`` keep their variables data either way."""

    backend: Literal["mlx", "llama.cpp"] = "mlx"
    """Where a local ``model`` runs: "mlx" in this process, or "llama.cpp": a ``llama-server`` child
    this package starts and stops (the ``llama-cpp`` extra; much faster on a Linux CPU). A folder is
    converted to GGUF once and kept in the cache (docs/scaling-out.md)."""

    base_url: str | None = None
    """The root URL of a vLLM server or a llama.cpp ``llama-server`` that serves ``model``, e.g.
    ``http://127.0.0.1:8080``: the model then runs there, and only the tokenizer, prompt building,
    stop strings and detokenization run here (docs/scaling-out.md)."""

    tokenizer: str | None = None
    """With ``base_url``: the checkpoint folder, hub id or local ``.gguf`` file to take the tokenizer
    from (default: ``model``). From the hub only tokenizer and config files are fetched, never
    weights; of a GGUF file only its header is read."""

    adapter: str | None = None
    """With ``base_url``: the name of a LoRA adapter the server serves over ``model`` (``vllm serve M
    --enable-lora --lora-modules NAME=DIR``, DIR from ``langchain-starcoder export-adapter --peft``); every
    request runs with it. A local model takes ``adapter_path`` instead."""

    api_key: SecretStr | None = Field(
        default_factory=secret_from_env("STARCODER_API_KEY", default=None), exclude=True, repr=False
    )
    """With ``base_url``: sent as a bearer token; read from ``STARCODER_API_KEY`` when not given."""

    timeout: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    """With ``base_url``: seconds the server may go without sending a token (from the request to
    the first, then between tokens); raise it for long prompts on a slow server."""

    deadline: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """With ``base_url``: seconds one request may take in all, however the server keeps it going
    (``timeout`` bounds only its silences); None: no bound."""

    max_retries: int = Field(default=2, ge=0)
    """With ``base_url``: retries, with backoff, of a connect error or a 503 before the first token."""

    given_engine: StarCoderEngine | None = Field(default=None, alias="engine", exclude=True, repr=False)
    """An already loaded :class:`StarCoderEngine` to use instead of loading ``model``
    (pass it as ``engine=``)."""

    _ls_model_type = "llm"  # LangSmith's model type: "llm" or "chat"

    @classmethod
    def is_lc_serializable(cls) -> bool:
        return True

    @property
    def lc_secrets(self) -> dict[str, str]:
        return {"api_key": "STARCODER_API_KEY"}

    @classmethod
    def get_lc_namespace(cls) -> list[str]:
        """``["langchain_starcoder", <module>]``: where LangChain's ``load`` finds the class."""
        return ["langchain_starcoder", cls.__module__.rsplit(".", 1)[-1]]

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        """LangSmith's tracing parameters of one call."""
        params = LangSmithParams(
            ls_provider="llamacpp" if self.base_url or self.backend == "llama.cpp" else "mlx",
            ls_model_name=kwargs.get("model") or self.model,
            ls_model_type=self._ls_model_type,  # type: ignore[typeddict-item]
            ls_temperature=kwargs.get("temperature", self.temperature),
            ls_max_tokens=kwargs.get("max_tokens", self.max_tokens),
        )
        stops = merge_stops(self.stop, stop)
        if stops:
            params["ls_stop"] = stops
        return params

    @field_validator("model", "prompt_cache_dir", "adapter_path", mode="before")
    @classmethod
    def _model_path_to_str(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_to_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("json_schema", mode="before")
    @classmethod
    def _model_to_schema(cls, value: Any) -> Any:
        return json_schema_of(value)

    @model_validator(mode="after")
    def _check_settings(self) -> Self:
        # Refuse bad settings at construction, before anything is loaded.
        GenerationParams.create(**self._default_generation())
        # Set away from its default (LangChain's serialization sets every truthy field, defaults too).
        changed = {k for k in self.model_fields_set if getattr(self, k) != type(self).model_fields[k].default}
        if self.base_url is not None and self.adapter_path is not None:
            msg = (
                "adapter_path loads an adapter here, but with base_url the model runs on the server: name "
                "an adapter it serves with adapter=NAME (vLLM's --enable-lora; docs/scaling-out.md), or "
                "serve the adapter merged into the weights (langchain-starcoder export-adapter --fused OUT)."
            )
            raise ValueError(msg)
        remote_only = changed & {"tokenizer", "adapter", *_CONNECTION} if self.base_url is None else set()
        local = {"quantize", "dtype", "kv_bits", "gguf_file", "prompt_cache_dir", "backend"}
        local_only = changed & local if self.base_url else set()
        if remote_only or local_only:
            which = "needs base_url" if remote_only else "applies to a local model, not to base_url"
            msg = f"{sorted(remote_only or local_only)} {which}."
            raise ValueError(msg)
        engine = self.given_engine
        if engine is not None:
            if "model" not in self.model_fields_set:
                self.model = engine.name
            elif not _same_checkpoint(self._checkpoint_name(), engine):
                msg = (
                    f"model={self.model!r} names another checkpoint than the engine given "
                    f"({engine.name}); pass only engine=, or a matching model=."
                )
                raise ValueError(msg)
            if "kv_bits" not in self.model_fields_set:
                self.kv_bits = engine.kv_bits
        return self

    # --- the engine --------------------------------------------------------------------------

    @property
    def engine(self) -> StarCoderEngine:
        """The engine that runs this model: the one given, or the shared one for these settings
        (loaded on first use; wrappers with the same model and load settings share it)."""
        return self._engine_for(None)

    def _engine_for(self, model: str | None) -> StarCoderEngine:
        if self.given_engine is not None and model in (None, self.model):
            return self.given_engine
        return registry.get_engine(model or self.model, **self._load_settings())

    async def _aengine_for(self, model: str | None) -> StarCoderEngine:
        """:meth:`_engine_for` for async code: a first load runs in a thread, off the event loop."""
        return self._loaded_engine(model) or await asyncio.to_thread(self._engine_for, model)

    def _loaded_engine(self, model: str | None = None) -> StarCoderEngine | None:
        """The engine for ``model`` (None: this wrapper's) if loaded already, else None (never loads)."""
        if self.given_engine is not None and model in (None, self.model):
            return self.given_engine
        return registry.peek_engine(model or self.model, **self._load_settings())

    def _checkpoint_name(self) -> str:
        """``model``, or the GGUF file ``gguf_file`` in it (as the engine names it)."""
        return self.model if self.gguf_file is None else f"{self.model}/{self.gguf_file}"

    def _load_settings(self) -> dict[str, Any]:
        if self.base_url is not None:  # one engine per server, model, tokenizer, key and connection
            connection = {name: getattr(self, name) for name in _CONNECTION}
            return {
                "base_url": self.base_url,
                "tokenizer": self.tokenizer,
                "adapter": self.adapter,
                "api_key": self.api_key,
                **connection,
            }
        settings = {
            "quantize": self.quantize,
            "dtype": self.dtype,
            "kv_bits": self.kv_bits,
            "gguf_file": self.gguf_file,
            "prompt_cache_dir": self.prompt_cache_dir,
            "adapter_path": self.adapter_path,
        }
        return settings if self.backend == "mlx" else {**settings, "backend": self.backend}

    # --- settings ------------------------------------------------------------------------------

    def _default_generation(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in GENERATION_KEYS}

    def _generation(self, overrides: Mapping[str, Any], stop: Sequence[str] | str | None = None) -> dict:
        """The engine keywords of one call: the fields, overridden by the call's, stops merged."""
        unknown = sorted(set(overrides) - {*GENERATION_KEYS, "parse_special_tokens"})
        if unknown:
            msg = (
                f"Unknown argument(s) {unknown} for {type(self).__name__}; a call accepts "
                f"{sorted(GENERATION_KEYS)} and parse_special_tokens."
            )
            raise InvalidParameterError(msg)
        settings = {**self._default_generation(), "parse_special_tokens": self.parse_special_tokens}
        if any(overrides.get(k) is not None for k in CONSTRAINT_KEYS):  # a call's constraint replaces ours
            settings.update(dict.fromkeys(CONSTRAINT_KEYS))
        settings.update((k, v) for k, v in overrides.items() if k != "stop")
        settings["json_schema"] = json_schema_of(settings["json_schema"])
        settings["stop"] = merge_stops(self.stop, overrides.get("stop"), stop)
        return settings

    def _call(self, stop: Sequence[str] | None, kwargs: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """The model and the engine keywords of one LangChain call (``model=`` may name another
        checkpoint)."""
        overrides = {k: v for k, v in kwargs.items() if k != "model"}
        return kwargs.get("model") or self.model, self._generation(overrides, stop)

    def _identifying_settings(self) -> dict[str, Any]:
        """The model and every setting that changes the output (LangChain's cache key uses them;
        the field ``stop`` is "default_stop": LangChain puts a call's stop under "stop")."""
        settings = {
            "model": self.model,
            # a prompt-cache folder changes how fast, never what, the model answers
            **{
                k: v
                for k, v in self._load_settings().items()
                if k not in {"api_key", "prompt_cache_dir", *_CONNECTION}
            },
            **self._default_generation(),
            "parse_special_tokens": self.parse_special_tokens,
        }
        settings["default_stop"] = settings.pop("stop")
        return settings


def _same_checkpoint(model: str, engine: StarCoderEngine) -> bool:
    path = Path(model).expanduser()
    if path.exists() and engine.path is not None:
        return path.resolve() == Path(engine.path).resolve()
    return model == engine.name
