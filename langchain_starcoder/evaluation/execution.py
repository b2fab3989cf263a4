"""``--exec CMD``: a completion judged by running the repository's own tests with it in place (pass@1, as
ExecRepoBench and SAFIM judge theirs).

The repository is copied once per evaluation into a temporary folder; for each run the hole's file in the
copy gets the text in place of the true middle, CMD runs through the shell in the copy, and the file is
restored after (what CMD itself writes elsewhere, caches say, stays, as it would between two test runs).
The true middle is run first, once per file: a hole whose truth fails CMD is not judged.
CMD runs in a session of its own, killed whole at the time limit and after it exits (no child left: one
that starts a session of its own, as a daemon does, is out of reach), and
in a network namespace of its own where ``unshare --net`` works (Linux, as root or with user namespaces);
where it does not, :attr:`Executor.network` says the network was not cut.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidParameterError
from .holes import Hole

#: Seconds CMD may run per completion unless told (a test suite's run).
DEFAULT_EXEC_TIMEOUT = 60.0
#: What a run of CMD ends as: the text's tests passed, failed, or ran past the limit.
PASSED, FAILED, TIMED_OUT = "passed", "failed", "timed out"
#: A hole whose true middle does not pass is not scored for pass@1 (its status says why).
TRUTH_FAILS, TRUTH_TIMED_OUT = "truth fails", "truth timed out"
#: The status of a hole that cannot be run at all (its file is not in the repository: "not run: why").
NOT_RUN = "not run"
#: The commands that put CMD in a network namespace of its own, tried in this order.
_UNSHARE = (("unshare", "--net", "--"), ("unshare", "--net", "--map-root-user", "--"))


@dataclass(frozen=True)
class Run:
    """One run of CMD: how it ended (:data:`PASSED`, :data:`FAILED` or :data:`TIMED_OUT`), its exit
    status (None when killed at the limit) and its seconds."""

    status: str
    returncode: int | None
    seconds: float

    @property
    def passed(self) -> bool:
        return self.status == PASSED


class Executor:
    """Runs ``command`` in a temporary copy of ``root`` with a hole's file changed; :meth:`close` (or
    ``with``) removes the copy. The true middle is run once per hole (:meth:`baseline`)."""

    def __init__(self, root: str | os.PathLike[str], command: str, *, timeout: float = DEFAULT_EXEC_TIMEOUT):
        if not isinstance(command, str) or not command.strip():
            msg = f"exec_command must be a shell command (its tests: 'pytest -x -q'), not {command!r}."
            raise InvalidParameterError(msg)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            msg = f"exec_timeout must be a positive number of seconds, not {timeout!r}."
            raise InvalidParameterError(msg)
        self.root = Path(root)
        if not self.root.is_dir():
            msg = f"exec_command needs the repository's folder; {str(root)!r} is not one."
            raise InvalidParameterError(msg)
        self.command, self.timeout = command, float(timeout)
        self._prefix, self.network = _network_prefix()
        self._tmp = Path(tempfile.mkdtemp(prefix="lcsc-exec-"))
        self.copy = self._tmp / self.root.name
        try:  # links copied as links: a link out of the repository is not followed into the copy
            shutil.copytree(self.root, self.copy, symlinks=True)
        except (OSError, shutil.Error) as exc:
            shutil.rmtree(self._tmp, ignore_errors=True)
            msg = f"Cannot copy {str(root)!r} to run exec_command in: {exc}"
            raise InvalidParameterError(msg) from exc
        self._baselines: dict[tuple[str, str], Run] = {}

    def baseline(self, hole: Hole) -> Run:
        """CMD's run with ``hole``'s true middle in place: once per file and text (the holes of a file
        cut from one text all put it back whole), remembered."""
        key = (hole.file, hashlib.sha256((hole.prefix + hole.truth + hole.suffix).encode()).hexdigest())
        if key not in self._baselines:
            self._baselines[key] = self.run(hole, hole.truth)
        return self._baselines[key]

    def run(self, hole: Hole, middle: str) -> Run:
        """CMD's run with ``middle`` in place of ``hole``'s true middle; the file is restored after."""
        path = (self.copy / hole.file).resolve()
        if not path.is_relative_to(self.copy.resolve()) or not path.is_file():
            msg = (
                f"{hole.file!r} is not a file of the repository at {str(self.root)!r}: nothing to run it in."
            )
            raise InvalidParameterError(msg)
        original = path.read_bytes()
        try:
            path.write_bytes((hole.prefix + middle + hole.suffix).encode("utf-8"))
            return self._run()
        finally:
            path.write_bytes(original)

    def _run(self) -> Run:
        started = time.perf_counter()
        with tempfile.TemporaryFile() as output:  # a file, not a pipe: a child left holding it cannot block
            process = subprocess.Popen(
                [*self._prefix, "/bin/sh", "-c", self.command],
                cwd=self.copy,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killed whole below
            )
            try:
                returncode: int | None = process.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                returncode = None
            finally:  # at the limit, on Ctrl-C, and after it exits: whatever it left running
                _kill_group(process)
        seconds = time.perf_counter() - started
        if returncode is None:
            return Run(TIMED_OUT, None, seconds)
        return Run(PASSED if returncode == 0 else FAILED, returncode, seconds)

    def describe(self) -> dict[str, object]:
        """What the report's metadata says of the runs: the command, the limit, the network."""
        return {"command": self.command, "timeout_s": self.timeout, "network": self.network}

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _network_prefix() -> tuple[tuple[str, ...], str]:
    """The command that cuts CMD's network on this machine, and what the report says of it."""
    if shutil.which("unshare") is None:
        return (), "not cut: no unshare command (the network namespace needs Linux's util-linux)"
    for prefix in _UNSHARE:
        try:
            tried = subprocess.run([*prefix, "true"], capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if tried.returncode == 0:
            return prefix, f"cut: {' '.join(prefix[:-1])} (a network namespace with no interface up)"
    return (), "not cut: unshare --net is not permitted here (needs root or user namespaces)"
