"""Partitions of the prompt cache on a server that has none: llama.cpp's ``llama-server``.

llama-server keeps one prompt cache for every request: each slot's KV, and (``--cache-ram``, on by
default) a cache in RAM that moves KV from slot to slot, matched by token prefix alone; it takes no
salt. So this backend lets a request reuse KV (``cache_prompt``) only while every request it has sent
to that server was of the request's own partition (:class:`~langchain_starcoder.types.CachePartition`).
From the first request of a second partition on, no request reuses any: each prefills its whole prompt
and the server reports 0 cached tokens, so neither KV nor a count crosses partitions. (A fresh server,
such as a managed llama-server started again, starts with a fresh :class:`SharedCache`.)
"""

from __future__ import annotations

import threading

from ...types import CachePartition
from .. import Generation

_POLL_SECONDS = 0.1  # how often a waiting request looks at its cancel flag


class SharedCache:
    """Which requests may reuse a llama-server's KV (see the module docs).

    :meth:`admit` answers for one generation before it is sent; :meth:`settle` says that its prefill
    is done (its first chunk came) or that it ended. The first request of a second partition waits
    until every reusing request sent before it has settled: the server could otherwise receive it
    first and hand its KV to one of them.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._owner: CachePartition | None = None  # the one partition sent so far
        self._mixed = False  # a second partition came: no request reuses KV any more
        self._unsettled: set[Generation] = set()  # reusing requests whose prefill may not have begun

    @property
    def mixed(self) -> bool:
        return self._mixed

    def admit(self, gen: Generation) -> bool:
        """Whether ``gen`` may reuse the server's KV (``cache_prompt``)."""
        partition = gen.params.partition
        with self._changed:
            if self._owner is None and not self._mixed:
                self._owner = partition
            if not self._mixed and partition == self._owner:
                self._unsettled.add(gen)
                return True
            self._mixed = True
            while self._unsettled and not gen.cancelled.is_set():
                self._changed.wait(_POLL_SECONDS)
            return False

    def settle(self, gen: Generation) -> None:
        """``gen``'s prefill is done, or it ended: it can no longer be handed another partition's KV."""
        with self._changed:
            if gen in self._unsettled:
                self._unsettled.discard(gen)
                self._changed.notify_all()
