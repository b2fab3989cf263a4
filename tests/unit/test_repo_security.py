"""RepoIndex under attack (issue 29, items 1, 4, 5 and 19's retriever points): nothing outside the root
reaches a prompt, the index is safe from many threads, any depth, lines as the parser counts them,
memory bounded for real, each retrieved file once."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import tracemalloc
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from langchain_starcoder import FIMRequest, InvalidParameterError, RepoIndex, RepoRetriever, StarCoderEngine
from langchain_starcoder.repo import GAP_MARKER
from langchain_starcoder.repo.chunks import FileEntry

SAMPLE_REPO = Path(__file__).resolve().parents[2] / "examples" / "sample_repo"
SECRET = "hunter2-do-not-leak"


def words(text: str) -> int:
    return len(text.split())


@contextlib.contextmanager
def mtime_kept(folder: Path) -> Iterator[None]:
    """Whatever happens inside, ``folder``'s times are put back (as an attacker would, to hide it)."""
    info = os.stat(folder)
    try:
        yield
    finally:
        os.utime(folder, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)


def lay_out(tmp_path: Path) -> tuple[Path, Path]:
    """A repository whose ``pkg/tokens.py`` defines what ``app.py`` uses, and a secret outside it with
    the same names (so if it were read, the lookup would pick it)."""
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    (repo / "pkg").mkdir(parents=True)
    outside.mkdir()
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "tokens.py").write_text("def leak_secret_token(key='placeholder'):\n    return key\n")
    (repo / "app.py").write_text("from pkg.tokens import leak_secret_token\n\nvalue = leak_secret_token()\n")
    (outside / "tokens.py").write_text(f"def leak_secret_token(key='{SECRET}'):\n    return key\n")
    return repo, outside


HOLE = "from pkg.tokens import leak_secret_token\n\nvalue = "


def ask(index: RepoIndex) -> str:
    files = index.context_files("app.py", HOLE, "", max_tokens=200, count_tokens=words)
    return "\n".join(f"{f.path}\n{f.text}" for f in files)


def swap_file(repo: Path, outside: Path) -> None:
    """pkg/tokens.py becomes a link to the secret, pkg's times put back."""
    with mtime_kept(repo / "pkg"):
        (repo / "pkg" / "tokens.py").unlink()
        os.symlink(outside / "tokens.py", repo / "pkg" / "tokens.py")


def swap_folder(repo: Path, outside: Path) -> None:
    """pkg becomes a link to a folder outside holding the secret as tokens.py, the root's times put back."""
    (outside / "__init__.py").write_text("")
    with mtime_kept(repo):
        os.rename(repo / "pkg", repo.parent / "old_pkg")
        os.symlink(outside, repo / "pkg")


@pytest.mark.parametrize("swap", [swap_file, swap_folder])
def test_a_file_swapped_for_a_way_out_of_the_root_is_dropped_not_read(tmp_path: Path, swap) -> None:
    repo, outside = lay_out(tmp_path)
    index = RepoIndex(repo)
    assert "placeholder" in ask(index), "precondition: the file is picked for this hole"
    swap(repo, outside)
    assert SECRET not in ask(index)
    assert "pkg/tokens.py" not in index.files
    assert index.text("pkg/tokens.py") is None


def test_a_link_inside_the_root_retargeted_outside_is_dropped(tmp_path: Path) -> None:
    repo, outside = lay_out(tmp_path)
    os.replace(repo / "pkg" / "tokens.py", repo / "pkg" / "real_tokens.py")
    os.symlink("real_tokens.py", repo / "pkg" / "tokens.py")
    index = RepoIndex(repo)
    assert "pkg/tokens.py" in index.files, "precondition: a link to a file inside is indexed"
    with mtime_kept(repo / "pkg"):
        os.symlink(outside / "tokens.py", repo / "pkg" / "swap")
        os.replace(repo / "pkg" / "swap", repo / "pkg" / "tokens.py")
    assert SECRET not in ask(index)
    assert "pkg/tokens.py" not in index.files and "pkg/real_tokens.py" in index.files


def test_the_engine_prompt_and_the_retrievers_never_show_a_file_outside_the_root(
    tmp_path: Path, tiny_engine: StarCoderEngine
) -> None:
    from langchain_starcoder import RepoNodeRetriever

    repo, outside = lay_out(tmp_path)
    index = RepoIndex(repo)
    request = FIMRequest(HOLE, "\n", file_path="app.py", repo=index)
    assert "placeholder" in tiny_engine.fim_prompt(request, 4).text, "precondition: the file is picked"
    swap_file(repo, outside)
    assert SECRET not in tiny_engine.fim_prompt(request, 4).text
    docs = RepoRetriever(index=index, k=4).invoke("leak_secret_token(key)")
    nodes = RepoNodeRetriever(index, k=4).retrieve("leak_secret_token(key)")
    assert all(SECRET not in d.page_content for d in docs)
    assert all(SECRET not in n.node.text for n in nodes)


def test_threads_using_the_index_directly_while_files_change_never_fail(tmp_path: Path) -> None:
    """What the docs show: ``index.context_files`` and ``index.files`` called directly from threads of
    one's own (no engine lock around them), while an editor saves, adds and deletes files."""
    for i in range(40):
        (tmp_path / f"m{i}.py").write_text(f"def helper_{i}(value):\n    return value + {i}\n")
    index = RepoIndex(tmp_path)
    stop = threading.Event()
    errors: list[BaseException] = []

    def edit() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            i = n % 40
            if n % 3 == 0:
                (tmp_path / f"m{i}.py").unlink(missing_ok=True)
            else:
                body = "".join(f"def helper_{i}_{k}(value):\n    return value\n" for k in range(n % 7 + 1))
                (tmp_path / f"m{i}.py").write_text(body)

    def look(k: int) -> None:
        try:
            for n in range(150):
                if k == 0:
                    index.refresh()
                    index.touch(f"m{n % 40}.py")
                elif k == 1:
                    assert all(isinstance(p, str) for p in index.files)
                else:
                    prefix = f"x = helper_{n % 40}("
                    index.context_files(f"m{n % 40}.py", prefix, "", max_tokens=60, count_tokens=words)
        except BaseException as error:  # every failure is reported below
            errors.append(error)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads switch often: what a busy server does over hours
    try:
        editor = threading.Thread(target=edit)
        lookers = [threading.Thread(target=look, args=(k % 3,)) for k in range(5)]
        editor.start()
        for t in lookers:
            t.start()
        for t in lookers:
            t.join()
        stop.set()
        editor.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, f"{len(errors)} lookups failed, the first: {errors[0]!r}"


def remove_chain(top: str) -> None:
    """Remove a chain of folders named ``d`` from the bottom up (``shutil.rmtree``, as pytest cleans up,
    recurses once per folder)."""
    depth = 0
    while os.path.isdir(os.path.join(top, *["d"] * (depth + 1))):
        depth += 1
    for level in range(depth, -1, -1):
        folder = os.path.join(top, *["d"] * level)
        for name in os.listdir(folder):
            if name != "d":
                os.unlink(os.path.join(folder, name))
        os.rmdir(folder)


def test_fifteen_hundred_nested_folders_are_walked_and_dropped(tmp_path: Path) -> None:
    at = os.open(tmp_path, os.O_RDONLY)
    for _ in range(1500):  # one folder at a time: pathlib's and os.makedirs' recursion would not fit
        os.mkdir("d", dir_fd=at)
        inner = os.open("d", os.O_RDONLY, dir_fd=at)
        os.close(at)
        at = inner
    bottom_fd = os.open("bottom.py", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=at)
    os.write(bottom_fd, b"def at_the_bottom():\n    return 1\n")
    os.close(bottom_fd)
    os.close(at)
    (tmp_path / "top.py").write_text("x = 1\n")
    moved = str(tmp_path.parent / f"{tmp_path.name}-moved")
    try:
        index = RepoIndex(tmp_path)
        assert index.files == sorted(["/".join(["d"] * 1500) + "/bottom.py", "top.py"])
        os.rename(tmp_path / "d", moved)  # the whole chain is gone at once
        assert index.files == ["top.py"]
    finally:
        for top in (str(tmp_path / "d"), moved):
            if os.path.isdir(top):
                remove_chain(top)


@pytest.mark.parametrize("separator", ["\x0c", "\u2028", "\x1c", "\x85", "\v"])
def test_excerpts_keep_the_parsers_lines_whatever_else_splits_lines(tmp_path: Path, separator: str) -> None:
    """Python's ``str.splitlines`` also ends a line at a form feed, ``\\u2028`` and others; the parser does
    not: the outline must show the definitions' own lines."""
    helpers = (
        f"# section one{separator}\n"
        f"NOTE = 'a{separator}b'\n\n\n"
        "def scale_vector(values, factor):\n"
        "    return [v * factor for v in values]\n\n\n"
        "def shift_vector(values, offset):\n"
        "    return [v + offset for v in values]\n"
    )
    (tmp_path / "helpers.py").write_text(helpers)
    (tmp_path / "main.py").write_text("")
    index = RepoIndex(tmp_path)
    prefix = "from helpers import scale_vector, shift_vector\n\nresult = shift_vector(scale_vector("
    files = index.context_files("main.py", prefix, "", max_tokens=200, count_tokens=words)
    text = "\n".join(f.text for f in files if f.path == "helpers.py")
    own = helpers.split("\n")
    assert "def scale_vector(values, factor):" in text.split("\n")
    assert "def shift_vector(values, offset):" in text.split("\n")
    assert all(line in own for line in text.split("\n") if line != GAP_MARKER)


def test_paths_that_climb_out_of_the_root_are_refused_everywhere(tmp_path: Path) -> None:
    from langchain_starcoder import RepoNodeRetriever

    (tmp_path / "a.py").write_text("x = 1\n")
    index = RepoIndex(tmp_path)
    for climbing in ("../../etc/passwd", "..", "pkg/../../x.py"):
        with pytest.raises(InvalidParameterError, match="climbs out of the repository"):
            index.context_files(climbing, "x", "", max_tokens=10, count_tokens=words)
        with pytest.raises(InvalidParameterError, match="climbs out of the repository"):
            index.touch(climbing)
        with pytest.raises(ValueError, match="climbs out of the repository"):
            RepoRetriever(index=index, file_path=climbing)
        with pytest.raises(InvalidParameterError, match="climbs out of the repository"):
            RepoNodeRetriever(index, file_path=climbing)
    with pytest.raises(InvalidParameterError, match="outside the repository"):
        index.context_files("/etc/passwd", "x", "", max_tokens=10, count_tokens=words)
    assert index.context_files("pkg/../b.py", "x = ", "", max_tokens=10, count_tokens=words) is not None


# --- memory ---------------------------------------------------------------------------------------


def dense(kind: str, size: int) -> str:
    """Code that costs the index the most per byte: a definition or a new name on every short line."""
    lines: list[str] = []
    k = total = 0
    while total < size:
        k += 1
        if kind == "short":
            lines.append(f"{chr(97 + k % 26)}{chr(97 + k // 26 % 26)}{chr(97 + k // 676 % 26)}=1\n")
        elif kind == "words":
            lines.append(" ".join(f"w{k}_{j}" for j in range(8)) + "\n")
        elif kind == "methods":
            lines.append(f"class C{k}:\n    def m_{k}(self, x):\n        return x.attr_{k}\n\n")
        elif kind == "camel":  # long names of many word parts
            lines.append(f"def getUserAccountRecord{k}ById{k}Fast(x):\n    pass\n")
        elif kind == "unicode":
            lines.append(f"value_{k} = '\U0001f600 \u00e9 {k}'\n")
        total += len(lines[-1])
    return "".join(lines)


@pytest.mark.parametrize("kind", ["short", "words", "methods", "camel", "unicode"])
def test_the_memory_estimate_is_above_what_a_file_holds(tmp_path: Path, kind: str) -> None:
    """``held_bytes`` (what ``max_memory_bytes`` counts) is at least what tracemalloc sees the index
    hold for the file, with all that lookups fill in (line sizes, names' values and definitions)."""
    from langchain_starcoder.repo.memory import held_bytes
    from langchain_starcoder.repo.symbols import name_parts

    (tmp_path / "m.py").write_text(dense(kind, 60_000))
    RepoIndex(tmp_path)  # the grammar and its queries are loaded once per process: not the file's
    name_parts.cache_clear()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        index = RepoIndex(tmp_path)
        entry: FileEntry = index._entries["m.py"]
        for i in range(len(entry.lines)):  # what lookups fill in, at most
            entry.line_size(i)
        for name in list(index._tables.defined):
            index._tables.name_values(name)
            index._tables.shortest(name)
        name_parts.cache_clear()  # a bounded cache of its own, not the file's
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held > 20 * 60_000, "precondition: dense code costs the index many bytes per byte"
    assert held <= held_bytes(entry) <= 2.5 * held


def test_max_memory_bytes_leaves_files_out_with_one_notice_and_frees_what_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langchain_starcoder.repo.memory import RepoMemoryNotice, held_bytes

    for i in range(10):
        (tmp_path / f"m{i}.py").write_text(dense("short", 5_000).replace("=1", f"={i}"))
    one = held_bytes(FileEntry.build("m0.py", (tmp_path / "m0.py").read_text()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        index = RepoIndex(tmp_path, max_memory_bytes=int(3.5 * one))
        index.refresh()
        assert len(index.files) == 3
        parsed: list[str] = []
        build = FileEntry.build
        monkeypatch.setattr(FileEntry, "build", lambda path, text: parsed.append(path) or build(path, text))
        (tmp_path / "m0.py").unlink()  # room for one more: taken by the next file that changes
        (tmp_path / "m9.py").write_text(dense("short", 5_000))
        files = index.files
    assert "m0.py" not in files and "m9.py" in files and len(files) == 3
    assert parsed == ["m9.py"]  # the files left out are not parsed again until they change
    notices = [w for w in caught if issubclass(w.category, RepoMemoryNotice)]
    assert len(notices) == 1 and "max_memory_bytes" in str(notices[0].message)
    assert index._held_total <= 3.5 * one


def test_the_token_counts_kept_for_lookups_are_bounded_in_characters_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Lines of files that changed since are no longer the index's: a counter keeps at most
    ``MAX_COUNTED_CHARS`` characters of them, however long the lines."""
    from langchain_starcoder.repo import chunks

    monkeypatch.setattr(chunks, "MAX_COUNTED_CHARS", 10_000)
    counts = chunks.TokenCounts(words)
    for i in range(200):
        counts.line(f"{i} " + "x" * 1_990)
    assert sum(map(len, counts._lines)) <= 10_000 + 2_000
    assert counts.line("199 " + "x" * 1_990) == 2  # still counted right


# --- retrievers (item 19) ---------------------------------------------------------------------------


def test_repo_node_retriever_is_importable_where_the_llama_index_llm_is() -> None:
    from langchain_starcoder.llama_index import RepoNodeRetriever, StarCoder  # noqa: F401
    from langchain_starcoder.retrievers.llama_index import RepoNodeRetriever as Defined

    assert RepoNodeRetriever is Defined


@pytest.mark.parametrize(
    "query",
    [
        "Inventory low_stock restock",
        "restock the inventory when stock is low",
        "order total with a discount code and tax for the customer's country",
        "from shop.pricing import apply_discount\n\ntotal = compute_tax(order)\n\ndef f(o):\n    return a",
    ],
)
@pytest.mark.parametrize("k", [2, 4, 10])
def test_a_retriever_returns_each_file_once_in_its_own_lines(query: str, k: int) -> None:
    index = RepoIndex(SAMPLE_REPO)
    docs = RepoRetriever(index=index, k=k, max_tokens=1024).invoke(query)
    paths = [d.metadata["path"] for d in docs]
    assert docs and len(paths) == len(set(paths)) and len(docs) <= k
    cost = sum(-(-len(d.metadata["path"]) // 4) + -(-len(d.page_content) // 4) + 2 for d in docs)
    assert cost <= 1024
    for d in docs:
        source = (SAMPLE_REPO / d.metadata["path"]).read_text().split("\n")
        at = -1
        for line in d.page_content.split("\n"):
            if line != GAP_MARKER:
                at = source.index(line, at + 1)  # the file's own lines, in order
