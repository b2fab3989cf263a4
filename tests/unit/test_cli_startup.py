"""Starting the ``langchain-starcoder`` command: fast (nothing heavy imported for --help or a usage
error), a lazy package import that keeps every public name, and a clean Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from children import start_interruptible

from langchain_starcoder import cli

PROMPT = "def count_items(items):\n    "


HEAVY = ("mlx", "mlx_lm", "torch", "transformers", "numpy", "langchain_core", "llama_index")


def python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", **env}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=120
    )


def test_help_and_argument_errors_import_nothing_heavy():
    argvs = [
        ["--help"],
        ["--version"],
        ["generate", "--help"],
        ["generate"],
        ["quantize", "a", "b", "--bits", "3"],
        [],
    ]
    code = (
        "import json, sys\n"
        "from langchain_starcoder.cli import main\n"
        f"codes = [main(argv) for argv in {argvs!r}]\n"
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r})\n"
        "print(json.dumps({'codes': codes, 'heavy': heavy}))\n"
    )
    result = python(code)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report == {"codes": [0, 0, 0, 2, 2, 2], "heavy": []}


def test_the_version_is_the_installed_distributions():
    import importlib.metadata
    import re
    from pathlib import Path

    import langchain_starcoder

    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert langchain_starcoder.__version__ == importlib.metadata.version("langchain-starcoder")
    assert f'\nversion = "{langchain_starcoder.__version__}"\n' in pyproject
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", langchain_starcoder.__version__)
    shown = subprocess.run(
        [sys.executable, "-m", "langchain_starcoder", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.stdout.strip() == f"langchain-starcoder {langchain_starcoder.__version__}"


def test_package_imports_lazily_and_keeps_its_names():
    code = (
        "import json, sys, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import langchain_starcoder as pkg\n"
        "before = 'mlx.core' in sys.modules or 'langchain_core' in sys.modules\n"
        "listed = set(pkg.__all__) <= set(dir(pkg))\n"
        "resolved = all(getattr(pkg, name).__name__ == name for name in pkg.__all__)\n"
        "from langchain_starcoder import StarCoderEngine, StarCoderLLM\n"
        "try:\n"
        "    pkg.no_such_name\n"
        "    missing = 'no error'\n"
        "except AttributeError as e:\n"
        "    missing = str(e)\n"
        "print(json.dumps({'before': before, 'after': 'langchain_core' in sys.modules, 'listed': listed,\n"
        "    'resolved': resolved, 'missing': missing, 'warned': [str(w.message) for w in caught]}))\n"
    )
    # An unknown BLAS setting warns: the BLAS is still configured when the package is imported.
    result = python(code, LANGCHAIN_STARCODER_BLAS="fastest-please")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["before"] is False and report["after"] is True
    assert report["listed"] and report["resolved"]
    assert "no_such_name" in report["missing"]
    assert any("not understood" in w for w in report["warned"])


def test_constants_repeated_to_start_fast_match_their_sources():
    import langchain_starcoder
    from langchain_starcoder import _registry as registry
    from langchain_starcoder import testing

    assert cli.DEFAULT_MODEL == registry.DEFAULT_MODEL
    assert set(cli.PRESET_NAMES) == set(testing.PRESETS)
    assert cli.MODEL_ENV == testing.MODEL_ENV
    assert set(langchain_starcoder._EXPORTS) == set(langchain_starcoder.__all__)


def test_ctrl_c_during_start_up_is_one_line(tiny_path):
    """Interrupted while MLX is being imported: one line on stderr and exit 130, no traceback."""
    argv = ["-X", "importtime", "-m", "langchain_starcoder", "generate", "--model", str(tiny_path)]
    proc = start_interruptible(
        [sys.executable, *argv, "--prompt", PROMPT, "--max-tokens", "500"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    seen: list[str] = []
    for line in proc.stderr:  # -X importtime reports each module as it finishes
        seen.append(line)
        if line.split("|")[-1].strip() == "mlx.core":
            proc.send_signal(signal.SIGINT)
            break
    rest = proc.stderr.read()
    proc.wait(timeout=120)
    proc.stdout.close()
    proc.stderr.close()
    assert "mlx.core" in seen[-1]
    lines = [line for line in rest.splitlines() if line.strip() and not line.startswith("import time:")]
    assert lines == ["langchain-starcoder: interrupted."]
    assert proc.returncode == 130
