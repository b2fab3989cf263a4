"""Child processes that tests interrupt with SIGINT (Ctrl-C)."""

from __future__ import annotations

import signal
import subprocess
from typing import Any


def start_interruptible(args: list[str], **popen: Any) -> subprocess.Popen:
    """``subprocess.Popen(args, **popen)`` whose child takes SIGINT's default action (in Python:
    KeyboardInterrupt), even when this test run ignores SIGINT (``nohup pytest &``, some CI runners).

    An ignored signal stays ignored across exec, and Python then leaves it ignored; a handled one
    starts at its default. So SIGINT is handled here while the child starts.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(args, **popen)
    finally:
        signal.signal(signal.SIGINT, previous)
