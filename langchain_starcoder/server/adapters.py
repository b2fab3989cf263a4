"""Adapters served beside the base model (``serve --adapter NAME=DIR``), and which one a request runs.

Each adapter is an engine on the base's weights (:meth:`StarCoderEngine.with_adapter`: on MLX the same
arrays, its own prompt caches). A request picks one as vLLM's LoRA serving does, by OpenAI's ``model`` field
(``/v1/models`` lists the base and each adapter with ``parent``: the base), or as llama-server does, by
llama.cpp's ``lora`` field (``[{"id": i, "scale": s}]``, ids in the order the adapters were given, which
``GET /lora-adapters`` lists). An adapter runs whole or not at all: scale 1 of one adapter selects it, all
scales 0 (or no field) the base; a fraction or two at once are refused (no engine here mixes them).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine import StarCoderEngine
from ..errors import InvalidParameterError
from ..types import is_int
from .errors import APIError, bad_request

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """What a request runs on: the engine, the model name its answers carry, and the adapter's name
    (None: the base)."""

    engine: StarCoderEngine
    name: str
    adapter: str | None = None

    def documents(self, partition: str | None) -> str | None:
        """The partition of the request's documents (supersession, stable prefix): an adapter's are its
        own, so a request to one model never cancels one to another."""
        return partition if self.adapter is None else f"{partition or ''}\0adapter\0{self.adapter}"


class ServedAdapters:
    """The adapters a server serves by name (their folders until :meth:`build` makes their engines)."""

    def __init__(self, folders: Mapping[str, str | os.PathLike[str]] | None):
        folders = dict(folders or {})
        for name, folder in folders.items():
            if not isinstance(name, str) or not name.strip() or name != name.strip():
                msg = (
                    f"An adapter's name must be a non-empty string without surrounding spaces, not {name!r}."
                )
                raise InvalidParameterError(msg)
            if not isinstance(folder, str | os.PathLike):
                msg = f"The adapter {name!r} must be given as its folder, not {type(folder).__name__}."
                raise InvalidParameterError(msg)
        self.folders = {name: Path(folder) for name, folder in folders.items()}
        self.engines: dict[str, StarCoderEngine] = {}

    def __bool__(self) -> bool:
        return bool(self.folders)

    def build(self, base: StarCoderEngine, base_name: str) -> None:
        """Each adapter's engine on ``base``; one that fails closes those made before it and raises."""
        if base_name in self.folders:
            msg = f"The adapter name {base_name!r} is the base model's name: give the adapter another name."
            raise InvalidParameterError(msg)
        try:
            for name, folder in self.folders.items():
                self.engines[name] = base.with_adapter(folder)
                logger.info("Serving the adapter %s (%s) as model %r.", folder, base.name, name)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for engine in self.engines.values():
            engine.close()
        self.engines.clear()

    # --- which model a request runs --------------------------------------------------------------------

    def by_model(self, base: Served, body: dict[str, Any]) -> Served:
        """OpenAI's ``model`` field: the base's name (or none) runs the base, an adapter's name that adapter;
        another name is a 404 naming the models there are (as vLLM answers). A server without adapters
        runs the base whatever the field says, as it always has."""
        if body.get("lora") not in (None, []):  # (llama-server's field: not silently ignored here)
            msg = (
                "On /v1 endpoints a request picks an adapter by model (GET /v1/models); lora is for /infill."
            )
            raise bad_request(msg, "lora")
        model = body.get("model")
        if not self or model is None or model == base.name:
            return base
        if isinstance(model, str) and model in self.engines:
            return Served(self.engines[model], model, model)
        there = ", ".join(f"`{name}`" for name in [base.name, *self.engines])
        msg = f"The model `{model}` does not exist here; this server has {there} (GET /v1/models lists them)."
        raise APIError(404, msg, param="model", code="model_not_found")

    def by_lora(self, base: Served, body: dict[str, Any]) -> Served:
        """llama.cpp's ``lora`` field: ``[{"id": i, "scale": s}]`` (a missing id: scale 0). Scale 1 of one
        adapter runs it, all 0 the base; anything else is a 400 saying what is supported."""
        lora = body.get("lora")
        if lora is None:
            return base
        shape = (
            'lora must be a list of {"id": adapter id, "scale": number} (GET /lora-adapters lists the ids).'
        )
        if not isinstance(lora, list):
            raise bad_request(shape, "lora")
        names = list(self.engines)
        scales: dict[int, float] = {}
        for entry in lora:
            if not isinstance(entry, dict) or not is_int(entry.get("id")):
                raise bad_request(shape, "lora")
            scale = entry.get("scale", 0.0)
            if isinstance(scale, bool) or not isinstance(scale, int | float):
                raise bad_request(shape, "lora")
            if not 0 <= entry["id"] < len(names):
                ids = f"ids 0 to {len(names) - 1}" if names else "none"
                msg = f"invalid adapter id {entry['id']}: the adapters here have {ids} (GET /lora-adapters)."
                raise bad_request(msg, "lora")
            scales[entry["id"]] = float(scale)  # (a repeated id: the last wins, as in llama-server)
        on = {i: s for i, s in scales.items() if s != 0.0}
        if not on:
            return base
        if len(on) == 1 and next(iter(on.values())) == 1.0:
            name = names[next(iter(on))]
            return Served(self.engines[name], base.name, name)
        asked = "several adapters at once" if len(on) > 1 else "a scale other than 1"
        msg = (
            f"lora {lora} asks for {asked}: this server runs one adapter whole (scale 1, the others 0) "
            "or the base (all scales 0, or no lora), not adapters mixed or scaled."
        )
        raise bad_request(msg, "lora")

    # --- what the listings show -----------------------------------------------------------------------

    def lora_adapters(self) -> list[dict[str, Any]]:
        """llama-server's ``GET /lora-adapters``: each adapter's id, path and scale (0: a request without
        ``lora`` runs the base)."""
        return [
            {"id": i, "path": str(folder), "scale": 0.0} for i, folder in enumerate(self.folders.values())
        ]
