"""The ``langchain-starcoder`` command, run in-process (``cli.main``) and as a subprocess."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from langchain_starcoder import StarCoderEngine, cli
from langchain_starcoder.fim import ContextFile

REPO = Path(__file__).resolve().parents[2]
PROMPT = "def count_items(items):\n    "


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the command in-process; return (exit status, stdout, stderr)."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def stats(err: str) -> dict[str, int]:
    """The token counts of the statistics line on stderr."""
    m = re.search(r"\[(\w+)\] prompt: (\d+) tokens(?:, (\d+) cached)?.*generation: (\d+) tokens", err)
    assert m, err
    return {
        "finish": m.group(1),
        "prompt": int(m.group(2)),
        "cached": int(m.group(3) or 0),
        "completion": int(m.group(4)),
    }


def safetensors_header(file: Path) -> dict:
    with open(file, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def hidden_entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# --- generate ----------------------------------------------------------------------------------------


def test_generate_prints_exactly_the_completion(capsys, tiny_path, tiny_engine):
    expected = tiny_engine.generate(PROMPT, max_tokens=12)
    code, out, err = run(capsys, "generate", "--model", tiny_path, "--prompt", PROMPT, "--max-tokens", 12)
    assert code == 0
    assert out == expected.text  # stdout holds the text and nothing else
    counts = stats(err)
    assert counts["prompt"] == tiny_engine.count_tokens(PROMPT)
    assert counts["completion"] == expected.completion_tokens == 12
    assert counts["finish"] == "length"
    assert re.search(r"prompt: .* [\d.]+ tokens/s \| generation: .* [\d.]+ tokens/s", err)


def test_generate_streams_chunk_by_chunk(capsys, tiny_path, tiny_engine, monkeypatch):
    writes: list[str] = []
    monkeypatch.setattr(cli, "_out", writes.append)
    code = cli.main(["generate", "--model", str(tiny_path), "--prompt", PROMPT, "--max-tokens", "10"])
    assert code == 0
    chunks = [c.text for c in tiny_engine.stream(PROMPT, max_tokens=10) if c.text]
    assert len(writes) > 1  # written as the tokens arrive, not once at the end
    assert writes == chunks


def test_generate_honours_stop_with_escapes(capsys, tiny_path, tiny_engine):
    prompt = "class Stack:\n"
    chunks = [c.text for c in tiny_engine.stream(prompt, max_tokens=40)]
    # A stop string that starts with a newline, at a token boundary of the unconstrained output.
    k = next(i for i, text in enumerate(chunks) if i > 0 and text.startswith("\n") and chunks[i + 1])
    stop = chunks[k] + chunks[k + 1][:3]
    full = "".join(chunks)
    assert full.index(stop) == len("".join(chunks[:k]))
    code, out, err = run(
        capsys, "generate", "--model", tiny_path, "--prompt", prompt, "--max-tokens", 40,
        "--stop", stop.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t"),
    )  # fmt: skip
    assert code == 0
    assert out == full[: full.index(stop)]
    assert stats(err)["finish"] == "stop"


def test_generate_reads_prompt_from_file_and_stdin(capsys, tiny_path, tiny_engine, tmp_path, monkeypatch):
    expected = tiny_engine.generate(PROMPT, max_tokens=6).text
    prompt_file = tmp_path / "prompt.py"
    prompt_file.write_text(PROMPT, encoding="utf-8")
    assert (
        run(capsys, "generate", "--model", tiny_path, "--file", prompt_file, "--max-tokens", 6)[1] == expected
    )
    monkeypatch.setattr(sys, "stdin", io.StringIO(PROMPT))
    assert run(capsys, "generate", "--model", tiny_path, "--file", "-", "--max-tokens", 6)[1] == expected


def test_generate_sampling_options_reach_the_engine(capsys, tiny_path, tiny_engine):
    settings = {"temperature": 1.5, "top_k": 50, "seed": 7, "max_tokens": 16}
    expected = tiny_engine.generate(PROMPT, **settings).text
    assert expected != tiny_engine.generate(PROMPT, max_tokens=16).text  # sampling changes the text
    code, out, _ = run(
        capsys, "generate", "--model", tiny_path, "--prompt", PROMPT, "--max-tokens", 16,
        "--temperature", 1.5, "--top-k", 50, "--seed", 7,
    )  # fmt: skip
    assert (code, out) == (0, expected)


# --- errors --------------------------------------------------------------------------------------------


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_missing_model_folder_is_one_line(capsys, tmp_path):
    code, out, err = run(capsys, "generate", "--model", tmp_path / "nowhere", "--prompt", "x")
    assert code == 1 and out == ""
    assert "nowhere" in one_line(err)


def test_verbose_shows_the_traceback(capsys, tmp_path):
    code, _, err = run(capsys, "--verbose", "generate", "--model", tmp_path / "nowhere", "--prompt", "x")
    assert code == 1
    assert "Traceback" in err and "ModelNotFoundError" in err
    code, _, err = run(capsys, "info", "--model", tmp_path / "nowhere", "-v")  # after the command too
    assert code == 1 and "Traceback" in err


def test_hub_model_offline_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty hub cache
    code, _, err = run(capsys, "info", "--model", "mlx-community/starcoder2-3b-4bit")
    assert code == 1
    assert "cache" in one_line(err)


def test_argparse_errors_are_one_line(capsys, tiny_path):
    code, out, err = run(capsys, "generate", "--model", tiny_path)  # neither --prompt nor --file
    assert code == 2 and out == ""
    assert "--prompt" in one_line(err)
    code, _, err = run(capsys, "quantize", tiny_path, "x", "--bits", "3")
    assert code == 2 and "invalid choice" in one_line(err)
    code, _, err = run(capsys, "no-such-command")
    assert code == 2 and "no-such-command" in one_line(err)


def test_bad_generation_setting_fails_before_loading(capsys, tiny_path):
    code, _, err = run(capsys, "generate", "--model", tiny_path, "--prompt", "x", "--temperature", "-1")
    assert code == 1
    assert "temperature" in one_line(err)  # and no "Loaded ..." line: nothing was loaded


def test_help_exits_zero(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    for command in ("generate", "infill", "quantize", "build-test-model", "info", "bench"):
        assert command in out


# --- infill --------------------------------------------------------------------------------------------

SOURCE = 'def area(radius):\n    """Area of a circle."""\n    return <FILL>\n\n\nprint(area(2.0))\n'
HELPER = "import math\n\nPI = math.pi\n\n\ndef square(x):\n    return x * x\n"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    Path("geometry.py").write_text(SOURCE, encoding="utf-8")
    Path("helpers.py").write_text(HELPER, encoding="utf-8")
    return tmp_path


def test_infill_prints_only_the_middle(capsys, tiny_path, tiny_engine, project):
    prefix, suffix = SOURCE.split("<FILL>")
    expected = tiny_engine.infill(prefix, suffix, max_tokens=10)
    code, out, err = run(capsys, "infill", "--model", tiny_path, "--file", "geometry.py", "--max-tokens", 10)
    assert code == 0
    assert out == expected.text
    assert stats(err)["prompt"] == expected.prompt_tokens
    assert Path("geometry.py").read_text(encoding="utf-8") == SOURCE  # untouched without --write


def test_infill_with_repository_context(capsys, tiny_path, tiny_engine, project):
    prefix, suffix = SOURCE.split("<FILL>")
    expected = tiny_engine.infill(
        prefix, suffix, context_files=[ContextFile("helpers.py", HELPER)],
        repo_name="me/geometry", file_path="geometry.py", max_tokens=10,
    )  # fmt: skip
    plain = tiny_engine.infill(prefix, suffix, max_tokens=10)
    assert expected.prompt_tokens > plain.prompt_tokens
    code, out, err = run(
        capsys, "infill", "--model", tiny_path, "--file", "geometry.py", "--context", "helpers.py",
        "--repo-name", "me/geometry", "--max-tokens", 10,
    )  # fmt: skip
    assert code == 0
    assert out == expected.text
    assert stats(err)["prompt"] == expected.prompt_tokens


def test_infill_prefix_and_suffix_options(capsys, tiny_path, tiny_engine):
    expected = tiny_engine.infill("def f(x):\n    return ", "\n\nprint(f(1))\n", max_tokens=8)
    code, out, _ = run(
        capsys, "infill", "--model", tiny_path, "--prefix", r"def f(x):\n    return ",
        "--suffix", r"\n\nprint(f(1))\n", "--max-tokens", 8,
    )  # fmt: skip
    assert (code, out) == (0, expected.text)


def test_infill_write_fills_the_file_and_keeps_a_backup(capsys, tiny_path, tiny_engine, project):
    prefix, suffix = SOURCE.split("<FILL>")
    middle = tiny_engine.infill(prefix, suffix, max_tokens=10).text
    code, out, err = run(
        capsys, "infill", "--model", tiny_path, "--file", "geometry.py", "--write", "--max-tokens", 10
    )
    assert code == 0 and out == ""
    assert Path("geometry.py").read_text(encoding="utf-8") == prefix + middle + suffix
    assert Path("geometry.py.bak").read_text(encoding="utf-8") == SOURCE
    assert "geometry.py.bak" in err
    assert hidden_entries(project) == []  # no temporary file left behind


@pytest.mark.parametrize(
    ("text", "message"),
    [("def f():\n    pass\n", "no <FILL> marker"), ("<FILL>\nx = 1\n<FILL>\n", "2 <FILL> markers")],
)
def test_infill_marker_missing_or_repeated(capsys, tiny_path, project, text, message):
    Path("bad.py").write_text(text, encoding="utf-8")
    code, out, err = run(capsys, "infill", "--model", tiny_path, "--file", "bad.py", "--write")
    assert code == 1 and out == ""
    assert message in one_line(err)
    assert Path("bad.py").read_text(encoding="utf-8") == text
    assert not Path("bad.py.bak").exists()


def test_infill_argument_conflicts(capsys, tiny_path, project):
    code, _, err = run(capsys, "infill", "--model", tiny_path, "--prefix", "x", "--write")
    assert code == 1 and "--write" in one_line(err)
    code, _, err = run(capsys, "infill", "--model", tiny_path, "--file", "geometry.py", "--prefix", "x")
    assert code == 1 and "not both" in one_line(err)
    code, _, err = run(capsys, "infill", "--model", tiny_path)
    assert code == 1 and "--file" in one_line(err)
    code, _, err = run(capsys, "infill", "--model", tiny_path, "--file", "missing.py")
    assert code == 1 and "missing.py" in one_line(err)


def test_infill_custom_marker(capsys, tiny_path, tiny_engine, project):
    Path("m.py").write_text("x = [1, 2, ???]\n", encoding="utf-8")
    expected = tiny_engine.infill("x = [1, 2, ", "]\n", max_tokens=5).text
    code, out, _ = run(
        capsys, "infill", "--model", tiny_path, "--file", "m.py", "--marker", "???", "--max-tokens", 5
    )
    assert (code, out) == (0, expected)


# --- quantize --------------------------------------------------------------------------------------------


def test_quantize_writes_a_checkpoint_that_loads_and_runs(capsys, tiny_path, tmp_path):
    dst = tmp_path / "models" / "tiny-4bit"
    code, out, err = run(capsys, "quantize", tiny_path, dst, "--bits", 4, "--group-size", 64)
    assert code == 0 and out == ""
    assert "Quantizing to 4-bit" in err and "100%" in err  # the progress bar
    config = json.loads((dst / "config.json").read_text())
    assert config["quantization"] == {"group_size": 64, "bits": 4, "mode": "affine"}
    header = safetensors_header(dst / "model.safetensors")
    assert header["model.layers.0.mlp.c_fc.weight"]["dtype"] == "U32"
    scales = [v["dtype"] for k, v in header.items() if k.endswith(".scales")]
    assert scales and set(scales) == {"F16"}  # float16 scales, like mlx-community checkpoints
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (dst / name).read_bytes() == (tiny_path / name).read_bytes()
    assert hidden_entries(dst.parent) == []

    engine = StarCoderEngine.load(dst)
    try:
        completion = engine.generate(PROMPT, max_tokens=8)
        assert completion.completion_tokens == 8
        # The 4-bit model still sits close to the float one: the same first token, greedily.
        float_engine = StarCoderEngine.load(tiny_path)
        ids = float_engine.encode(PROMPT)
        q, f = engine.logits(ids)[-1], float_engine.logits(ids)[-1]
        float_engine.close()
        assert abs(q - f).max() < 0.5 * abs(f).max()
    finally:
        engine.close()


def test_quantize_8bit_group_32(capsys, tiny_path, tmp_path):
    dst = tmp_path / "tiny-8bit"
    assert run(capsys, "quantize", tiny_path, dst, "--bits", 8, "--group-size", 32, "--no-verify")[0] == 0
    assert json.loads((dst / "config.json").read_text())["quantization"]["bits"] == 8
    engine = StarCoderEngine.load(dst)
    assert engine.generate(PROMPT, max_tokens=3).completion_tokens == 3
    engine.close()


def test_quantize_refuses_to_overwrite_without_force(capsys, tiny_path, tmp_path):
    dst = tmp_path / "taken"
    dst.mkdir()
    (dst / "keep.txt").write_text("mine")
    code, _, err = run(capsys, "quantize", tiny_path, dst, "--no-verify")
    assert code == 1 and "--force" in one_line(err)
    assert [p.name for p in dst.iterdir()] == ["keep.txt"]
    assert run(capsys, "quantize", tiny_path, dst, "--force", "--no-verify")[0] == 0
    assert not (dst / "keep.txt").exists() and (dst / "config.json").exists()
    assert hidden_entries(tmp_path) == []


def test_quantize_refuses_a_quantized_source(capsys, tiny_path, tmp_path):
    dst = tmp_path / "q"
    assert run(capsys, "quantize", tiny_path, dst, "--no-verify")[0] == 0
    code, _, err = run(capsys, "quantize", dst, tmp_path / "qq")
    assert code == 1 and "already quantized" in one_line(err)
    assert not (tmp_path / "qq").exists()


@pytest.mark.parametrize("failure", [KeyboardInterrupt, OSError])
def test_quantize_leaves_nothing_behind_on_failure(capsys, tiny_path, tmp_path, monkeypatch, failure):
    import mlx_lm.utils

    def broken_save(path, model, **kwargs):
        (Path(path) / "model.safetensors").write_bytes(b"half")  # a partial write, then the failure
        raise failure("disk full" if failure is OSError else "")

    monkeypatch.setattr(mlx_lm.utils, "save_model", broken_save)
    code, _, _ = run(capsys, "quantize", tiny_path, tmp_path / "new")
    assert code == (130 if failure is KeyboardInterrupt else 1)
    assert not (tmp_path / "new").exists()
    assert hidden_entries(tmp_path) == []

    # Replacing with --force: the old folder survives a failed run untouched.
    old = tmp_path / "old"
    old.mkdir()
    (old / "keep.txt").write_text("mine")
    code, _, _ = run(capsys, "quantize", tiny_path, old, "--force")
    assert code != 0
    assert [p.name for p in old.iterdir()] == ["keep.txt"]
    assert hidden_entries(tmp_path) == []


# --- build-test-model and info ---------------------------------------------------------------------------


def test_build_test_model(capsys, tmp_path):
    dst = tmp_path / "built"
    code, out, _ = run(capsys, "build-test-model", dst, "--preset", "tiny", "--layers", 1, "--instruct")
    assert code == 0 and out.strip() == str(dst)
    assert json.loads((dst / "config.json").read_text())["num_hidden_layers"] == 1
    assert json.loads((dst / "tokenizer_config.json").read_text())["chat_template"]
    engine = StarCoderEngine.load(dst)
    assert engine.generate("def f():", max_tokens=2).completion_tokens == 2
    engine.close()
    code, _, err = run(capsys, "build-test-model", dst)
    assert code == 1 and "--force" in one_line(err)
    assert run(capsys, "build-test-model", dst, "--force", "--sliding-window", 0)[0] == 0
    assert json.loads((dst / "config.json").read_text())["sliding_window"] is None
    assert hidden_entries(tmp_path) == []


def test_info_counts_parameters_and_reads_the_config(capsys, tiny_path, tiny_engine, tmp_path):
    code, out, _ = run(capsys, "info", "--model", tiny_path, "--json")
    assert code == 0
    info = json.loads(out)
    parameters = sum(a.size for _, a in tree_flatten(tiny_engine.backend.model.parameters()))
    assert info["parameters"] == parameters
    config = json.loads((tiny_path / "config.json").read_text())
    assert info["layers"] == config["num_hidden_layers"]
    assert info["context_window"] == config["max_position_embeddings"]
    assert info["sliding_window"] == config["sliding_window"]
    assert info["quantization"] is None
    assert info["dtype"] == "float32"
    assert info["weight_bytes"] == (tiny_path / "model.safetensors").stat().st_size
    assert info["fim"] and info["repo_level_fim"] and not info["chat_template"]

    dst = tmp_path / "q4"
    assert run(capsys, "quantize", tiny_path, dst, "--no-verify")[0] == 0
    code, out, _ = run(capsys, "info", "--model", dst, "--json")
    quantized = json.loads(out)
    # The same architecture counts the same parameters, though they are packed 8 to a uint32.
    assert quantized["parameters"] == parameters
    assert quantized["quantization"] == {"bits": 4, "group_size": 64, "mode": "affine"}
    assert quantized["dtype"] == "float16"
    assert quantized["weight_bytes"] < info["weight_bytes"] / 3

    code, out, _ = run(capsys, "info", "--model", dst)
    assert code == 0
    assert re.search(r"quantization:\s+4-bit, group size 64", out)
    assert re.search(r"context:\s+2048 tokens, sliding window 512", out)
    assert "parameters:" in out and "weights:" in out and "architecture:" in out


def test_info_reads_the_model_from_the_environment(capsys, tiny_path, monkeypatch):
    monkeypatch.setenv(cli.MODEL_ENV, str(tiny_path))
    code, out, _ = run(capsys, "info", "--json")
    assert code == 0 and json.loads(out)["path"] == str(tiny_path)


# --- bench -----------------------------------------------------------------------------------------------


def test_bench_without_the_benchmarks_package_says_how_to_run_it(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not a checkout
    # As in an installed wheel: not importable (also when an earlier test imported it).
    monkeypatch.setitem(sys.modules, "benchmarks", None)
    monkeypatch.setitem(sys.modules, "benchmarks.__main__", None)
    code, _, err = run(capsys, "bench", "--help")
    assert code == 1
    assert "checkout" in one_line(err)


def test_bench_passes_its_arguments_to_the_benchmarks(capsys):
    code, out, _ = run(capsys, "bench", "--help")
    assert code == 0
    assert "usage: python -m benchmarks" in out and "--quick" in out
    code, _, err = run(capsys, "--verbose", "bench", "--no-such-option", "value")
    assert code == 2  # the benchmarks' own parser saw the options untouched
    assert "--no-such-option" in err


# --- as a program ----------------------------------------------------------------------------------------


def program(*argv: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run(
        [sys.executable, "-m", "langchain_starcoder", *map(str, argv)],
        capture_output=True, text=True, cwd=cwd, env=environment, timeout=300,
    )  # fmt: skip


def test_python_m_generate_stdout_is_just_the_text(tiny_path, tiny_engine):
    expected = tiny_engine.generate(PROMPT, max_tokens=8).text
    result = program("generate", "--model", tiny_path, "--prompt", PROMPT, "--max-tokens", 8)
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected
    assert "tokens/s" in result.stderr


def test_console_script_exits_non_zero_with_one_line(tmp_path):
    script = shutil.which("langchain-starcoder", path=str(Path(sys.executable).parent))
    assert script, "pip install -e . should have installed the langchain-starcoder script"
    result = subprocess.run(
        [script, "info", "--model", str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert one_line(result.stderr).startswith("langchain-starcoder: error:")


def test_quantized_float_round_trip_dtype(tiny_path, tmp_path):
    """The CPU upcast happens at load time: quantized scales are float32 in memory, float16 on disk."""
    dst = cli.quantize_checkpoint(tiny_path, tmp_path / "q", verify=False, progress=False)
    engine = StarCoderEngine.load(dst)
    try:
        scales = [a for k, a in tree_flatten(engine.backend.model.parameters()) if k.endswith(".scales")]
        expected = mx.float32 if mx.default_device() == mx.cpu else mx.float16
        assert scales and {s.dtype for s in scales} == {expected}
    finally:
        engine.close()
