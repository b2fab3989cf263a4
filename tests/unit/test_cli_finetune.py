"""``langchain-starcoder finetune``, run in-process on the tiny checkpoint and a small repository: the
adapter's files and the settings in finetune.json, ``--resume`` to more steps, bad settings (exit 2
before the model loads), its defaults those of ``finetune()``."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest
from mlx_lm.tuner.utils import load_adapters

from langchain_starcoder import cli
from langchain_starcoder.cli.finetune import DEFAULTS
from langchain_starcoder.finetune.train import finetune
from langchain_starcoder.loading import load_model
from langchain_starcoder.testing.repos import write_files

FUNCTION = "def scale_{i}(value, factor={i}):\n    return value * factor + {i}\n\n\n"
FAST = ("--steps", 4, "--batch-size", 2, "--learning-rate", 3e-3, "--max-tokens", 96, "--held-out", 0.25)


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    files = {f"pkg/mod{k}.py": "".join(FUNCTION.format(i=k * 3 + i) for i in range(3)) for k in range(8)}
    return write_files(tmp_path / "repo", files)


def test_finetune_writes_the_adapter_and_resumes_to_more_steps(capsys, tiny_path, repo, tmp_path):
    out = tmp_path / "adapter"
    argv = ("finetune", repo, "--model", tiny_path, "--out", out, "--method", "dora", "--rank", 4)
    code, _, err = run(capsys, *argv, *FAST, "--save-every", 2, "--eval-every", 2)
    assert code == 0, err
    assert "Held-out loss" in err and "after 4 steps" in err and f"Wrote the adapter to {out}" in err
    assert "Fine-tuning" in err and "held-out" in err  # the progress bar, with the losses
    log = json.loads((out / "finetune.json").read_text())
    assert log["settings"] | {"method": "dora", "rank": 4, "steps": 4, "batch_size": 2} == log["settings"]
    assert [r["step"] for r in log["held_out_losses"]] == [0, 2, 4]
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["fine_tune_type"] == "dora" and config["lora_parameters"]["rank"] == 4
    load_adapters(load_model(tiny_path, quantize=None, group_size=64, dtype="auto").model, str(out))

    # Again without --resume: the run there is not overwritten.
    code, _, err = run(capsys, *argv, *FAST, "--save-every", 2, "--eval-every", 2)
    assert code == 2 and "--resume" in err
    code, _, err = run(
        capsys, *argv, *FAST[2:], "--steps", 6, "--save-every", 2, "--eval-every", 2, "--resume"
    )
    assert code == 0, err
    log = json.loads((out / "finetune.json").read_text())
    assert log["step"] == 6 and [r["step"] for r in log["losses"]] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--rank", 0), "rank must be a positive integer"),
        (("--held-out", 1.5), "held_out is the fraction of files"),
        (("--spm-rate", 2), "spm_rate is a share"),
        (("--method", "qlora"), "invalid choice: 'qlora'"),
    ],
)
def test_bad_settings_exit_2_before_the_model_loads(capsys, repo, tmp_path, options, message):
    argv = ("finetune", repo, "--model", tmp_path / "no-model", "--out", tmp_path / "out", *options)
    code, out, err = run(capsys, *argv)
    assert code == 2 and message in err and not out
    assert not (tmp_path / "out").exists()


def test_the_defaults_are_finetunes():
    parameters = inspect.signature(finetune).parameters
    assert {name: parameters[name].default for name in DEFAULTS} == DEFAULTS


def test_a_repository_with_too_little_code_exits_2_and_writes_nothing(capsys, tiny_path, tmp_path):
    root = tmp_path / "small"
    root.mkdir()
    (root / "only.py").write_text(FUNCTION.format(i=1))
    code, _, err = run(capsys, "finetune", root, "--model", tiny_path, "--out", tmp_path / "out")
    assert code == 2 and "error:" in err
    assert not (tmp_path / "out").exists()
