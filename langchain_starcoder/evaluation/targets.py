"""Targets over HTTP: a server's ``/infill`` or ``/v1/completions``, sent a hole as an editor sends it.

:func:`~langchain_starcoder.evaluation.evaluate` drives any :class:`~.runner.Target`; these are the ones
that hold a server's endpoint to the holes the way llama.vim and llama.vscode (``/infill``) or Continue
(``/v1/completions`` with ``suffix``) do: the hole's text, never a prompt built here, so the server's own
FIM layout, context handling and prompt cache are what is measured. Every answer is streamed, so the time
to the first token is the editor's. httpx does the HTTP; the rest is the two protocols' few fields.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx

from ..backends.remote import ServerError, ServerTimeoutError, ServerUnavailableError
from ..backends.remote.backend import OUR_SERVER
from ..backends.remote.errors import error_message, http_error_text, json_object
from ..errors import InvalidParameterError
from ..fim.request import FIM_MODES, FIMRequest
from ..types import DEFAULT_MAX_TOKENS, CompletionChunk

#: Seconds before a loading server (503) is asked again; doubled each time, to 2 s.
_FIRST_PAUSE = 0.25
#: Token counts remembered per target (the repository index counts the same files for every hole).
_MAX_COUNTS = 4096


class _Endpoint:
    """What both endpoints share: the client, the server's errors, ``/tokenize``, the streamed answer."""

    #: The endpoint's path under ``base_url``.
    path = ""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        model: str | None = None,
        fim_mode: str = "psm",
        fresh_documents: bool | None = None,
        count_tokens: Callable[[str], int] | None = None,
        timeout: float = 120.0,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            msg = f"base_url must be the server's http:// or https:// address, not {base_url!r}."
            raise InvalidParameterError(msg)
        if fim_mode not in FIM_MODES:
            msg = f"fim_mode must be the server's FIM layout, 'psm' or 'spm', not {fim_mode!r}."
            raise InvalidParameterError(msg)
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.fim_mode = fim_mode
        self.fresh_documents = fresh_documents
        self._count = count_tokens
        self._counts: dict[bytes, int] = {}
        self._slot = 0
        self._probed = False
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    @property
    def name(self) -> str:
        """The served model's name as given (the report's ``model``), else the endpoint's address."""
        return self.model or f"{self.base_url}{self.path}"

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> _Endpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def count_tokens(self, text: str) -> int:
        """Tokens in ``text``: ``count_tokens`` as given, else the server's ``/tokenize`` (llama.cpp's,
        this package's), control tokens parsed as the in-process engine counts them; remembered."""
        key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        if key not in self._counts:
            if len(self._counts) >= _MAX_COUNTS:
                self._counts.clear()
            if self._count is not None:
                self._counts[key] = self._count(text)
            else:
                answer = self._post_json("/tokenize", {"content": text, "parse_special": True})
                tokens = answer.get("tokens")
                if not isinstance(tokens, list):
                    msg = f"{self.base_url}/tokenize answered no tokens list; give count_tokens= instead."
                    raise ServerError(msg)
                self._counts[key] = len(tokens)
        return self._counts[key]

    def stream_infill(
        self, prefix: FIMRequest | str, suffix: str = "", **settings: Any
    ) -> Iterator[CompletionChunk]:
        """The hole's middle as the server streams it, greedily: its text, then a last chunk with
        ``finish_reason`` and the server's counts. ``settings``: ``max_tokens``, ``cache_salt``
        (sent as vLLM's and this package's field: each configuration's prompts cached apart) and
        ``temperature`` 0 (only greedy: an evaluation compares configurations on the same answers)."""
        request = prefix if isinstance(prefix, FIMRequest) else FIMRequest(prefix, suffix)
        max_tokens = settings.pop("max_tokens", DEFAULT_MAX_TOKENS)
        salt = settings.pop("cache_salt", None)
        extra = sorted(settings.keys() - {"temperature"} if settings.get("temperature", 0) == 0 else settings)
        if extra:
            msg = (
                f"An HTTP target runs greedily, with max_tokens and cache_salt only, not {', '.join(extra)}."
            )
            raise InvalidParameterError(msg)
        self._check(request)
        body = self._body(request, max_tokens)
        if salt is not None:
            body["cache_salt"] = salt
        if self._fresh():  # each hole its own document: no server memory carries from one to the next
            self._slot += 1
            body["id_slot"] = self._slot
        return self._stream(body, max_tokens)

    # --- what the protocols differ in -------------------------------------------------------------

    def _body(self, request: FIMRequest, max_tokens: int) -> dict[str, Any]:
        raise NotImplementedError

    def _chunks(self, events: Iterator[dict[str, Any]], max_tokens: int) -> Iterator[CompletionChunk]:
        raise NotImplementedError

    # --- shared ------------------------------------------------------------------------------------

    def _check(self, request: FIMRequest) -> None:
        """What an editor's request cannot carry: refused, so a configuration never runs as another."""
        if request.mode != self.fim_mode:
            msg = (
                f"{self.base_url} lays holes out as {self.fim_mode} (its --fim-mode: a request has no "
                f"field for it): a {request.mode} configuration needs a server started with --fim-mode "
                f"{request.mode}, and fim_mode={request.mode!r} here (--server-fim-mode)."
            )
            raise InvalidParameterError(msg)
        if request.max_prompt_tokens is not None:
            msg = (
                f"{self.path} has no field for max_prompt_tokens: the server fits the prompt to its own "
                "context window. Leave max_prompt_tokens unset (--max-prompt-tokens) for an HTTP target."
            )
            raise InvalidParameterError(msg)
        if request.notebook is not None or request.repo is not None:
            msg = f"{self.path} takes the hole's text and context files, not a notebook or a RepoIndex."
            raise InvalidParameterError(msg)

    def _fresh(self) -> bool:
        if self.fresh_documents is None:
            self._probe()
        return bool(self.fresh_documents)

    def _probe(self) -> None:
        """``/v1/models``, once: whether the server is this package's (whose per-document memory each hole
        leaves behind unless sent as a document of its own), and the served model's name."""
        if self._probed:
            return
        response = self._open("GET", "/v1/models", None, missing_ok=True)  # a key missing: asked again
        card: dict[str, Any] = {}  # a server without /v1/models is not this package's
        if response.status_code == 200:
            data = json_object(response.text, f"{self.base_url}/v1/models").get("data")
            card = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
        if self.fresh_documents is None:
            self.fresh_documents = card.get("owned_by") == OUR_SERVER
        if self.model is None and isinstance(card.get("id"), str):
            self.model = card["id"]
        self._probed = True

    def _stream(self, body: dict[str, Any], max_tokens: int) -> Iterator[CompletionChunk]:
        """POST ``body`` and yield its chunks; closing this generator closes the connection, which stops
        the server's generation (Ctrl-C in :func:`evaluate`)."""
        response = self._open("POST", self.path, body, stream=True)
        try:
            with self._failures(self.path):
                yield from self._chunks(self._events(response), max_tokens)
        finally:
            response.close()

    def _open(
        self, method: str, path: str, body: Any, *, stream: bool = False, missing_ok: bool = False
    ) -> httpx.Response:
        """The server's answer to one request, its status under 400 (or 404 with ``missing_ok``); a
        server still loading its model (503) is asked again for up to ``timeout`` seconds."""
        waited, pause = 0.0, _FIRST_PAUSE
        while True:
            request = self._client.build_request(method, path, json=body)
            with self._failures(path):
                response = self._client.send(request, stream=stream)
            status = response.status_code
            if status == 503 and waited < (self._client.timeout.read or 0):
                response.close()
                time.sleep(pause)
                waited, pause = waited + pause, min(2 * pause, 2.0)
                continue
            if status < 400 or (missing_ok and status == 404):
                return response
            text = response.read().decode("utf-8", "replace")
            response.close()
            raise self._http_error(response, text)

    @contextlib.contextmanager
    def _failures(self, path: str) -> Iterator[None]:
        """httpx's failures, sending or reading, as the server's errors: unreachable, silent, broken."""
        try:
            yield
        except httpx.ConnectError as e:
            msg = f"{self.base_url} could not be reached ({e}). Is the server running?"
            raise ServerUnavailableError(msg) from None
        except httpx.TimeoutException as e:
            msg = f"{self.base_url}{path} sent nothing for {self._client.timeout.read} s ({e!r})."
            raise ServerTimeoutError(msg) from None
        except httpx.HTTPError as e:
            msg = f"The connection to {self.base_url}{path} broke before a whole answer ({e!r})."
            raise ServerError(msg) from None

    def _post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return json_object(self._open("POST", path, body).text, f"{self.base_url}{path}")

    def _events(self, response: httpx.Response) -> Iterator[dict[str, Any]]:
        """The JSON objects of a server-sent-event stream; an error event raised, ``[DONE]`` the end."""
        for line in response.iter_lines():
            field, _, value = line.partition(":")
            value = value.strip()
            if field != "data" or not value:
                continue
            if value == "[DONE]":
                return
            event = json_object(value, f"{self.base_url}{self.path}")
            if "error" in event:
                msg = f"{self.base_url}{self.path} failed mid-answer: {error_message(event)}"
                raise ServerError(msg)
            yield event

    def _http_error(self, response: httpx.Response, text: str) -> ServerError:
        where = http_error_text(self.base_url, response, text)
        hint = {
            401: " Give the server's API key (api_key=, --remote-api-key).",
            403: " Give the server's API key (api_key=, --remote-api-key).",
            404: f" Is {self.base_url} the server's root, and does it serve {response.request.url.path}?",
        }.get(response.status_code, "")
        return ServerError(where + hint)


class InfillEndpoint(_Endpoint):
    """A server's ``/infill`` (this package's ``serve``, llama.cpp's ``llama-server``), sent each hole as
    llama.vim sends it: the lines before the cursor's as ``input_prefix``, the cursor's line before it
    as ``prompt``, the rest as ``input_suffix``, the repository context as ``input_extra`` files; greedy.

    ``fim_mode``: the server's FIM layout (``serve --fim-mode``; llama-server's ``--spm-infill``): a
    configuration in the other one is refused per hole. ``fresh_documents``: each hole sent as a document of
    its own (a distinct ``id_slot``), so this package's per-document memory (context order, stable prefix)
    does not carry from one hole to the next; None: so for this package's server, not for others (whose
    ``id_slot`` is one of a few slots). ``count_tokens``: the tokenizer's count (default: the server's
    ``/tokenize``), which the repository context's budget uses. A server started with ``--repo`` adds its
    own context to every hole that names its file: evaluate against one without it. ``api_key``: sent
    as ``Authorization: Bearer``; ``model``: the served model's name (default: what ``/v1/models`` says);
    ``timeout``: seconds the server may stay silent (and keep answering 503 while it loads).
    """

    path = "/infill"

    def _body(self, request: FIMRequest, max_tokens: int) -> dict[str, Any]:
        cut = request.prefix.rfind("\n") + 1  # llama.vim: the cursor's line before the cursor is the prompt
        body: dict[str, Any] = {
            "input_prefix": request.prefix[:cut],
            "prompt": request.prefix[cut:],
            "input_suffix": request.suffix,
            "input_extra": [{"filename": f.path, "text": f.text} for f in request.context_files],
            "n_predict": max_tokens,
            "temperature": 0.0,
            "stream": True,
            "cache_prompt": True,
        }
        return body | _hole_fields(request)

    def _chunks(self, events: Iterator[dict[str, Any]], max_tokens: int) -> Iterator[CompletionChunk]:
        for event in events:
            if not event.get("stop"):
                if event.get("content"):
                    yield CompletionChunk(str(event["content"]), [])
                continue
            yield _final_infill(event, max_tokens, f"{self.base_url}{self.path}")
            return
        msg = f"{self.base_url}{self.path} ended its stream without a last answer (stop: true)."
        raise ServerError(msg)


class CompletionsEndpoint(_Endpoint):
    """A server's OpenAI ``/v1/completions`` with ``suffix`` (this package's ``serve``, llama-server's),
    sent each hole as Continue sends it: ``prompt`` the code before the cursor, ``suffix`` the code after;
    greedy, streamed with ``stream_options.include_usage`` for the counts.

    The endpoint has no field for context files: a ``+repo`` configuration is refused per hole (use
    :class:`InfillEndpoint`, which sends them as ``input_extra``). The hole's ``file_path`` is sent
    (this package's field; other servers ignore it), so the prompt is the in-process engine's. The
    other options are :class:`InfillEndpoint`'s.
    """

    path = "/v1/completions"

    def _check(self, request: FIMRequest) -> None:
        super()._check(request)
        if request.context_files:
            msg = (
                "/v1/completions has no field for context files, so a +repo configuration cannot run over "
                "it (an editor sending prompt and suffix gets none): use --endpoint infill, whose "
                "input_extra carries them."
            )
            raise InvalidParameterError(msg)

    def _body(self, request: FIMRequest, max_tokens: int) -> dict[str, Any]:
        self._probe()  # the served model's name: OpenAI servers want one
        body: dict[str, Any] = {
            "prompt": request.prefix,
            "suffix": request.suffix,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.model is not None:
            body["model"] = self.model
        return body | _hole_fields(request)

    def _chunks(self, events: Iterator[dict[str, Any]], max_tokens: int) -> Iterator[CompletionChunk]:
        finish: str | None = None
        usage: dict[str, Any] = {}
        for event in events:
            if isinstance(event.get("usage"), dict):
                usage = event["usage"]
            choices = event.get("choices") or []
            choice = choices[0] if choices and isinstance(choices[0], dict) else {}
            text = choice.get("text") or ""
            if text:
                yield CompletionChunk(str(text), [])
            finish = choice.get("finish_reason") or finish
        if finish is None:
            msg = f"{self.base_url}{self.path} ended its stream without a finish_reason."
            raise ServerError(msg)
        details = usage.get("prompt_tokens_details") or {}
        yield CompletionChunk(
            "",
            [],
            finish_reason=finish,
            prompt_tokens=usage.get("prompt_tokens"),
            cached_tokens=details.get("cached_tokens") if isinstance(details, dict) else None,
            completion_tokens=usage.get("completion_tokens"),
        )


def _hole_fields(request: FIMRequest) -> dict[str, Any]:
    """The hole's file, repository name and where its middle ends, in this package's and llama.cpp's
    fields (sent only when set: a server that knows none of them runs the hole without)."""
    fields: dict[str, Any] = {}
    if request.file_path:
        fields["file_path"] = request.file_path
    if request.repo_name:
        fields["repo_name"] = request.repo_name
    if request.end != "auto":
        fields["end"] = request.end
    if request.min_indent:
        fields["n_indent"] = request.min_indent
    return fields


def _final_infill(event: dict[str, Any], max_tokens: int, where: str) -> CompletionChunk:
    """llama.cpp's last answer (``stop`` true) as the last chunk: its text, why it ended, its counts."""
    stop_type = event.get("stop_type")
    if stop_type == "cancelled":
        msg = f"{where} cancelled the answer: a newer request for the same document superseded it."
        raise ServerError(msg)
    timings = event.get("timings") or {}
    predicted = event.get("tokens_predicted", timings.get("predicted_n"))
    if stop_type == "limit":  # n_predict reached, or (n_indent, a middle ended by its lines) a stop
        finish = "length" if isinstance(predicted, int) and predicted >= max_tokens else "stop"
    elif stop_type in ("eos", "word", "middle_end", None):
        finish = "stop"
    else:
        finish = str(stop_type)
    return CompletionChunk(
        str(event.get("content") or ""),
        [],
        finish_reason=finish,
        prompt_tokens=event.get("tokens_evaluated"),
        cached_tokens=event.get("tokens_cached", timings.get("cache_n")),
        completion_tokens=predicted,
    )
