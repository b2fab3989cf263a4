"""vLLM's protocol (and that of servers that speak it): ``/v1/completions`` with the ids as ``prompt``
and ``return_token_ids``, which streams each chunk's new ids (and echoes the prompt's ids once);
``stream_options.include_usage`` brings the prompt-cache hit (``cached_tokens``, when the server runs
with ``--enable-prompt-tokens-details``) in the last chunk."""

from __future__ import annotations

from typing import Any

import httpx

from ...types import GenerationParams
from .. import Generation
from .constraints import vllm_fields
from .errors import ServerError
from .protocol import ServerProtocol
from .transport import Clock, Transport


class VLLM(ServerProtocol):
    """Generations over vLLM's ``/v1/completions`` stream of token ids."""

    path = "/v1/completions"
    needs = "it needs vLLM >= 0.10.2 (return_token_ids)"

    def __init__(self, transport: Transport, vocab_size: int, model: str) -> None:
        super().__init__(transport, vocab_size)
        self._model = model

    def body(self, prompt: list[int], params: GenerationParams) -> dict[str, Any]:
        """The request: the prompt as ids, ids streamed back, our sampling settings (vLLM's
        repetition penalty looks at the whole prompt and output, not the last 20 tokens)."""
        body: dict[str, Any] = {
            "model": self._model,
            "prompt": prompt,
            "max_tokens": params.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
            "temperature": params.temperature,  # below GREEDY_BELOW already 0 (greedy)
            "top_p": params.top_p,
            "top_k": params.top_k or -1,  # -1: off, in every vLLM version
            "min_p": params.min_p,
            "repetition_penalty": params.repetition_penalty or 1.0,
            "stop_token_ids": sorted(params.stop_token_ids),
            "skip_special_tokens": False,
        }
        if params.seed is not None:  # vLLM's seeds are signed 64-bit (-1: a random one); ours unsigned
            body["seed"] = params.seed % 2**63
        if params.cache_salt is not None:  # vLLM partitions its prefix cache by it (>= 0.9)
            body["cache_salt"] = params.cache_salt
        return body | vllm_fields(params)  # the constraint, which the server enforces

    def relay(self, gen: Generation, response: httpx.Response, clock: Clock) -> None:
        """Hand each streamed id to the sink; at the server's own end, read on to the usage chunk."""
        count, cached, started, ended = 0, None, False, False
        for event in self._events(gen, response, clock, lambda: count):  # noqa: B023 (the count so far)
            usage = event.get("usage")
            if isinstance(usage, dict):
                cached = self._cached(usage, gen.prompt)
            for choice in self._choices(event):
                if not started:
                    self._check_echo(choice, gen.prompt)
                    gen.sink.start(0, prompt_seconds=None)  # vLLM does not say how long the prompt took
                    started = True
                ids = self._token_ids(choice.get("token_ids"), event, clock)
                for token in ids[: gen.params.max_tokens - count]:
                    count += 1
                    if gen.sink.token(token):
                        gen.sink.finish()  # a stop of ours: leave now, the server stops with us
                        return
                ended = ended or choice.get("finish_reason") is not None
        self._end(gen, ended, count, cached)

    def _choices(self, event: dict[str, Any]) -> list[dict[str, Any]]:
        choices = event.get("choices") or []
        if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
            msg = f"{self.base_url} streamed a chunk whose 'choices' are not objects: {str(event)[:200]}"
            raise ServerError(msg)
        return choices

    def _cached(self, usage: dict[str, Any], prompt: list[int]) -> int | None:
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return None if cached is None else self._check.number(cached, "cached_tokens", len(prompt))

    def _check_echo(self, choice: dict[str, Any], prompt: list[int]) -> None:
        """The server's echo of the prompt's ids must be the ids sent (never re-tokenized text)."""
        echoed = choice.get("prompt_token_ids")
        if echoed is not None and echoed != prompt:
            shown = len(echoed) if isinstance(echoed, list) else repr(echoed)[:50]
            msg = (
                f"{self.base_url} ran other prompt ids than were sent ({shown} for {len(prompt)}): "
                "it re-tokenized the prompt, so control-token safety would not hold."
            )
            raise ServerError(msg)
