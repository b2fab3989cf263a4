"""The worker threads MLX backends run on: one per backend, kept for the next one when it closes."""

from __future__ import annotations

import queue
import threading

# MLX aborts the process at exit if a thread that ran MLX work has ended, is still evaluating, or is
# woken while Python shuts down. So worker threads never end, are idle by then (backends still open
# are closed at exit: see mlx.py) and are never woken: a closed backend's worker waits on its retired
# queue until a new backend hands it a queue of its own.
_pool_lock = threading.Lock()
_idle_queues: list[queue.SimpleQueue] = []


def _serve(jobs: queue.SimpleQueue) -> None:
    while True:
        job = jobs.get()
        if isinstance(job, queue.SimpleQueue):  # handed over to a new backend
            jobs = job
        else:
            job()
        del job  # hold no reference to the backend between jobs, so it can be collected


def start_worker(jobs: queue.SimpleQueue) -> None:
    """Serve ``jobs`` on an idle worker thread, or on a new one."""
    with _pool_lock:
        if _idle_queues:
            _idle_queues.pop().put(jobs)
            return
    threading.Thread(target=_serve, args=(jobs,), name="starcoder-engine", daemon=True).start()


def retire_worker(jobs: queue.SimpleQueue) -> None:
    with _pool_lock:
        _idle_queues.append(jobs)
