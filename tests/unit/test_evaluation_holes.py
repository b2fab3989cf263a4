"""Holes cut from a small repository in Python, TypeScript and Go, with known cross-file answers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from langchain_starcoder.errors import InvalidParameterError
from langchain_starcoder.evaluation import Hole, HoleNotice, cut_holes
from langchain_starcoder.repo import RepoIndex
from langchain_starcoder.repo.symbols import parse

UTIL = '''\
"""Helpers."""

RATE = 3
LIMIT = 10


def scale(value, factor=2):
    return value * factor


class Meter:
    unit = "m"

    def reading(self, raw):
        if raw < 0:
            return 0
        return raw * RATE
'''
APP = """\
from pkg.util import Meter, scale, RATE


def run(values):
    meter = Meter()
    total = 0
    for v in values:
        total += scale(v) + meter.reading(v)
    print(unit, meter.reading(0))  # util's unit is a class's: a bare unit is another
    return total * RATE


def local_only(x):
    LIMIT = x + 1  # this file's own LIMIT (and RATE in a comment is no use)
    return LIMIT
"""
LIB = """\
export function formatPrice(amount: number): string {
  return amount.toFixed(2);
}
export const TAX = 0.2;
"""
MAIN = """\
import { formatPrice, TAX } from "./lib";

function total(items: number[]): string {
  let sum = 0;
  for (const item of items) {
    sum += item * (1 + TAX);
  }
  return formatPrice(sum);
}
"""
GO = """\
package main

import "fmt"

func main() {
\tfor i := 0; i < 3; i++ {
\t\tfmt.Println("tick", i)
\t}
}
"""
#: The cross-file holes of the repository: (file, identifier, the rest of the line, defined in).
CROSS_FILE = {
    ("pkg/app.py", "Meter", "Meter()", ("pkg/util.py",)),
    ("pkg/app.py", "scale", "scale(v) + meter.reading(v)", ("pkg/util.py",)),
    ("pkg/app.py", "RATE", "RATE", ("pkg/util.py",)),
    (
        "pkg/app.py",
        "reading",
        "reading(0))  # util's unit is a class's: a bare unit is another",
        ("pkg/util.py",),
    ),
    ("web/main.ts", "TAX", "TAX);", ("web/lib.ts",)),
    ("web/main.ts", "formatPrice", "formatPrice(sum);", ("web/lib.ts",)),
}


def _write(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
    return root


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return _write(
        tmp_path / "repo",
        {
            "pkg/util.py": UTIL,
            "pkg/app.py": APP,
            "web/lib.ts": LIB,
            "web/main.ts": MAIN,
            "cmd/main.go": GO,
            "README.md": "# demo\n\nscale(2) and Meter() in prose.\n",
            # Left out, as the repository index leaves them out: ignored, binary, not UTF-8.
            ".gitignore": "secret/\n",
            "secret/keys.py": "from pkg.util import scale\nTOKEN = scale(4)\n",
            "blob.py": b"\x00\x01binary\x00 = scale(1)\n",
            "latin.py": "x = scale(1)  # caf\xe9\n".encode("latin-1"),
        },
    )


def _text(repo: Path, hole: Hole) -> str:
    return (repo / hole.file).read_text(encoding="utf-8")


def test_cross_file_holes_are_the_known_ones(repo: Path) -> None:
    holes = cut_holes(repo, kinds=["cross_file"], n=100)
    assert {(h.file, h.identifier, h.truth, h.defined_in) for h in holes} == CROSS_FILE
    for hole in holes:
        assert hole.kind == "cross_file" and hole.truth.startswith(hole.identifier)
        own = {d.name for d in parse(hole.file, _text(repo, hole)).definitions}
        assert hole.identifier not in own
        for other in hole.defined_in:
            assert hole.identifier in {d.name for d in parse(other, (repo / other).read_text()).definitions}


def test_every_hole_is_its_files_text_and_of_its_shape(repo: Path) -> None:
    holes = cut_holes(repo, n=60, seed=3)
    assert {h.kind for h in holes} == {"line", "span", "block", "call", "cross_file"}
    assert {h.file for h in holes} <= {
        "pkg/util.py",
        "pkg/app.py",
        "web/lib.ts",
        "web/main.ts",
        "cmd/main.go",
    }
    assert len({h.task_id for h in holes}) == len(holes)
    for h in holes:
        text = _text(repo, h)
        assert h.prefix + h.truth + h.suffix == text
        assert text.split("\n")[h.line][h.column :].startswith(h.truth.split("\n")[0])
        assert h.language == {"py": "python", "ts": "typescript", "go": "go"}[h.file.rsplit(".", 1)[1]]
        assert h.truth.strip()
        if h.kind in ("line", "cross_file"):  # the rest of the line
            assert "\n" not in h.truth and h.suffix[:1] in ("\n", "")
        elif h.kind == "span":
            assert "\n" not in h.truth and h.truth == h.truth.strip()
        elif h.kind == "call":
            assert h.prefix.endswith("(") and h.suffix.startswith(")")
    blocks = {h.truth for h in holes if h.kind == "block"}
    assert "if raw < 0:\n            return 0\n        return raw * RATE" in blocks
    assert 'fmt.Println("tick", i)' in blocks
    calls = {h.truth for h in holes if h.kind == "call"}
    assert {'"tick", i', "v"} <= calls


def test_the_same_seed_cuts_the_same_holes(repo: Path) -> None:
    first = cut_holes(repo, n=12, seed=7)
    assert cut_holes(RepoIndex(repo), n=12, seed=7) == first
    assert cut_holes(repo, n=12, seed=8) != first
    # A kind's holes do not depend on which other kinds are asked for.
    lines = [h for h in first if h.kind == "line"]
    assert [h for h in cut_holes(repo, kinds=["line", "call"], n=6, seed=7) if h.kind == "line"][:2] == lines[
        :2
    ]


def test_a_kind_without_places_gives_its_share_to_the_others(repo: Path) -> None:
    # The Go file has no cross-file names: its holes of that kind are none, and line takes all.
    with pytest.warns(HoleNotice, match="no place for cross_file holes in its go files: the other kinds"):
        holes = cut_holes(repo, kinds="line,cross_file", n=10, languages=["go"])
    assert Counter(h.kind for h in holes) == {"line": 5}  # the Go file has 5 lines with a word
    holes = cut_holes(repo, kinds=["line", "cross_file"], n=10, languages=["python", "typescript"])
    assert Counter(h.kind for h in holes) == {"cross_file": 5, "line": 5}
    assert cut_holes(repo, kinds=["call"], n=0) == []


def test_languages_filter_the_files(repo: Path) -> None:
    holes = cut_holes(repo, n=20, languages="typescript")
    assert holes and {h.file for h in holes} <= {"web/lib.ts", "web/main.ts"}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kinds": ["line", "lines"]}, "kinds must be some of"),
        ({"kinds": []}, "kinds must be some of"),
        ({"n": -1}, "n must be an integer"),
        ({"n": 2.5}, "n must be an integer"),
        ({"seed": "x"}, "seed must be an integer"),
        ({"languages": ["python", "cobol"]}, "languages must be some of"),
    ],
)
def test_bad_options_are_clear_errors(repo: Path, options: dict, message: str) -> None:
    with pytest.raises(InvalidParameterError, match=message):
        cut_holes(repo, **options)


def _git(root: Path, *args: str) -> str:
    command = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()


def test_since_keeps_only_lines_added_after_the_revision(repo: Path) -> None:
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "first")
    first = _git(repo, "rev-parse", "HEAD")
    # Added since: two lines of app.py (one a cross-file use) and a new, untracked file.
    app = APP.replace(
        "    return total * RATE\n", "    total -= RATE\n    print(total)\n    return total * RATE\n"
    )
    (repo / "pkg" / "app.py").write_text(app)
    (repo / "pkg" / "new.py").write_text("from pkg.util import scale\n\nDOUBLE = scale(2, factor=4)\n")
    with pytest.warns(HoleNotice, match=f"no place for block holes in lines added since {first}"):
        holes = cut_holes(repo, n=50, since=first)
    assert holes
    added = {("pkg/app.py", 9), ("pkg/app.py", 10), ("pkg/new.py", 0), ("pkg/new.py", 2)}
    assert {(h.file, h.line) for h in holes} <= added
    assert {(h.file, h.identifier) for h in holes if h.kind == "cross_file"} == {
        ("pkg/app.py", "RATE"),
        ("pkg/new.py", "scale"),
    }
    with pytest.warns(HoleNotice):
        assert cut_holes(repo, n=50, since="HEAD~0") == holes  # the same revision by another name


@pytest.mark.parametrize("since", ["no-such-branch", "--output={out}", "", "HEAD~5"])
def test_a_bad_since_is_a_clear_error(repo: Path, tmp_path: Path, since: str) -> None:
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "first")
    with pytest.raises(InvalidParameterError, match="since"):
        cut_holes(repo, since=since.format(out=tmp_path / "out"))
    assert not (tmp_path / "out").exists()  # never read as an option of git's
    assert cut_holes(repo, n=3)  # nothing is lost: the same repository still cuts


def test_since_outside_git_is_a_clear_error(repo: Path) -> None:
    with pytest.raises(InvalidParameterError, match="not in one"):
        cut_holes(repo, since="HEAD")


def _without_read_override(argv: list[str]) -> list[str]:
    """``argv`` run without the power to read what file modes forbid: as root (where chmod 000 stops
    nothing), with CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH dropped by setpriv."""
    if os.geteuid() != 0:
        return argv
    if shutil.which("setpriv") is None:
        pytest.skip("root can read a chmod 000 file, and setpriv is not here to drop that power")
    return ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *argv]


CUT = (
    "import json, sys\nfrom langchain_starcoder.evaluation import cut_holes\n"
    "holes = cut_holes(sys.argv[1], n=200, seed=0)\n"
    "print(json.dumps(sorted({h.file for h in holes})))\n"
)


def test_an_unreadable_file_is_left_out_and_the_rest_cut(repo: Path) -> None:
    secret = repo / "pkg" / "locked.py"
    secret.write_text("from pkg.util import scale\n\nLOCKED = scale(3)\n")
    secret.chmod(0)
    try:
        argv = _without_read_override([sys.executable, "-c", CUT, str(repo)])
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300)
        # The check is real: the same process could not read it.
        check = _without_read_override([sys.executable, "-c", f"open({str(secret)!r}).read()"])
        assert "PermissionError" in subprocess.run(check, capture_output=True, text=True, check=False).stderr
    finally:
        secret.chmod(0o644)
    assert done.returncode == 0, done.stderr
    files = json.loads(done.stdout)
    assert "pkg/locked.py" not in files
    assert {"pkg/util.py", "pkg/app.py", "web/main.ts", "cmd/main.go"} <= set(files)


def test_a_binary_file_is_left_out_and_the_rest_cut(repo: Path) -> None:
    (repo / "pkg" / "data.py").write_bytes(b"LIMIT = 3\x00\x01\x02" + bytes(range(256)))
    holes = cut_holes(repo, n=200, seed=0)
    assert holes and "pkg/data.py" not in {h.file for h in holes} and "blob.py" not in {h.file for h in holes}
    assert {h.file for h in holes} >= {"pkg/util.py", "pkg/app.py"}
