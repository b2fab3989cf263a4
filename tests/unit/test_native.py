"""StackThreads: calls run on its threads, results and errors come back, and nothing is kept after."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from langchain_starcoder.backends.native import StackThreads


class Result:
    """A weakly referable result."""


def test_calls_run_on_the_threads_and_raise_in_the_caller() -> None:
    threads = StackThreads(2, "test-native")
    assert threads.call(lambda: threading.current_thread().name).startswith("test-native-")
    assert threads.call(pow, 2, 10) == 1024
    with pytest.raises(ZeroDivisionError):
        threads.call(lambda: 1 / 0)
    assert threads.submit(pow, 3, 2).result() == 9


def test_a_result_does_not_outlive_its_caller() -> None:
    """A worker kept the last result it returned (a compiled grammar: megabytes) until its next call."""
    threads = StackThreads(1, "test-native-kept")
    result = threads.call(Result)
    gone = weakref.ref(result)
    del result
    gc.collect()
    assert gone() is None
