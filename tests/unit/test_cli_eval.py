"""``langchain-starcoder eval``, run in-process on the tiny checkpoint and a small repository: a record per
hole and configuration in the JSON, the same holes for the same seed, the table, Ctrl-C, the errors."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from langchain_starcoder import StarCoderEngine, cli
from langchain_starcoder.evaluation import EvalReport
from langchain_starcoder.server import create_app
from langchain_starcoder.testing.repos import UTIL, write_files
from langchain_starcoder.testing.servers import ServerThread

FIELDS = {"file", "kind", "config", "truth", "prediction", "em", "es", "id_em", "id_f1"}
FAST = ("--max-tokens", "6", "--max-prompt-tokens", "256")


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return write_files(tmp_path / "repo")


def records(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["records"]


def test_a_record_per_hole_and_configuration_and_the_table(capsys, tiny_path, repo, tmp_path):
    out = tmp_path / "report.json"
    argv = ("eval", repo, "--model", tiny_path, "--holes", 5, "--configs", "psm,spm+repo", "--out", out)
    code, stdout, err = run(capsys, *argv, *FAST)
    assert code == 0, err
    got = records(out)
    assert len(got) == 5 * 2
    assert all(set(r) >= FIELDS and r["error"] is None for r in got)
    assert [r["config"] for r in got] == ["psm", "spm+repo"] * 5  # holes one at a time, every config
    for r in got:  # each hole is a span of its own file
        assert r["truth"] and r["truth"] in (repo / r["file"]).read_text()
    assert "Evaluating" in err  # the progress bar
    report = EvalReport.load(out)
    lines = stdout.splitlines()
    assert lines[0].split() == ["config", "n", "errors", "em", "es", "id_em", "id_f1"]
    means = {row["config"]: row for row in report.summary()}
    psm = next(line for line in lines if line.startswith("psm "))
    assert psm.split()[1:4] == ["5", "0", f"{100 * means['psm']['em']:.1f}%"]
    assert psm.split()[4] == f"{means['psm']['es']:.1f}"
    # The second configuration's paired difference against the first, with its bootstrap interval.
    es = report.compare("spm+repo", "psm")["es"]
    paired = next(line for line in lines[2:] if line.startswith("spm+repo") and "[" in line)
    assert f"{es.diff:+.1f} [{es.low:+.1f}, {es.high:+.1f}]" in paired
    assert any(line.startswith("Against psm") for line in lines)


def test_the_same_seed_cuts_the_same_holes(capsys, tiny_path, repo, tmp_path):
    def holes(seed: int, name: str) -> list[tuple]:
        out = tmp_path / name
        argv = ("eval", repo, "--model", tiny_path, "--holes", 4, "--configs", "psm", "--seed", seed)
        code, _, err = run(capsys, *argv, "--out", out, *FAST)
        assert code == 0, err
        return [(r["file"], r["kind"], r["line"], r["truth"]) for r in records(out)]

    first = holes(7, "a.json")
    assert len(first) == 4
    assert holes(7, "b.json") == first
    assert holes(8, "c.json") != first


def test_base_url_evaluates_through_a_server_as_in_process(capsys, tiny_path, tiny_engine, repo, tmp_path):
    """--base-url: the same holes through this package's server over HTTP, the same greedy predictions."""
    argv = ("eval", repo, "--holes", 3, "--configs", "psm,spm", *FAST)
    code, _, err = run(capsys, *argv, "--model", tiny_path, "--out", tmp_path / "here.json")
    assert code == 0, err
    running = ServerThread(create_app(tiny_engine, model_name="tiny"))
    try:
        remote = ("--base-url", running.url, "--model", "tiny", "--tokenizer", tiny_path)
        code, _, err = run(capsys, *argv, *remote, "--out", tmp_path / "there.json")
    finally:
        running.stop()
    assert code == 0, err
    assert f"Connected to {running.url}" in err
    here, there = records(tmp_path / "here.json"), records(tmp_path / "there.json")
    assert all(r["error"] is None for r in there)
    assert [(r["task_id"], r["config"], r["prediction"]) for r in there] == [
        (r["task_id"], r["config"], r["prediction"]) for r in here
    ]


def test_ctrl_c_keeps_what_is_done(capsys, tiny_path, repo, tmp_path, monkeypatch):
    calls = []
    original = StarCoderEngine.stream_infill

    def interrupted(self, *args, **settings):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return original(self, *args, **settings)

    monkeypatch.setattr(StarCoderEngine, "stream_infill", interrupted)
    out = tmp_path / "report.json"
    argv = ("eval", repo, "--model", tiny_path, "--holes", 4, "--configs", "psm,spm", "--out", out)
    code, stdout, err = run(capsys, *argv, *FAST)
    assert code == 130
    assert "interrupted after 3 of 8 completions" in err
    data = json.loads(out.read_text())
    assert data["metadata"]["interrupted"] is True
    assert [r["config"] for r in data["records"]] == ["psm", "spm", "psm"]
    assert stdout.splitlines()[0].startswith("config")  # the table of what was done still prints


def _git_repo(root: Path) -> None:
    for argv in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "first"]):
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(root), *argv], check=True
        )


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", "is not a folder"),
        ("since", "is not a revision of the git repository"),
        ("config", "must start with its FIM order"),
        ("kinds", "has no holes of the kinds call"),
        ("out", "does not exist"),
        ("languages", "languages must be some of bash, c, cpp, csharp, go"),
        ("exec", "--exec needs a command"),
    ],
)
def test_errors_are_one_line_exit_2_and_write_nothing(capsys, repo, tmp_path, case, expected):
    # The model is never loaded (it does not exist): every argument is checked before it.
    argv: list[object] = ["eval", repo, "--model", tmp_path / "no-model", "--out", tmp_path / "r.json"]
    if case == "missing":
        argv[1] = tmp_path / "nowhere"
    elif case == "since":
        _git_repo(repo)
        argv += ["--since", "no-such-rev"]
    elif case == "config":
        argv += ["--configs", "psm,fim+repo"]
    elif case == "kinds":
        (repo / "pkg" / "app.py").unlink()  # the only file with calls
        argv += ["--kinds", "call"]
    elif case == "languages":
        argv += ["--languages", "python,cobol"]
    elif case == "exec":
        argv += ["--exec", " "]
    else:
        argv[-1] = tmp_path / "missing-folder" / "r.json"
    before = sorted(tmp_path.iterdir())
    code, stdout, err = run(capsys, *argv)
    assert code == 2
    assert stdout == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("langchain-starcoder: error: ")
    assert expected in err
    assert sorted(tmp_path.iterdir()) == before  # no report, no partial file


def test_languages_choose_the_files_and_a_kind_with_no_place_is_named(capsys, tiny_path, tmp_path):
    root = tmp_path / "repo"
    (root / "web").mkdir(parents=True)
    (root / "util.py").write_text(UTIL)
    (root / "web" / "lib.ts").write_text("export const TAX = 0.2;\nexport const RATE = TAX * 2;\n")
    out = tmp_path / "report.json"
    argv = ("eval", root, "--model", tiny_path, "--holes", 4, "--configs", "psm", "--out", out, *FAST)
    code, _, err = run(capsys, *argv, "--languages", "typescript", "--kinds", "line,block")
    assert code == 0, err
    assert {r["file"] for r in records(out)} == {"web/lib.ts"} and len(records(out)) == 2  # its 2 lines
    assert {r["kind"] for r in records(out)} == {"line"}
    # The TypeScript file has no statement block: said, and its share went to the lines.
    assert "note: " in err and "has no place for block holes in its typescript files" in err
    assert json.loads(out.read_text())["metadata"]["languages"] == "typescript"


CHECK = "from pkg.util import scale\n\nassert scale(2) == 4 and scale(1, 3) == 3\n"


def test_exec_judges_each_prediction_and_the_table_has_pass_at_1(capsys, tiny_path, repo, tmp_path):
    (repo / "check.py").write_text(CHECK)
    out = tmp_path / "report.json"
    command = f"{shlex.quote(sys.executable)} check.py"
    argv = ("eval", repo, "--model", tiny_path, "--holes", 3, "--configs", "psm,spm", "--out", out, *FAST)
    code, stdout, err = run(capsys, *argv, "--kinds", "line", "--exec", command, "--exec-timeout", 30)
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["metadata"]["exec"]["command"] == command and data["metadata"]["exec"]["timeout_s"] == 30
    got = data["records"]
    assert len(got) == 6 and all(isinstance(r["passed"], bool) and r["exec_s"] > 0 for r in got)
    lines = stdout.splitlines()
    assert lines[0].split() == ["config", "n", "errors", "em", "es", "id_em", "id_f1", "pass@1"]
    means = {row["config"]: row for row in EvalReport.load(out).summary()}
    psm = next(line for line in lines if line.startswith("psm "))
    assert psm.split()[-1] == f"{100 * means['psm']['pass@1']:.1f}%"
    paired = next(line for line in lines[2:] if line.startswith("spm") and "[" in line)
    assert paired.count("[") == 5  # four metrics and pass@1, each with its interval
    assert (repo / "pkg" / "util.py").read_text() == UTIL  # the repository itself is never touched


def test_compare_pairs_two_runs_of_the_same_holes(capsys, tiny_path, repo, tmp_path):
    """compare: two eval runs on the same holes, paired hole by hole under the names given."""
    for config, seed, name in (("psm", 3, "a.json"), ("spm", 3, "b.json"), ("psm", 4, "c.json")):
        argv = ("eval", repo, "--model", tiny_path, "--holes", 4, "--configs", config, "--seed", seed)
        code, _, err = run(capsys, *argv, "--out", tmp_path / name, *FAST)
        assert code == 0, err
    out = tmp_path / "both.json"
    code, stdout, err = run(
        capsys, "compare", tmp_path / "a.json", tmp_path / "b.json", "--names", "base,other", "--out", out
    )
    assert code == 0, err
    both = EvalReport.load(out)
    assert both.configs == ["base", "other"] and len(both.records) == 8
    es = both.compare("other", "base")["es"]
    paired = next(line for line in stdout.splitlines() if line.startswith("other") and "[" in line)
    assert paired.split()[1] == "4" and f"{es.diff:+.1f} [{es.low:+.1f}, {es.high:+.1f}]" in paired
    assert any(line.startswith("Against base") for line in stdout.splitlines())
    # Runs of other holes, a name short, a lone report: one line, exit 2, nothing written.
    for argv, expected in (
        (("compare", tmp_path / "a.json", tmp_path / "c.json"), "share no hole"),
        (("compare", tmp_path / "a.json", tmp_path / "b.json", "--names", "base"), "--names needs 2"),
        (("compare", tmp_path / "a.json"), "two reports or more"),
        (("compare", tmp_path / "a.json", tmp_path / "missing.json"), "Cannot read"),
    ):
        code, stdout, err = run(capsys, *argv, "--out", tmp_path / "bad.json")
        assert (code, stdout) == (2, "") and expected in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "bad.json").exists()
