"""The tests' vLLM server (langchain_starcoder.testing.vllm_server) never outlives its caller."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from langchain_starcoder.testing.vllm_server import VLLMServer


def _alive_in_group(pgid: int) -> list[str]:
    alive = []
    for proc in psutil.process_iter(["pid", "name", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(f"{proc.pid} {proc.info['name']}")
        except (ProcessLookupError, psutil.Error):
            pass
    return alive


def test_a_head_size_vllm_cannot_run_is_refused_before_it_starts(tiny_path: Path) -> None:
    with pytest.raises(ValueError, match=r"heads of size 16; vLLM's CPU attention takes \(32, 64"):
        VLLMServer(tiny_path)


@pytest.mark.vllm
def test_a_caller_killed_outright_leaves_no_server(vllm_path: Path, pytestconfig: pytest.Config) -> None:
    """SIGKILL gives the caller no chance to stop the server (no atexit, no finally): the kernel tells
    our process in the server's group (PR_SET_PDEATHSIG), which ends the group, vLLM's engine core
    included (killing vLLM's own server process left its engine core and worker running, 3 GB)."""
    script = (
        "import os, signal, sys, time\n"
        "from pathlib import Path\n"
        "import psutil\n"
        "from langchain_starcoder.testing.vllm_server import VLLMServer\n"
        "server = VLLMServer(Path(sys.argv[1]), venv=Path(sys.argv[2]))\n"
        "server.launch()\n"
        "deadline = time.monotonic() + 90\n"  # until vLLM's engine core runs
        "names = []\n"
        "while time.monotonic() < deadline and 'VLLM::EngineCore' not in names:\n"
        "    time.sleep(0.2)\n"
        "    names = [p.name() for p in psutil.Process(server.proc.pid).children(recursive=True)]\n"
        "print(server.proc.pid, *names, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    venv = pytestconfig.rootpath / ".venv-vllm"
    caller = subprocess.run(
        [sys.executable, "-c", script, str(vllm_path), str(venv)], capture_output=True, text=True, timeout=120
    )
    assert caller.returncode == -9, caller.stderr[-2000:]
    supervisor, *names = caller.stdout.split()
    assert "VLLM::EngineCore" in names, caller.stdout
    pgid = int(supervisor)
    deadline = time.monotonic() + 30  # vLLM's shutdown, then SIGKILL after 5 s
    while alive := _alive_in_group(pgid):
        assert time.monotonic() < deadline, f"left running: {alive}"
        time.sleep(0.5)
