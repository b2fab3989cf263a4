"""LANGCHAIN_STARCODER_BLAS=openblas takes effect through a plain `import langchain_starcoder`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json
import langchain_starcoder
from langchain_starcoder import _blas as blas
print(json.dumps(blas.active_blas()))
"""


def run(**env: str) -> object:
    environment = {**os.environ, **env}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=environment, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the opt-in BLAS is for Linux only")
def test_the_environment_variable_loads_openblas_before_mlx() -> None:
    active = run(LANGCHAIN_STARCODER_BLAS="openblas")
    assert isinstance(active, dict) and "OpenBLAS" in active["config"]
    assert run(LANGCHAIN_STARCODER_BLAS="off") is None
