"""Checkpoint folders: ``quantize``, ``build-test-model`` and ``info``, through the command line and
:mod:`langchain_starcoder.checkpoints`; a destination is never one whose writing could destroy anything."""

from __future__ import annotations

import json
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
from langchain_starcoder.checkpoints import MARKER, quantize_checkpoint

PROMPT = "def count_items(items):\n    "
ROOT = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    """Run the command in-process; return (exit status, stdout, stderr)."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def safetensors_header(file: Path) -> dict:
    with open(file, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def hidden_entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


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


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (links as their target's path), to compare before and after."""
    return {
        str(p.relative_to(folder)): str(p.readlink()).encode() if p.is_symlink() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def test_quantize_refuses_to_overwrite_without_force(capsys, tiny_path, tmp_path):
    dst = tmp_path / "q"
    assert run(capsys, "quantize", tiny_path, dst, "--no-verify")[0] == 0
    assert json.loads((dst / MARKER).read_text())["written_by"] == "langchain-starcoder"
    before = snapshot(dst)
    code, _, err = run(capsys, "quantize", tiny_path, dst, "--no-verify", "--bits", 8)
    assert code == 1 and "--force" in one_line(err)
    assert snapshot(dst) == before
    # A checkpoint this package wrote may be replaced.
    assert run(capsys, "quantize", tiny_path, dst, "--force", "--no-verify", "--bits", 8)[0] == 0
    assert json.loads((dst / "config.json").read_text())["quantization"]["bits"] == 8
    assert hidden_entries(tmp_path) == []


@pytest.mark.parametrize("command", ["quantize", "build-test-model"])
def test_force_never_replaces_a_folder_it_did_not_write(capsys, tiny_path, tmp_path, command):
    dst = tmp_path / "project"
    (dst / "src").mkdir(parents=True)
    (dst / "src" / "app.py").write_text("print('mine')\n")
    (dst / "config.json").write_text("{}")  # even one that looks a little like a checkpoint
    before = snapshot(dst)
    argv = ["quantize", tiny_path, dst] if command == "quantize" else ["build-test-model", dst]
    code, out, err = run(capsys, *argv, "--force")
    assert code == 1 and out == ""
    line = one_line(err)
    assert "not a checkpoint written by langchain-starcoder" in line and "remove it yourself" in line
    assert snapshot(dst) == before
    assert hidden_entries(tmp_path) == []


def test_force_never_deletes_a_folder_that_holds_the_source(capsys, tiny_path, tmp_path):
    # The case: `quantize proj/models/base proj --force` used to leave only the new checkpoint.
    proj = tmp_path / "proj"
    shutil.copytree(tiny_path, proj / "models" / "base")
    (proj / "notes.txt").write_text("mine")
    (proj / MARKER).write_text(json.dumps({"written_by": "langchain-starcoder"}))  # even if marked
    (tmp_path / "alias").symlink_to(proj)
    before = snapshot(proj)
    for dst in (proj, proj / "models", tmp_path / "alias" / "models"):  # the last through a link
        code, _, err = run(capsys, "quantize", proj / "models" / "base", dst, "--force", "--no-verify")
        assert code == 1
        assert "contains the source checkpoint" in one_line(err)
        assert snapshot(proj) == before
    assert hidden_entries(tmp_path) == [] and hidden_entries(proj) == []


def test_destination_is_never_the_source_or_inside_it(capsys, tiny_path, tmp_path):
    base = tmp_path / "base"
    shutil.copytree(tiny_path, base)
    (tmp_path / "link").symlink_to(base)
    before = snapshot(base)
    for src, dst in [
        (base, base),
        (tmp_path / "link", base),
        (base, base / "q4"),
        (base, tmp_path / "link" / "q"),
    ]:
        code, _, err = run(capsys, "quantize", src, dst, "--force", "--no-verify")
        assert code == 1
        assert "source checkpoint" in one_line(err)
        assert snapshot(base) == before and hidden_entries(base) == []


def test_force_never_deletes_files_the_source_links_to(capsys, tiny_path, tmp_path):
    """A source made of links (as a hub snapshot is) is protected through them."""
    owned = tmp_path / "built"
    assert run(capsys, "build-test-model", owned, "--layers", 1)[0] == 0  # a checkpoint written here
    linked = tmp_path / "linked"
    linked.mkdir()
    for file in owned.iterdir():
        (linked / file.name).symlink_to(file)
    before = snapshot(owned)
    code, _, err = run(capsys, "quantize", linked, owned, "--force", "--no-verify")
    assert code == 1 and "source checkpoint" in one_line(err)
    assert snapshot(owned) == before


def test_quantize_refuses_a_quantized_source(capsys, tiny_path, tmp_path):
    dst = tmp_path / "q"
    assert run(capsys, "quantize", tiny_path, dst, "--no-verify")[0] == 0
    code, _, err = run(capsys, "quantize", dst, tmp_path / "qq")
    assert code == 1 and "already quantized" in one_line(err)
    assert not (tmp_path / "qq").exists()


@pytest.mark.parametrize("failure", [KeyboardInterrupt, OSError])
def test_quantize_leaves_nothing_behind_on_failure(capsys, tiny_path, tmp_path, monkeypatch, failure):
    import mlx_lm.utils

    old = tmp_path / "old"
    assert run(capsys, "build-test-model", old, "--layers", 1)[0] == 0
    before = snapshot(old)

    def broken_save(path, model, **kwargs):
        (Path(path) / "model.safetensors").write_bytes(b"half")  # a partial write, then the failure
        raise failure("disk full" if failure is OSError else "")

    monkeypatch.setattr(mlx_lm.utils, "save_model", broken_save)
    code, _, _ = run(capsys, "quantize", tiny_path, tmp_path / "new")
    assert code == (130 if failure is KeyboardInterrupt else 1)
    assert not (tmp_path / "new").exists()
    assert hidden_entries(tmp_path) == []

    # Replacing with --force: the old checkpoint survives a failed run untouched.
    code, _, _ = run(capsys, "quantize", tiny_path, old, "--force")
    assert code == (130 if failure is KeyboardInterrupt else 1)
    assert snapshot(old) == before
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


# A run that stages dst and then waits (a build in progress), until it is killed.
STAGE_AND_WAIT = """
import sys, time
from pathlib import Path
from langchain_starcoder.checkpoints import staged_folder
with staged_folder(Path(sys.argv[1]), False, command="build-test-model") as tmp:
    print(tmp, flush=True)
    time.sleep(120)
"""


def staging_run(dst: Path) -> tuple[subprocess.Popen[str], Path]:
    child = subprocess.Popen(
        [sys.executable, "-c", STAGE_AND_WAIT, str(dst)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert child.stdout is not None
    return child, Path(child.stdout.readline().strip())


def test_the_staging_folder_of_a_killed_run_is_removed_by_the_next(capsys, tmp_path):
    dst = tmp_path / "m"
    child, staged = staging_run(dst)
    child.kill()  # SIGKILL, as the out-of-memory killer sends: nothing in the run could clean up
    child.wait(timeout=30)
    assert staged.is_dir() and staged.name.startswith(".m.") and staged.name.endswith(".partial")
    code, _, err = run(capsys, "build-test-model", dst, "--layers", 1)
    assert code == 0 and not staged.exists()
    assert f"Removed {staged}, left by an earlier run that did not finish." in err
    assert hidden_entries(tmp_path) == []
    assert sorted(p.name for p in dst.iterdir()) == sorted(
        [
            "config.json",
            "generation_config.json",
            MARKER,
            "model.safetensors",
            "special_tokens_map.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
    )


def test_a_build_in_progress_and_folders_not_ours_are_left_alone(capsys, tmp_path):
    dst = tmp_path / "m"
    lookalike = tmp_path / ".m.0123abcd.partial"  # no lock file: another program's, or an older version's
    lookalike.mkdir()
    (lookalike / "notes.txt").write_text("keep me")
    child, staged = staging_run(dst)
    try:
        code, _, err = run(capsys, "build-test-model", dst, "--layers", 1)
        assert code == 0 and (dst / "config.json").is_file()
        assert staged.is_dir()  # another process's build, still at work
        assert (lookalike / "notes.txt").read_text() == "keep me"
        assert f"Left {lookalike} alone" in err and str(staged) not in err
    finally:
        child.kill()
        child.wait(timeout=30)


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


def test_info_reads_a_gguf_file_as_it_reads_a_folder(capsys, tiny_path, tmp_path):
    from langchain_starcoder.testing.gguf import write_gguf

    folder = json.loads(run(capsys, "info", "--model", tiny_path, "--json")[1])
    file = write_gguf(tiny_path, tmp_path / "tiny-q8.gguf", ftype="Q8_0", sliding_window=512)
    code, out, err = run(capsys, "info", "--model", file, "--json")
    assert code == 0, err
    info = json.loads(out)
    same = (
        "architecture",
        "layers",
        "hidden_size",
        "attention_heads",
        "kv_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "tied_embeddings",
        "parameters",
        "context_window",
        "sliding_window",
        "rope_theta",
        "fim",
        "repo_level_fim",
        "chat_template",
    )
    assert {k: info[k] for k in same} == {k: folder[k] for k in same}
    assert info["path"] == str(file) and info["weight_files"] == 1
    assert info["weight_bytes"] == file.stat().st_size
    assert info["quantization"] == {"bits": 8, "group_size": 32, "mode": "affine"}
    assert info["gguf_types"] == {"Q8_0": 2 * 6 + 2, "F32": len(folder_tensors(tiny_path)) - 2 * 6 - 2}

    # A file without the window: the loader's notice as a note line, and what the engine would use.
    plain = write_gguf(tiny_path, tmp_path / "tiny.gguf")
    code, out, err = run(capsys, "info", "--model", plain)
    assert code == 0 and err.startswith("langchain-starcoder: note:")
    assert re.search(r"context:\s+2048 tokens, sliding window 4096", out)
    assert re.search(r"weights:.*GGUF tensors: \d+ F32", out)
    code, out, _ = run(capsys, "info", "--model", plain, "--sliding-window", 0)
    assert code == 0 and "full attention" in out
    code, _, err = run(capsys, "info", "--model", tiny_path, "--sliding-window", 0)
    assert code == 1 and "GGUF files only" in one_line(err)


def folder_tensors(path: Path) -> dict[str, mx.array]:
    return mx.load(str(path / "model.safetensors"))


def test_info_reads_the_model_from_the_environment(capsys, tiny_path, monkeypatch):
    monkeypatch.setenv(cli.MODEL_ENV, str(tiny_path))
    code, out, _ = run(capsys, "info", "--json")
    assert code == 0 and json.loads(out)["path"] == str(tiny_path)


def test_quantized_float_round_trip_dtype(tiny_path, tmp_path):
    """The CPU upcast happens at load time: quantized scales are float32 in memory, float16 on disk."""
    dst = quantize_checkpoint(tiny_path, tmp_path / "q", verify=False, progress=False)
    engine = StarCoderEngine.load(dst)
    try:
        scales = [a for k, a in tree_flatten(engine.backend.model.parameters()) if k.endswith(".scales")]
        expected = mx.float32 if mx.default_device() == mx.cpu else mx.float16
        assert scales and {s.dtype for s in scales} == {expected}
    finally:
        engine.close()
