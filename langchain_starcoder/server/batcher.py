"""Batching: non-streamed requests with the same settings that arrive close together run as one batch."""

from __future__ import annotations

import asyncio
from typing import Any

from ..engine import StarCoderEngine
from ..errors import InvalidParameterError
from ..types import Completion


class Batcher:
    """Non-streamed requests with the same settings that arrive within ``window`` seconds of the first
    run as one engine batch (each as it would alone when greedy). Off by default: a batch does not reuse
    the prompt cache, which is what a single editor gains most from."""

    def __init__(self, window: float):
        self.window = window
        self.groups: dict[str, list[tuple[Any, asyncio.Future[Completion]]]] = {}
        self.running: set[asyncio.Task[None]] = set()  # referenced until done

    async def generate(self, engine: StarCoderEngine, prompt: Any, settings: dict[str, Any]) -> Completion:
        loop = asyncio.get_running_loop()
        key = f"{id(engine)} {sorted(settings.items())!r}"  # (each adapter's engine batches its own)
        future: asyncio.Future[Completion] = loop.create_future()
        if key not in self.groups:
            self.groups[key] = []
            loop.call_later(self.window, self._start, engine, key, settings)
        self.groups[key].append((prompt, future))
        return await future  # a client that leaves cancels its future; its row's result is dropped

    def _start(self, engine: StarCoderEngine, key: str, settings: dict[str, Any]) -> None:
        task = asyncio.ensure_future(self._run(engine, self.groups.pop(key), settings))
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    async def _run(
        self, engine: StarCoderEngine, group: list[tuple[Any, asyncio.Future[Completion]]], settings: dict
    ) -> None:
        group = [(prompt, future) for prompt, future in group if not future.done()]
        if len(group) > 1:
            try:
                done = await engine.agenerate_batch([prompt for prompt, _ in group], **settings)
            except InvalidParameterError:
                pass  # one bad prompt fails the batch: below, each runs alone for its own answer or error
            except Exception as e:  # the engine failed: every caller hears it
                for _, future in group:
                    if not future.done():
                        future.set_exception(e)
                return
            else:
                for (_, future), completion in zip(group, done, strict=True):
                    if not future.done():
                        future.set_result(completion)
                return
        for prompt, future in group:
            if future.done():
                continue
            try:
                future.set_result(await engine.agenerate(prompt, **settings))
            except Exception as e:
                if not future.done():
                    future.set_exception(e)
