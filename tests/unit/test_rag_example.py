"""examples/rag_code_assistant.py (context from a RepoIndex) and examples/infill_repo_context.py,
run offline on the tiny checkpoint."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from langchain_starcoder import FIMRequest, RepoIndex, StarCoderEngine
from langchain_starcoder.fim import ContextFile, build_fim_prompt

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SAMPLE_REPO = EXAMPLES / "sample_repo"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_script(name: str, *args: str) -> str:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def section(out: str, name: str) -> str:
    match = re.search(rf"^--- {name} ---\n(.*?)^--- ", out, re.S | re.M)
    assert match, out
    return match.group(1)


@pytest.fixture(scope="module")
def rag() -> ModuleType:
    return load_example("rag_code_assistant")


def test_sample_repo_is_a_small_related_package() -> None:
    files = sorted(p.relative_to(SAMPLE_REPO).as_posix() for p in SAMPLE_REPO.rglob("*.py"))
    assert 5 <= len(files) <= 8
    orders = (SAMPLE_REPO / "shop" / "orders.py").read_text()
    assert "from .pricing import" in orders and "from .inventory import" in orders


def test_rag_script_streams_a_middle_with_the_index_context(
    tiny_path: Path, tiny_engine: StarCoderEngine, rag
) -> None:
    out = run_script("rag_code_assistant.py", "--model", str(tiny_path), "--max-tokens", "8")
    rows = re.findall(r"^  (\S+\.py)  \d+ tokens, \d+ lines(  \(again: .+\))?$", out, re.M)
    listed = [path for path, _ in rows]
    # A file in both parts of the context (its stable outline, then code near the cursor) says so again.
    assert [bool(again) for _, again in rows] == [path in listed[:i] for i, path in enumerate(listed)]
    # The context is what the engine picks from a RepoIndex of the folder, in the budget the hole leaves.
    text = (SAMPLE_REPO / "shop" / "orders.py").read_text()
    hole = rag.make_hole(text, '"""What the customer pays', None)
    request = FIMRequest(
        hole.prefix,
        hole.suffix,
        repo=RepoIndex(SAMPLE_REPO),
        repo_name="sample_repo",
        file_path="shop/orders.py",
    )
    prompt = tiny_engine.fim_prompt(request, 8)
    assert listed == [f.path for f in prompt.files_kept]
    assert f"Prompt: {len(prompt.token_ids)} tokens" in out
    # The edited file imports pricing, models and inventory: they are there, the edited file is not.
    assert {"shop/pricing.py", "shop/models.py", "shop/inventory.py"} <= set(listed)
    assert "shop/orders.py" not in listed
    assert "return round_money(discounted + tax_for(" in section(out, "original")
    stats = re.search(
        r"finish_reason=(\w+) prompt_tokens=(\d+) cached_tokens=\d+ completion_tokens=(\d+)", out
    )
    assert stats and int(stats.group(3)) >= 1
    assert int(stats.group(2)) == len(prompt.token_ids) <= tiny_engine.context_window - 8

    # The streamed middle is what the engine infills for that request.
    expected = tiny_engine.infill(request, max_tokens=8)
    assert expected.text.strip(), "precondition: the tiny model writes something here"
    assert section(out, "middle") == expected.text + "\n"
    assert stats.group(1) == expected.finish_reason


def test_rag_hole_at_a_position(tiny_path: Path, rag, capsys, monkeypatch) -> None:
    argv = [
        "rag_code_assistant.py",
        "--model",
        str(tiny_path),
        "--file",
        "shop/reports.py",
        "--position",
        "31:4",
        "--max-tokens",
        "4",
        "--max-prompt-tokens",
        "1600",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    rag.main()
    out = capsys.readouterr().out
    listed = re.findall(r"^  (\S+\.py)  \d+ tokens", out, re.M)
    assert listed and "shop/reports.py" not in listed
    assert int(re.search(r"^Prompt: (\d+) tokens", out, re.M).group(1)) <= 1600
    assert "--- original ---" not in out and "--- middle ---" in out


def test_make_hole(rag) -> None:
    text = "a = 1\n\ndef f():\n    x = 2\n    return x\n\nb = 3\n"
    hole = rag.make_hole(text, "def f", None)
    assert hole.prefix == "a = 1\n\ndef f():\n"
    assert hole.removed == "    x = 2\n    return x\n"
    assert hole.prefix + hole.removed + hole.suffix == text
    at = rag.make_hole(text, None, "4:4")
    assert (at.prefix, at.suffix, at.removed) == (
        "a = 1\n\ndef f():\n    ",
        "x = 2\n    return x\n\nb = 3\n",
        "",
    )


def test_repo_context_script(tiny_path: Path, tiny_engine: StarCoderEngine) -> None:
    out = run_script(
        "infill_repo_context.py", "--model", str(tiny_path), "--max-tokens", "6", "--show-prompt"
    )
    assert "Context files: shop/orders.py, shop/models.py" in out
    assert "<repo_name>sample_repo<file_sep>shop/orders.py\n" in out
    assert "<file_sep><fim_prefix>shop/reports.py\n" in out
    example = load_example("infill_repo_context")
    files = [ContextFile(p, (SAMPLE_REPO / p).read_text()) for p in ("shop/orders.py", "shop/models.py")]
    kwargs = dict(
        context_files=files,
        repo_name="sample_repo",
        file_path="shop/reports.py",
        max_prompt_tokens=tiny_engine.context_window - 6,
    )
    prompt = build_fim_prompt(tiny_engine, example.PREFIX, example.SUFFIX, **kwargs)
    assert f"Prompt: {len(prompt.token_ids)} tokens" in out
    expected = tiny_engine.infill(example.PREFIX, example.SUFFIX, max_tokens=6, **kwargs)
    assert section(out, "middle") == expected.text + "\n"
    assert f"finish_reason={expected.finish_reason} completion_tokens={expected.completion_tokens}" in out
