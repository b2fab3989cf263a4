"""The examples: quickstart.py, async_streaming.py and chat_instruct.py run on built checkpoints; every
example falls back offline the same way; the ``examples`` extra installs what they import."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from langchain_starcoder import ChatStarCoder, ModelNotFoundError, UnsupportedModelError
from langchain_starcoder.testing import INSTRUCT_CHAT_TEMPLATE

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))


def load_example(name: str) -> ModuleType:
    """Import an example script afresh."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tmp_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME in a temporary folder, so offline fallbacks write nothing to the real ~/.cache."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


# --- quickstart ------------------------------------------------------------------------------------------


def test_quickstart_on_a_local_checkpoint(capsys, monkeypatch, tiny_path, tiny_engine):
    quickstart = load_example("quickstart")
    monkeypatch.setattr(sys, "argv", ["quickstart.py", "--model", str(tiny_path), "--max-tokens", "12"])
    quickstart.main()
    out = capsys.readouterr().out
    prompt = "def fibonacci(n):\n    "
    expected = tiny_engine.generate(prompt, max_tokens=12, stop=["\ndef ", "\nclass "])
    assert (
        out == f"{prompt}{expected.text}\n\n[{expected.finish_reason}: {expected.completion_tokens} tokens]\n"
    )


def test_quickstart_runs_on_llama_cpp_with_one_flag(tiny_path: Path, tmp_path: Path) -> None:
    """``--backend llama.cpp``: the fast path on Linux; the first load's conversion shows its progress."""
    env = {**os.environ, "LANGCHAIN_STARCODER_CACHE": str(tmp_path / "cache")}
    args = ["--model", str(tiny_path), "--max-tokens", "6", "--backend", "llama.cpp"]
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("def fibonacci(n):\n    ")
    assert re.search(r"\[(stop|length): \d+ tokens\]\n$", result.stdout)
    assert f"Converting {tiny_path.name} to GGUF: 100%" in result.stderr  # the example asks for progress
    assert list((tmp_path / "cache" / "gguf").glob("*.gguf"))  # converted once, kept


def test_quickstart_falls_back_offline_to_a_built_checkpoint(tmp_home):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HOME=str(tmp_home), HF_HUB_OFFLINE="1")  # the hub cache is under the new HOME too
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "quickstart.py"), "--max-tokens", "6"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    offline = tmp_home / ".cache" / "langchain-starcoder" / "offline-tiny"
    assert f"Using an offline checkpoint with random weights at {offline}" in result.stdout
    assert (offline / "config.json").is_file()
    assert re.search(r"\[(stop|length): \d+ tokens\]", result.stdout)


# --- async streaming ---------------------------------------------------------------------------------------


def labelled_chunks(out: str) -> dict[str, list[str]]:
    chunks: dict[str, list[str]] = {}
    for line in out.splitlines():
        m = re.match(r"\[\s*(\w+)\] (.*)$", line)
        if m:
            chunks.setdefault(m.group(1), []).append(ast.literal_eval(m.group(2)))
    return chunks


def test_async_streaming_prints_labelled_chunks(capsys, tiny_path, tiny_engine):
    example = load_example("async_streaming")
    texts = example.main(["--model", str(tiny_path), "--max-tokens", "10"])
    out = capsys.readouterr().out
    assert set(texts) == set(example.REQUESTS)
    chunks = labelled_chunks(out)
    assert set(chunks) == set(example.REQUESTS)
    for label, prompt in example.REQUESTS.items():
        expected = tiny_engine.generate(prompt, max_tokens=10, stop=["\ndef ", "\nclass "]).text
        assert texts[label] == expected
        assert "".join(chunks[label]) == expected  # the labelled chunks add up to the completion
        assert f"=== {label} ===\n{prompt}{expected}" in out
    assert len(chunks["fib"]) > 1  # streamed, not printed once at the end
    assert re.search(r"The event loop ticked \d+ times", out)


def test_async_streaming_falls_back_offline(capsys, tmp_home):
    example = load_example("async_streaming")
    texts = example.main(["--max-tokens", "4"])
    out = capsys.readouterr().out
    offline = tmp_home / ".cache" / "langchain-starcoder" / "offline-tiny"
    assert f"Using an offline checkpoint with random weights at {offline}" in out
    assert (offline / "config.json").is_file()
    assert set(texts) == set(example.REQUESTS)


# --- chat with an instruct checkpoint ----------------------------------------------------------------


def test_chat_instruct_streams_two_turns(capsys, chat_path):
    example = load_example("chat_instruct")
    answers = example.main(["--model", str(chat_path), "--max-tokens", "12"])
    out = capsys.readouterr().out
    assert len(answers) == 2
    first = [SystemMessage(example.SYSTEM), HumanMessage(example.QUESTIONS[0])]
    expected = ChatStarCoder(model=str(chat_path), max_tokens=12).invoke(first)
    assert answers[0].content == expected.content
    for question, answer in zip(example.QUESTIONS, answers, strict=True):
        assert f">>> {question}" in out
        assert answer.content in out
        assert answer.usage_metadata["output_tokens"] > 0
    # The second prompt begins with the first exchange, which the prompt cache already holds.
    first_prompt = answers[0].usage_metadata["input_tokens"]
    second = answers[1].usage_metadata
    assert second["input_tokens"] > first_prompt
    assert second["input_token_details"]["cache_read"] >= first_prompt - 1
    assert f"({second['input_token_details']['cache_read']} from the prompt cache)" in out


def test_chat_instruct_needs_a_template_for_a_base_model(capsys, tiny_path, tmp_path):
    example = load_example("chat_instruct")
    with pytest.raises(UnsupportedModelError, match="chat template"):
        example.main(["--model", str(tiny_path), "--max-tokens", "4"])
    template = tmp_path / "template.jinja"
    template.write_text(INSTRUCT_CHAT_TEMPLATE, encoding="utf-8")
    answers = example.main(["--model", str(tiny_path), "--max-tokens", "4", "--chat-template", str(template)])
    assert len(answers) == 2
    assert all(1 <= a.usage_metadata["output_tokens"] <= 4 for a in answers)


def test_chat_instruct_falls_back_offline(capsys, tmp_home):
    example = load_example("chat_instruct")
    answers = example.main(["--max-tokens", "4"])
    out = capsys.readouterr().out
    offline = tmp_home / ".cache" / "langchain-starcoder" / "offline-tiny-instruct"
    assert f"Using an offline instruct checkpoint with random weights at {offline}" in out
    config = (offline / "tokenizer_config.json").read_text()
    assert "### Instruction" in config  # built with the instruct chat template
    assert len(answers) == 2


# --- every example, offline ----------------------------------------------------------------------------

#: The arguments that keep each example short; none names a model.
SHORT = {
    "async_streaming.py": ["--max-tokens", "2"],
    "chat_instruct.py": ["--max-tokens", "2"],
    "infill_repo_context.py": ["--max-tokens", "2"],
    "lcel_chain.py": ["--max-tokens", "2"],
    "llama_index_query.py": ["--max-tokens", "2"],
    "quickstart.py": ["--max-tokens", "2"],
    "rag_code_assistant.py": ["--max-tokens", "2"],
}


@pytest.fixture(scope="module")
def offline_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One HOME for every example run offline, so the offline checkpoints are built once."""
    return tmp_path_factory.mktemp("home")


def test_every_example_is_covered() -> None:
    assert sorted(SHORT) == SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_example_falls_back_offline_the_same_way(script: str, offline_home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HOME=str(offline_home), HF_HUB_OFFLINE="1")  # the hub cache is under the new HOME too
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *SHORT[script]],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    kind, name = (
        ("instruct ", "offline-tiny-instruct") if script == "chat_instruct.py" else ("", "offline-tiny")
    )
    offline = offline_home / ".cache" / "langchain-starcoder" / name
    lines = result.stdout.splitlines()
    # First the reason (the loader's one-line message), then where it runs instead.
    assert lines[0].startswith("Could not download 'mlx-community/starcoder2-"), result.stdout[:500]
    assert lines[1] == f"-> Using an offline {kind}checkpoint with random weights at {offline}."
    assert (offline / "config.json").is_file()


def test_only_the_default_falls_back(tmp_path: Path, tmp_home: Path, capsys) -> None:
    from langchain_starcoder._registry import DEFAULT_MODEL
    from langchain_starcoder.testing import model_or_offline

    folder = tmp_path / "no-such-checkpoint"
    with pytest.raises(ModelNotFoundError, match="No model folder at"):
        model_or_offline(str(folder))
    with pytest.raises(ModelNotFoundError, match="Could not download 'owner/other'"):
        model_or_offline("owner/other")
    assert not (tmp_home / ".cache").exists() and not capsys.readouterr().out
    assert model_or_offline(DEFAULT_MODEL) == str(
        tmp_home / ".cache" / "langchain-starcoder" / "offline-tiny"
    )


def test_the_model_from_the_environment_falls_back_or_is_named_in_the_error(
    tmp_path: Path, tmp_home: Path, tiny_path: Path, monkeypatch, capsys
) -> None:
    from langchain_starcoder.testing import MODEL_ENV, model_or_offline

    monkeypatch.setenv(MODEL_ENV, str(tiny_path))
    assert model_or_offline() == str(tiny_path)
    missing = tmp_path / "no-such-checkpoint"
    monkeypatch.setenv(MODEL_ENV, str(missing))
    with pytest.raises(ModelNotFoundError) as caught:
        model_or_offline()
    message = str(caught.value)
    assert f"No model folder at {missing}" in message and f"came from ${MODEL_ENV}" in message
    assert "unset it to use mlx-community/starcoder2-3b-4bit" in message
    assert not capsys.readouterr().out  # no fallback for a model the user chose
    monkeypatch.delenv(MODEL_ENV)
    offline = tmp_home / ".cache" / "langchain-starcoder" / "offline-tiny"
    assert model_or_offline() == str(offline)  # unset: the default, offline: the stand-in
    assert "Using an offline checkpoint" in capsys.readouterr().out


def test_a_model_that_can_be_had_is_returned_as_named(tiny_path: Path, capsys) -> None:
    from langchain_starcoder.testing import model_or_offline

    assert model_or_offline(str(tiny_path)) == str(tiny_path)
    assert not capsys.readouterr().out


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_example_names_the_extra_in_its_header(script: str) -> None:
    docstring = ast.get_docstring(ast.parse((EXAMPLES / script).read_text()))
    assert 'pip install -e ".[examples]"' in docstring


@pytest.mark.parametrize("script", SCRIPTS)
def test_what_each_example_header_names_exists_where_it_says(script: str) -> None:
    """``langchain_starcoder.x.name`` in a header is importable; the offline helper is named by its home."""
    source = (EXAMPLES / script).read_text()
    docstring = ast.get_docstring(ast.parse(source)) or ""
    for dotted in re.findall(r"``(langchain_starcoder(?:\.\w+)+)``", docstring):
        module, _, name = dotted.rpartition(".")
        try:
            importlib.import_module(dotted)
        except ImportError:
            assert hasattr(importlib.import_module(module), name), f"{script} names {dotted}"
    if "model_or_offline(" in source:
        assert "``langchain_starcoder.testing.model_or_offline``" in " ".join(docstring.split())


# --- what installs the examples' imports ---------------------------------------------------------------

ROOT = EXAMPLES.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _imports(source: str) -> set[str]:
    """Absolute module names a piece of code imports (IPython magics and shell lines skipped)."""
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    names: set[str] = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def third_party_imports() -> dict[str, set[str]]:
    """module -> the examples and notebooks that import it, leaving out the standard library and ours."""
    import nbformat

    sources = {p.name: p.read_text() for p in EXAMPLES.glob("*.py")}
    for path in NOTEBOOKS:
        cells = nbformat.read(path, as_version=4).cells
        sources[path.name] = "\n".join(c.source for c in cells if c.cell_type == "code")
    found: dict[str, set[str]] = {}
    for where, source in sources.items():
        for module in _imports(source):
            top = module.split(".")[0]
            if top in sys.stdlib_module_names or top in ("langchain_starcoder", "__future__"):
                continue
            found.setdefault(module, set()).add(where)
    return found


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distribution_of(module: str) -> str:
    """The installed distribution whose files hold ``module`` (namespace packages: the exact module)."""
    from importlib.metadata import distribution, packages_distributions

    origin = Path(importlib.util.find_spec(module).origin).resolve()
    for name in packages_distributions().get(module.split(".")[0], []):
        dist = distribution(name)
        if any(Path(dist.locate_file(f)).resolve() == origin for f in dist.files or []):
            return _normalize(dist.metadata["Name"])
    raise AssertionError(f"no installed distribution provides {module} ({origin})")


def requirement_names(extra: str | None) -> set[str]:
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return {_normalize(Requirement(r).name) for r in reqs}


@pytest.mark.parametrize("extra", ["examples", "test"])
def test_the_extra_installs_every_third_party_import_of_the_examples_and_notebooks(extra: str) -> None:
    provided = requirement_names(None) | requirement_names(extra)
    found = third_party_imports()
    assert "llama_index.core" in found and "matplotlib.pyplot" in found  # the parsing sees them
    missing = {m: sorted(where) for m, where in found.items() if distribution_of(m) not in provided}
    assert not missing, f"not installed by the core dependencies or [{extra}]: {missing}"


def test_the_examples_extra_brings_jupyter() -> None:
    assert {"jupyterlab", "ipykernel"} <= requirement_names("examples")


@pytest.mark.parametrize("extra", ["examples", "test"])
def test_the_extras_that_run_the_notebooks_bring_ipywidgets(extra: str) -> None:
    """tqdm draws its notebook bars (the hub download's, ours) with ipywidgets; without it, a warning."""
    assert "ipywidgets" in requirement_names(extra)
