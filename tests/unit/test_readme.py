"""Every code block of the README and of docs/*.md runs, offline, on a built checkpoint instead of the hub
model; their links lead somewhere, and the claims the pages make about the project hold."""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCED = re.compile(r"```(\w+)\n(.*?)```", flags=re.S)
BLOCKS = FENCED.findall(README)
# Every block of every page, with where it is: (page, language, code).
ALL_BLOCKS = [
    (page.relative_to(ROOT).as_posix(), lang, code)
    for page in PAGES
    for lang, code in FENCED.findall(page.read_text())
]
# python blocks run offline here; py blocks need a server (tests/integration runs them against one);
# bash blocks are the commands checked below; sh, text and yaml are shown, not run.
LANGUAGES = {"python", "py", "bash", "sh", "text", "yaml"}
HUB_MODEL = "mlx-community/starcoder2-3b-4bit"
INSTALL = "python3 -m venv .venv && . .venv/bin/activate && "


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run(args, cwd=cwd, env=environment, capture_output=True, text=True, timeout=300)


def python_blocks() -> list[str]:
    return [code for _, lang, code in ALL_BLOCKS if lang == "python"]


def python_block_ids() -> list[str]:
    pages = [page for page, lang, _ in ALL_BLOCKS if lang == "python"]
    return [f"{page}-{pages[:i].count(page)}" for i, page in enumerate(pages)]


def test_the_readme_has_the_blocks_we_expect() -> None:
    langs = [lang for lang, _ in BLOCKS]
    assert langs.count("python") >= 4 and langs.count("bash") >= 3
    assert all(HUB_MODEL in code for code in python_blocks())


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_block_of_a_page_is_one_the_tests_know(page: Path) -> None:
    """A block without a language, or with one not listed, would be skipped here without a word."""
    text = page.read_text()
    assert text.count("```") == 2 * len(FENCED.findall(text)), "a code block without a language"
    assert {lang for lang, _ in FENCED.findall(text)} <= LANGUAGES


@pytest.mark.parametrize("index", range(len(python_blocks())), ids=python_block_ids())
def test_python_block(index: int, tiny_path: Path, tmp_path: Path) -> None:
    code = python_blocks()[index].replace(HUB_MODEL, str(tiny_path))
    result = run([sys.executable, "-c", code], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip()


@pytest.mark.parametrize("index", range(len(python_blocks())), ids=python_block_ids())
def test_python_block_uses_every_name_it_imports(index: int) -> None:
    tree = ast.parse(python_blocks()[index])
    imported = {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert imported <= used, f"imported, never used: {sorted(imported - used)}"


def test_the_two_commands(tmp_path: Path) -> None:
    """The first command's run step works offline; the second is exactly what CI runs."""
    first, second = (code.strip() for lang, code in BLOCKS if lang == "bash" and INSTALL in code)
    run_step = first.split("pip install -e . && ", 1)[1]
    assert run_step == "python examples/quickstart.py"
    result = run([sys.executable, str(ROOT / "examples/quickstart.py")], ROOT, HOME=str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "offline checkpoint" in result.stdout
    ci = (ROOT / ".ci/run").read_text()
    install, vllm, test = second.split(INSTALL, 1)[1].split(" && ")
    # The install carries the build settings of llama-server itself, as CI sets them (not a note after it).
    words = shlex.split(install)
    settings = dict(word.split("=", 1) for word in words if re.fullmatch(r"[A-Z_]+=.*", word))
    command = shlex.join(words[len(settings) :]).replace("'", '"')
    assert settings == dict(re.findall(r'^export (\w+)="\$\{\1:-(.*)\}"$', ci, flags=re.M))
    assert set(settings) == {"CMAKE_ARGS", "LLAMA_CPP_BUILD_JOBS"}
    assert command == 'pip install -e ".[test]"' and f"\n{command}\n" in ci
    # Then vLLM's CPU build into its own venv (the real vLLM server's tests), then the tests.
    assert vllm == "python -m langchain_starcoder.testing.vllm_install"
    assert test == "python -m pytest" and ci.rstrip().endswith(f"\n{vllm}\n{test}")


def test_command_line_block(tmp_path: Path) -> None:
    (block,) = (code for _, lang, code in ALL_BLOCKS if lang == "bash" and "langchain-starcoder " in code)
    script = block.replace("langchain-starcoder ", f"{sys.executable} -m langchain_starcoder ")
    result = run(["bash", "-euo", "pipefail", "-c", script], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "tiny-q8" / "config.json").is_file()
    assert "starcoder2" in result.stdout


# Offline, a block that names the hub model ends in the loader's own message. Its traceback is the
# caller's call stack and nothing else: no chained hub exceptions (huggingface_hub's and httpx's frames
# were 50 of the 65-91 lines). That stack is at most 16 frames (the LangChain block: 9 of them are
# LangChain's Runnable plumbing in chain.stream) of at most 2 lines each, plus Python 3.11+'s caret
# lines under some of them (47 lines); 50 bounds that with room for a frame more.
MAX_TRACEBACK_LINES = 50


@pytest.mark.parametrize("index", range(len(python_blocks())), ids=python_block_ids())
def test_python_block_verbatim_offline_ends_in_a_short_traceback(index: int, tmp_path: Path) -> None:
    code = python_blocks()[index]
    # An empty hub cache: offline, the model cannot be had.
    result = run([sys.executable, "-c", code], tmp_path, HOME=str(tmp_path), HF_HOME=str(tmp_path / "hf"))
    assert result.returncode == 1
    lines = result.stderr.rstrip().splitlines()
    assert lines[-1].startswith(
        "langchain_starcoder.errors.ModelNotFoundError: Could not download 'mlx-community/starcoder2-3b-4bit'"
    )
    assert lines.count("Traceback (most recent call last):") == 1, result.stderr
    assert len(lines) <= MAX_TRACEBACK_LINES, result.stderr


def test_every_install_command_works_from_the_checkout() -> None:
    """The package is not on PyPI yet: `pip install langchain-starcoder[...]` fails; `-e .[...]` works."""
    docs = [
        *PAGES,
        ROOT / "benchmarks" / "RESULTS.md",
        *sorted((ROOT / "examples").glob("*.py")),
        *sorted((ROOT / "notebooks").glob("*.ipynb")),
    ]
    from_index = re.compile(r"pip install\s+(?:-U\s+)?[\"']?langchain-starcoder")
    found = [f"{p.name}: {m.group(0)}" for p in docs for m in from_index.finditer(p.read_text())]
    assert not found
    install = re.compile(r'pip install -e "\.\[([\w-]+)\]"')
    extras = {extra for page in PAGES for extra in install.findall(page.read_text())}
    assert {"openblas", "examples", "test", "server", "llama-index"} <= extras


def test_the_speed_tables_say_which_shape_each_figure_is_for() -> None:
    section = (ROOT / "docs" / "benchmarks.md").read_text()
    tables = re.findall(r"((?:^\|.*\|\n)+)", section, flags=re.M)
    default_model, comparisons = tables
    # The default model's own figures, at its real depth, and the command that measured them.
    assert "30 layers (the real depth)" in default_model.splitlines()[0]
    assert {"decode tokens/s", "prefill tokens/s"} <= {
        row.split(" | ")[0].strip("| ") for row in default_model.splitlines()[2:]
    }
    assert "`python -m benchmarks --only fullmodel`" in section
    # Every comparison row names its shape.
    header, _, *rows = comparisons.splitlines()
    assert header.split(" | ")[1] == "Shape"
    assert all(re.search(r"narrow|layers? of 3b", row.split(" | ")[1]) for row in rows)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.+)$", FENCED.sub("", page.read_text()), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def relative_links(page: Path) -> list[str]:
    """The targets of a page's Markdown links that are not a URL, outside code blocks and inline code."""
    prose = re.sub(r"`[^`\n]*`", "", FENCED.sub("", page.read_text()))
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", prose) if not re.match(r"[a-z]+:", target)]


def test_the_link_helpers_see_links_and_anchors() -> None:
    """The link check below is only as good as what these find: the README's own links and headings."""
    readme = ROOT / "README.md"
    assert "docs/fim.md" in relative_links(readme)
    assert {"two-commands", "fill-in-the-middle-with-repository-context", "documentation"} <= anchors(readme)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.is_file() or ROOT not in file.parents:
            broken.append(f"{target}: no such file in the checkout")
        elif anchor and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_readme_links_every_docs_page_and_each_opens_with_what_it_is_for() -> None:
    listed = README.split("\n## Documentation\n", 1)[1]
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in listed, f"the README's Documentation list misses docs/{page.name}"
        title, opening = page.read_text().split("\n\n", 2)[:2]
        assert title.startswith("# ") and opening.startswith("What you can do here: "), page.name


def extras_table(pyproject: str) -> str:
    return pyproject.split("\n[project.optional-dependencies]\n", 1)[1].split("\n[", 1)[0]


def test_every_extra_the_pages_name_exists() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    declared = set(re.findall(r"^([\w-]+) = \[", extras_table(pyproject), flags=re.M))
    named = {extra for page in PAGES for extra in re.findall(r'"\.\[([\w-]+)\]"', page.read_text())}
    assert named <= declared, f"extras no pyproject.toml declares: {sorted(named - declared)}"


def readme_section(title: str) -> str:
    return README.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_says_what_the_fast_paths_answers_equal() -> None:
    """The managed llama.cpp backend converts a 4-bit checkpoint to q4_0, quantizing it again: its answers
    are close to the model's, not equal (issue 29, item 17); full-precision ones convert as they are."""
    from langchain_starcoder.engine.building import _auto_outtype

    section = " ".join(readme_section("Scaling out").split())
    assert "with answers equal to the model's" not in section  # the claim that did not hold
    assert _auto_outtype({"quantization": {"bits": 4, "group_size": 64}}) == "q4_0"
    dtypes = ("float32", "float16", "bfloat16")
    assert [_auto_outtype({"torch_dtype": t}) for t in dtypes] == ["f32", "f16", "f16"]
    assert "float16 and bfloat16 weights run as f16" in section
    assert "from float32 weights they equal the model's" in section
    assert "4-bit to `q4_0`" in section and "close to the model's, not equal" in section
    assert "offline, pass `tokenizer=`" in section  # the remote example's way to run offline


def test_the_readme_names_the_fast_path_where_the_quickstart_runs(tmp_path: Path) -> None:
    """Right after the first command, for Linux users: the flag the quickstart takes, and the extra."""
    section = " ".join(readme_section("Two commands").split())
    command = "python examples/quickstart.py --backend llama.cpp"
    assert command in section and 'pip install -e ".[llama-cpp]"' in section
    result = run([sys.executable, str(ROOT / "examples/quickstart.py"), "--help"], tmp_path)
    assert result.returncode == 0 and "--backend {mlx,llama.cpp}" in result.stdout
