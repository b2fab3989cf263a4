"""An editor's requests as one session: which running request a newer one supersedes (supersede.py), the
prefix whose start stays put while the editor's window slides (stable_prefix.py) and the context files'
order between keystrokes (stable_context.py), each remembered per :class:`~.supersede.Document` (a
partition's hole in one file and slot).

The HTTP server and the Jupyter extension each hold one :class:`EditorSessions`; neither's web framework is
needed here. Everything is exact: a request's prompt is built from scratch and the engine's cache serves
only its exact common prefix with an earlier one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..types import CompletionChunk, is_int
from .stable_context import ContextOrders
from .stable_prefix import StablePrefixes, keeps_all
from .supersede import Claim, Document, Documents, document_of, supersedable

if TYPE_CHECKING:
    from ..fim.build import FIMPrompt
    from ..fim.request import FIMRequest


class PromptBuilder(Protocol):
    """What a session asks of an engine: :meth:`StarCoderEngine.fim_prompt`."""

    def fim_prompt(self, request: FIMRequest, max_tokens: int) -> FIMPrompt: ...


@dataclasses.dataclass(frozen=True)
class Prepared:
    """An editor's FIM request as it is run."""

    request: FIMRequest
    """In the session's layout, its prefix extended when the window slid, with the added context (the
    server's repository), its files in the document's last order."""
    order: list[int]
    """The positions of the files (after the added context) in the order laid out: ``request``'s file
    ``k`` is the ``order[k]``-th of them."""
    prompt: FIMPrompt | None
    """Its prompt when built here (to see that an extended prefix cut nothing), else None."""


class EditorSessions:
    """The documents of an editor's requests, each partition's its own: supersession (``supersede``), the
    context order (with supersession) and the stable prefix (``stable_prefix``), in ``fim_mode``'s layout.
    Claims are made on the event loop's thread; :meth:`prepare` runs in any thread."""

    def __init__(self, *, supersede: bool = True, stable_prefix: bool = True, fim_mode: str = "psm"):
        #: Each document's running requests (None: a newer request supersedes none).
        self.documents = Documents() if supersede else None
        #: Each document's context files in their last order (None: as given).
        self.context_orders = ContextOrders() if supersede else None
        #: Each document's last prefix, which a window slid down extends (None: as sent).
        self.prefixes = StablePrefixes() if stable_prefix else None
        #: The FIM layout of the requests prepared here: "psm" or "spm".
        self.fim_mode = fim_mode

    @staticmethod
    def document(partition: str | None, path: Any, slot: Any = None) -> Document | None:
        """The document of a request of ``partition`` (None when it names neither a path nor a slot)."""
        return document_of(partition, path, slot)

    # --- supersession (on the event loop's thread) -------------------------------------------------

    def supersedes(self, document: Document | None) -> bool:
        """Whether a request for ``document`` is claimed: supersession is on and there is a document."""
        return self.documents is not None and document is not None

    def claim(self, document: Document | None, *, warm_up: bool = False) -> Claim:
        """``document`` taken by a new request, its older ones that it outranks superseded (a warm-up
        never supersedes a request that generates); release it with :meth:`release`."""
        if self.documents is None:
            return Claim(document, warm_up)  # claims nothing: never superseded
        return self.documents.claim(document, warm_up=warm_up)

    def release(self, claim: Claim) -> None:
        """``claim``'s request has ended: a newer one supersedes it no more."""
        if self.documents is not None:
            self.documents.release(claim)

    def supersedable(
        self,
        document: Document | None,
        stream: AsyncIterator[CompletionChunk],
        prompt_tokens: int | None,
        *,
        warm_up: bool = False,
    ) -> AsyncIterator[CompletionChunk]:
        """``stream`` claimed for ``document`` (:func:`~.supersede.supersedable`): a newer request
        closes it and its last chunk says cancelled."""
        return supersedable(self.documents, document, stream, prompt_tokens, warm_up=warm_up)

    # --- the prompt (any thread) ---------------------------------------------------------------------

    def prepare(
        self,
        engine: PromptBuilder,
        request: FIMRequest,
        max_tokens: Any,
        document: Document | None,
        add_context: Callable[[FIMRequest], FIMRequest] = lambda request: request,
    ) -> Prepared:
        """``request`` as it is run (:class:`Prepared`): in this session's layout, its prefix extended when
        the editor's window slid down (stable_prefix.py), with ``add_context``'s files, its files in the
        document's last order. Blocking (the prompt is built to see an extended prefix cut nothing)."""
        request = dataclasses.replace(request, mode=self.fim_mode)
        prefixes = self.prefixes
        if prefixes is None or document is None or request.notebook is not None or not is_int(max_tokens):
            return Prepared(*self._in_order(request, document, add_context), None)
        longer = prefixes.extended(document, request.prefix)
        if longer is not None:
            tried, order = self._in_order(dataclasses.replace(request, prefix=longer), document, add_context)
            prompt = engine.fim_prompt(tried, max_tokens)
            if keeps_all(prompt, tried, request.context_files):
                prefixes.remember(document, longer)
                return Prepared(tried, order, prompt)
        # As sent: no window slid, or the longer prefix would be cut (the prefix starts again from here).
        prefixes.remember(document, request.prefix)
        return Prepared(*self._in_order(request, document, add_context), None)

    def _in_order(
        self, request: FIMRequest, document: Document | None, add_context: Callable[[FIMRequest], FIMRequest]
    ) -> tuple[FIMRequest, list[int]]:
        """``request`` with ``add_context``'s files, all in the document's last order; that order."""
        request = add_context(request)
        files = request.context_files
        if self.context_orders is None:
            return request, list(range(len(files)))
        order = self.context_orders.order(document, files)
        return dataclasses.replace(request, context_files=tuple(files[i] for i in order)), order
