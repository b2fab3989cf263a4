"""A script that ends with an engine still open exits cleanly: MLX aborted the interpreter at exit
("terminate called without an active exception", exit code 134) when the engine's worker was still
evaluating then."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import sys
    from langchain_starcoder import StarCoderEngine

    path, left = sys.argv[1], sys.argv[2]
    drafts = {"draft_model": path} if left == "draft model catching up" else {}
    engine = StarCoderEngine.load(path, prefill_step_size=16, **drafts)
    prompt = engine.encode("def f(x):\\n    return x + 1\\n" * 60)
    if drafts:
        # Sampling decodes plainly: after the request returns, the draft model's cache catches up
        # with the whole prompt on the worker.
        engine.generate(prompt, max_tokens=4, temperature=0.7, seed=0)
    else:
        stream = engine.stream(prompt, max_tokens=1000)
        next(stream)  # left open while the worker decodes on
    print("done", flush=True)
""")


@pytest.mark.parametrize("left", ["draft model catching up", "stream left open"])
def test_an_engine_left_open_exits_cleanly(tiny_path: Path, left: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tiny_path), left],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.stdout == "done\n", result.stderr
    assert "terminate called" not in result.stderr
    assert result.returncode == 0, result.stderr


FORKED = textwrap.dedent("""
    import os, sys, time
    from langchain_starcoder import StarCoderEngine

    engine = StarCoderEngine.load(sys.argv[1])
    child = os.fork()
    if child == 0:
        sys.exit(0)  # exit handlers run here, without the parent's worker thread
    deadline = time.monotonic() + 60
    while os.waitpid(child, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(child, 9)
            sys.exit("the forked child did not exit")
        time.sleep(0.05)
    print("done", flush=True)
""")


def test_a_forked_child_exits_without_waiting_for_the_parents_engine(tiny_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", FORKED, str(tiny_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert (result.returncode, result.stdout) == (0, "done\n"), result.stderr
