"""Native work on threads of a known stack: llguidance compiles grammars by recursion, so how deep a
grammar it survives depends on the stack of the thread it runs on (8 MiB for the main thread and most
threads on Linux, 512 KiB for secondary threads on macOS, whatever a server's thread pool was given).
Run there, the bound of :mod:`.grammar_depth` holds whichever thread asks.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

#: The stack of each thread here. Address space only: the pages a compile touches become memory (a
#: grammar at :data:`.grammar_depth.MAX_DEPTH` touches about 31 MB of it), the rest never does.
STACK_BYTES = 256 << 20

_T = TypeVar("_T")
# threading.stack_size is process-wide: set, start, restore, one pool at a time.
_STACK_SIZE_LOCK = threading.Lock()


class StackThreads:
    """A few daemon threads with a :data:`STACK_BYTES` stack each, started on the first call.

    Args:
        workers: How many calls may run at once (the rest wait their turn).
        name: The threads' name (as a debugger or ``py-spy`` shows them).
    """

    def __init__(self, workers: int, name: str) -> None:
        self._workers = workers
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        self._started = False
        self._lock = threading.Lock()

    def call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` run on one of the threads; its result, or its exception raised here."""
        return self.submit(fn, *args).result()

    def submit(self, fn: Callable[..., _T], *args: Any) -> Future[_T]:
        """``fn(*args)`` queued for one of the threads."""
        self._start()
        future: Future[_T] = Future()
        self._jobs.put((future, fn, args))
        return future

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            with _STACK_SIZE_LOCK:
                before = threading.stack_size(STACK_BYTES)
                try:
                    for i in range(self._workers):
                        name = f"{self._name}-{i}"
                        threading.Thread(target=self._serve, name=name, daemon=True).start()
                finally:
                    threading.stack_size(before)
            self._started = True

    def _serve(self) -> None:
        while True:
            _run(*self._jobs.get())  # (in a call of its own: no job's result outlives it in this frame)


def _run(future: Future[Any], fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn(*args))
    except BaseException as e:  # (handed to the caller, as concurrent.futures does)
        future.set_exception(e)
