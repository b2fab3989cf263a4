"""``exec_command`` (``--exec``): a completion run with the repository's tests in a temporary copy, within a
time limit, without the network where the platform allows; passing, failing and hanging completions (killed
at the limit with every process they started), the true middle run first, pass@1 in the report."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from langchain_starcoder import StarCoderEngine
from langchain_starcoder.errors import InvalidParameterError
from langchain_starcoder.evaluation import Hole, cut_holes, evaluate
from langchain_starcoder.evaluation.execution import FAILED, PASSED, TIMED_OUT, TRUTH_FAILS, Executor
from langchain_starcoder.testing.repos import write_files

CALC = "def add(a, b):\n    return a + b\n\n\ndef double(x):\n    return add(x, x)\n"
CHECK = "import calc\n\nassert calc.double(3) == 6\n"  # the repository's tests
# A completion that starts a child that outlives it, then hangs.
HANG = (
    "print(__import__('os').getpid(), __import__('subprocess').Popen(['sleep', '1000']).pid, flush=True, "
    "file=open(__import__('sys').argv[1], 'a')) or __import__('time').sleep(1000)"
)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return write_files(tmp_path / "repo", {"calc.py": CALC, "check.py": CHECK})


def _command(pids: Path) -> str:
    """The tests' command, its shell's pid written to ``pids`` (and named to check.py: a hanging
    completion writes its own and its child's)."""
    pids_file = shlex.quote(str(pids))
    return f"echo $$ >> {pids_file}; {shlex.quote(sys.executable)} check.py {pids_file}"


def _hole(repo: Path) -> Hole:
    """``return a + b``'s expression, cut by hand: a known true middle."""
    text = (repo / "calc.py").read_text()
    start = text.index("a + b")
    return Hole("calc.py", "line", "python", text[:start], text[start + 5 :], "a + b", line=1, column=11)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead and waiting for its parent to reap it, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except OSError:  # not Linux's /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state not in ("Z", "X")


def _gone(pids: list[int], within: float = 10.0) -> bool:
    """Whether every one of ``pids`` is gone (an orphan's kill is seen at once; a little grace)."""
    deadline = time.monotonic() + within
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()]


def test_a_passing_a_failing_and_a_hanging_completion(repo: Path, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    hole = _hole(repo)
    with Executor(repo, _command(pids), timeout=3) as executor:
        assert executor.baseline(hole).status == PASSED
        passing = executor.run(hole, "b + a")
        failing = executor.run(hole, "a - b")
        assert (passing.status, passing.returncode) == (PASSED, 0)
        assert (failing.status, failing.returncode) == (FAILED, 1) and not failing.passed
        # Each run restored the file: the next sees the repository as it was.
        assert (executor.copy / "calc.py").read_text() == CALC
        pids.write_text("")
        hanging = executor.run(hole, HANG)
        assert hanging.status == TIMED_OUT and hanging.returncode is None
        assert 3 <= hanging.seconds < 30  # killed at the limit, not when the sleep ends
        started = _pids(pids)
        assert len(started) == 3  # the shell, check.py, and the sleep check.py started
        assert _gone(started)  # nothing left running
        assert (executor.copy / "calc.py").read_text() == CALC
        assert executor.run(hole, "a + b").passed  # still usable after a kill
        copy = executor.copy
    assert not copy.exists()  # the copy is removed
    assert (repo / "calc.py").read_text() == CALC  # the repository itself was never touched


def test_a_child_left_running_by_a_passing_command_is_killed(repo: Path, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    command = f"sleep 1000 & echo $! >> {shlex.quote(str(pids))}; true"
    with Executor(repo, command, timeout=30) as executor:
        assert executor.run(_hole(repo), "a + b").passed
        assert _gone(_pids(pids))


def test_the_network_is_cut_where_the_platform_allows(repo: Path) -> None:
    # A network namespace of its own has one interface, the loopback, and it down.
    command = "test $(grep -c : /proc/net/dev) -eq 1"
    with Executor(repo, command, timeout=30) as executor:
        if executor.network.startswith("not cut"):  # said so, as the report's metadata says it
            assert "unshare" in executor.network
            return
        assert executor.network.startswith("cut: unshare --net")
        assert executor.run(_hole(repo), "a + b").passed
    if Path("/proc/net/dev").read_text().count(":") > 1:  # this machine has more than the loopback
        assert subprocess.run(["/bin/sh", "-c", command], check=False).returncode == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"command": ""}, "must be a shell command"),
        ({"command": "true", "timeout": 0}, "exec_timeout must be a positive number"),
        ({"command": "true", "timeout": True}, "exec_timeout must be a positive number"),
        ({"command": "true", "root": "/no/such/folder"}, "is not one"),
    ],
)
def test_bad_arguments_are_clear_errors(repo: Path, arguments: dict, message: str) -> None:
    arguments = {"root": repo, **arguments}
    with pytest.raises(InvalidParameterError, match=message):
        Executor(**arguments)


FAST = {"max_tokens": 8, "max_prompt_tokens": 192}


def test_evaluate_judges_each_prediction_and_reports_pass_at_1(
    tiny_engine: StarCoderEngine, repo: Path, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    holes = cut_holes(repo, kinds=["line", "call"], n=4, seed=1)
    report = evaluate(tiny_engine, holes, "psm,spm", repo=repo, exec_command=_command(pids), **FAST)
    runs = len(_pids(pids))  # the shell's pid per run
    # The true middle ran once per file, then each prediction.
    assert runs == len({h.file for h in holes}) + len(report.records)
    assert report.metadata["exec"]["command"] == _command(pids)
    assert report.metadata["exec"]["network"].startswith(("cut", "not cut"))
    for r in report.records:
        assert isinstance(r.passed, bool) and r.exec_status == (PASSED if r.passed else FAILED)
        assert r.exec_s is not None and r.exec_s > 0
    # Each verdict is what the command says of the prediction in place, run here by hand.
    hole_of = {h.task_id: h for h in holes}
    for r in report.records:
        hole = hole_of[r.task_id]
        work = tmp_path / "by-hand"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(repo, work)
        (work / hole.file).write_text(hole.prefix + r.prediction + hole.suffix)
        command = _command(tmp_path / "by-hand-pids")
        by_hand = subprocess.run(["/bin/sh", "-c", command], cwd=work, check=False, capture_output=True)
        assert r.passed == (by_hand.returncode == 0), r
    means = {row["config"]: row["pass@1"] for row in report.summary()}
    for config in ("psm", "spm"):
        judged = [r.passed for r in report.records if r.config == config]
        assert means[config] == sum(judged) / len(judged)
    difference = report.compare("spm", "psm")["pass@1"]
    assert difference.n == len(holes) and difference.low <= difference.diff <= difference.high


def test_a_hole_whose_truth_fails_is_not_judged(tiny_engine: StarCoderEngine, repo: Path) -> None:
    (repo / "calc.py").write_text(CALC.replace("a + b", "a - b"))  # the repository's own tests fail
    holes = cut_holes(repo, kinds=["line"], n=2, seed=1)
    command = f"{shlex.quote(sys.executable)} check.py /dev/null"
    report = evaluate(tiny_engine, holes, "psm,spm", repo=repo, exec_command=command, **FAST)
    assert all(r.passed is None and r.exec_status == TRUTH_FAILS and r.exec_s is None for r in report.records)
    assert all(row["pass@1"] is None for row in report.summary())
    assert "pass@1" not in {d.metric for d in report.compare("spm", "psm").rows}


def test_exec_needs_the_repository(tiny_engine: StarCoderEngine, repo: Path) -> None:
    holes = cut_holes(repo, kinds=["line"], n=1)
    with pytest.raises(InvalidParameterError, match="exec_command needs repo="):
        evaluate(tiny_engine, holes, "psm", exec_command="true", **FAST)


def test_a_hole_outside_the_repository_is_not_run_and_the_rest_are(
    tiny_engine: StarCoderEngine, repo: Path, tmp_path: Path
) -> None:
    (tmp_path / "outside.py").write_text(CALC)
    inside = _hole(repo)
    outside = Hole(
        "../outside.py", "line", "python", inside.prefix, inside.suffix, "a + b", line=1, column=11
    )
    command = f"{shlex.quote(sys.executable)} check.py /dev/null"
    report = evaluate(tiny_engine, [outside, inside], "psm", repo=repo, exec_command=command, **FAST)
    first, second = report.records
    assert first.passed is None and first.exec_status.startswith("not run: '../outside.py' is not a file")
    assert isinstance(second.passed, bool) and second.exec_status in (PASSED, FAILED)
    assert (tmp_path / "outside.py").read_text() == CALC  # never written
