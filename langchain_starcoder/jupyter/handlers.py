"""``POST {base_url}langchain-starcoder/complete``: the middle of the cursor's hole, streamed as NDJSON.

Jupyter's own authentication guards it (its token, or its login cookie with the XSRF token), its origin
check refuses other origins, and no CORS header is added. Each answer is ``{"text": ...}`` lines as the
tokens arrive, then ``{"done": true, "text": <the whole middle>, "finish_reason": ..., "middle_end": ...,
"prompt_tokens": ..., "cached_tokens": ...}`` (``middle_end`` "syntax" when decoding stopped where the code
says the hole is filled; ``cached_tokens``: the prompt's tokens the engine's cache already held). A
warm-up (``"warm_up": true``) only prefills its prompt and answers the done line alone, ``finish_reason``
"warm_up"; it never supersedes a request that generates, and any newer request supersedes it. A request
refused before streaming gets ``{"error": ...}`` with a 4xx/5xx status, an error after the first line an
``{"error": ...}`` line: the status and message of the editor's one map (editor/statuses.py, the HTTP
server's too), so an unexpected error is a 500 naming an id in the server's log, never its text. The
generation runs in the engine's worker (the server's event loop only waits), and stops at its next step
when the client disconnects or the same Jupyter user's newer request for the same document comes (its
answer then ends with ``finish_reason`` "superseded"; the editor session's rule): on a shared server one
user's requests never stop another's. The model, its backend and where it runs are the
server's configuration (:class:`~.config.StarCoderJupyter`), never a request's; when that model cannot be
had the answer is a 503 ``{"error": ..., "code": "no_model", "notice": ...}`` saying how to fix it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from tornado.iostream import StreamClosedError

from ..editor.statuses import status_of
from .completer import Completer, NoModelError
from .protocol import CompletionAsk, RequestError, line, parse_ask, read_body

#: Where the handler finds the server's :class:`Completer` in the tornado application's settings.
SETTINGS_KEY = "langchain_starcoder_completer"
ROUTE = ("langchain-starcoder", "complete")
NDJSON = "application/x-ndjson"


class CompleteHandler(APIHandler):
    """One completion request: checked, answered from the engine as a stream, cancelled when its
    client leaves or its user's newer request for its document supersedes it."""

    _work: asyncio.Task[None] | None = None
    _why_cancelled: str | None = None
    _gone = False

    @property
    def completer(self) -> Completer:
        return self.settings[SETTINGS_KEY]

    @tornado.web.authenticated
    async def post(self) -> None:
        try:
            ask = parse_ask(read_body(self.request.body))
        except RequestError as e:  # a client's mistake: its status and words (editor/statuses.py)
            status = status_of(e)
            self._refuse(status.status, status.message, **status.fields)
            return
        self._work = asyncio.ensure_future(self._answer(ask))
        claim = self.completer.newest(self._user(), ask.path, self.cancel, warm_up=ask.warm_up)
        try:
            await self._work
        finally:
            self.completer.ended(claim)

    def _user(self) -> str:
        """Who asks: the Jupyter user's name (jupyter_server 2's ``User``; a name or a dict before)."""
        user = self.current_user
        name = getattr(user, "username", None)
        if name is None and isinstance(user, dict):
            name = user.get("name")
        return str(name if name is not None else user)

    def on_connection_close(self) -> None:
        self._gone = True
        self.cancel("disconnected")

    def cancel(self, why: str) -> None:
        """Stop this request's generation at its next step (``why``: "disconnected" or "superseded")."""
        if self._work is not None and not self._work.done() and self._why_cancelled is None:
            self._why_cancelled = why
            self._work.cancel()

    async def _answer(self, ask: CompletionAsk) -> None:
        texts: list[str] = []
        tokens = 0
        outcome = "failed"
        stream = None
        cached = None
        try:
            engine, request, prompt = await asyncio.to_thread(self.completer.prepare, ask)
            # A warm-up runs its prompt (budgeted for max_tokens, as the requests it warms) for one token.
            settings = {"max_tokens": 1 if ask.warm_up else ask.max_tokens, "temperature": ask.temperature}
            stream = engine.astream_fim_prompt(request, prompt, **settings)
            async for chunk in stream:
                tokens += len(chunk.token_ids)
                if chunk.text and not ask.warm_up:
                    texts.append(chunk.text)
                    await self._send(line(text=chunk.text))
                if chunk.finish_reason is not None:
                    outcome = "warm_up" if ask.warm_up else chunk.finish_reason
                    cached = chunk.cached_tokens
                    done = {
                        "finish_reason": outcome,
                        "middle_end": chunk.middle_end,
                        "completion_tokens": 0 if ask.warm_up else chunk.completion_tokens,
                        "prompt_tokens": chunk.prompt_tokens,
                        "cached_tokens": cached,
                    }
                    self.finish(line(done=True, text="".join(texts), **done), set_content_type=NDJSON)
        except asyncio.CancelledError:  # our own cancel (a task cancelled from outside is the server's)
            outcome = self._why_cancelled or "cancelled"
            if outcome == "superseded" and not self._closed():
                ended = {"finish_reason": outcome, "completion_tokens": tokens}
                self.finish(line(done=True, text="".join(texts), **ended), set_content_type=NDJSON)
        except StreamClosedError:  # the client left while a line was being sent
            outcome = "disconnected"
        except Exception as e:  # the editor's one map (the HTTP server's too): no unexpected error's text
            status = status_of(e, self.log, f"langchain-starcoder's completion request {ask.request_id!r}")
            if isinstance(e, NoModelError):
                self.log.error("langchain-starcoder: %s", status.message)
            self._refuse(status.status, status.message, **status.fields)
        finally:
            if stream is not None:
                await stream.aclose()  # type: ignore[attr-defined]  # stops the engine's generation
            self.log.debug(
                "langchain-starcoder: request %r for %r ended (%s) after %d tokens (%s prompt tokens cached)",
                ask.request_id,
                ask.path,
                outcome,
                tokens,
                cached,
            )

    async def _send(self, data: bytes) -> None:
        if not self._headers_written:
            self.set_header("Content-Type", NDJSON)
            self.set_header("Cache-Control", "no-cache")
            self.set_header("X-Accel-Buffering", "no")  # a proxy in front must not hold the lines back
        self.write(data)
        await self.flush()

    def _refuse(self, status: int, message: str, **fields: Any) -> None:
        """An error: its status and body before anything was sent (with ``fields``: the ``code`` and
        ``notice`` of one the labextension tells the user about), else an ``{"error"}`` line."""
        if self._closed():
            return
        if not self._headers_written:
            self.set_status(status)
            self.finish(json.dumps({"error": message, **fields}))
        else:
            self.finish(line(error=message), set_content_type=NDJSON)

    def _closed(self) -> bool:
        return self._finished or self._gone
