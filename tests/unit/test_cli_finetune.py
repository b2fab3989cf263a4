"""``langchain-starcoder finetune``, run in-process on the tiny checkpoint and a small repository: the
adapter's files and the settings in finetune.json, ``--resume`` to more steps, bad settings (exit 2
before the model loads), its defaults those of ``finetune()``."""

from __future__ import annotations

import argparse
import inspect
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from mlx_lm.tuner.utils import load_adapters

from langchain_starcoder import cli
from langchain_starcoder.finetune.settings import DEFAULTS
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


def test_finetune_and_the_command_line_take_their_defaults_from_one_home():
    defaults = asdict(DEFAULTS)
    parameters = inspect.signature(finetune).parameters
    assert {name: parameters[name].default for name in defaults} == defaults
    (commands,) = (a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = commands.choices["finetune"]
    assert {name: flags.get_default(name) for name in defaults} == defaults


def test_the_defaults_home_loads_no_mlx():
    """The command line reads it to build --help: importing it (and the package) must not load MLX."""
    code = (
        "import sys\n"
        "from langchain_starcoder.finetune.settings import DEFAULTS\n"
        "import langchain_starcoder.finetune as package\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'mlx', 'mlx_lm', 'matplotlib', 'numpy'}))\n"
        "print(package.METHODS, package.finetune.__module__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    heavy, names = result.stdout.splitlines()
    assert heavy == "[]"
    assert names == "('lora', 'dora', 'full') langchain_starcoder.finetune.train"
    import langchain_starcoder.finetune as package

    assert set(package._EXPORTS) == set(package.__all__)


def test_a_repository_with_too_little_code_exits_2_and_writes_nothing(capsys, tiny_path, tmp_path):
    root = tmp_path / "small"
    root.mkdir()
    (root / "only.py").write_text(FUNCTION.format(i=1))
    code, _, err = run(capsys, "finetune", root, "--model", tiny_path, "--out", tmp_path / "out")
    assert code == 2 and "error:" in err
    assert not (tmp_path / "out").exists()
