"""The opt-in OpenBLAS loader: refuses what cannot work, and where it loads, MLX's logits keep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from langchain_starcoder import _blas as blas

REPO = Path(__file__).resolve().parents[2]
NEEDS_WHEEL = pytest.mark.skipif(
    not sys.platform.startswith("linux") or blas._wheel_library() is None,
    reason="needs Linux and the optional ngsolve-openblas wheel (pip install -e '.[openblas]', checkout)",
)


def test_too_late_once_mlx_is_imported() -> None:
    assert "mlx.core" in sys.modules  # the package imported it
    with pytest.warns(RuntimeWarning, match="MLX was imported before"):
        assert blas.use_optimized_blas() is False
    assert blas.active_blas() is None


def test_never_on_macos(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.warns(RuntimeWarning, match="only for Linux"):
        assert blas.use_optimized_blas() is False


@pytest.mark.parametrize("value", [None, "", "0", "off", "reference", "None"])
def test_env_off_does_nothing(
    monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder, value
) -> None:
    if value is None:
        monkeypatch.delenv(blas.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(blas.ENV_VAR, value)
    assert blas.configure_from_env() is False
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_env_nonsense_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(blas.ENV_VAR, "fastest-please")
    with pytest.warns(RuntimeWarning, match="not understood"):
        assert blas.configure_from_env() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux shared libraries")
def test_prefixed_openblas_is_refused() -> None:
    # numpy's bundled OpenBLAS names its symbols scipy_cblas_sgemm64_: MLX could not bind to it.
    libs = sorted((Path(np.__file__).parent.parent / "numpy.libs").glob("libscipy_openblas*.so"))
    if not libs:
        pytest.skip("this numpy bundles no scipy-openblas")
    with pytest.raises(OSError, match="cblas_sgemm"):
        blas._load(libs[0])
    with pytest.raises(OSError, match="does not exist"):
        blas._load(libs[0].with_name("no-such-library.so"))


def _child(code: str, **env: str) -> str:
    run_env = {**os.environ, **env, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=run_env, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


_STANDALONE = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("langchain_starcoder._blas", sys.argv[0] if False else {path!r})
blas = importlib.util.module_from_spec(spec)
sys.modules["langchain_starcoder._blas"] = blas
spec.loader.exec_module(blas)
"""


@NEEDS_WHEEL
def test_env_var_loads_openblas_into_the_global_scope_before_mlx() -> None:
    code = _STANDALONE.format(path=str(REPO / "langchain_starcoder" / "_blas.py")) + (
        "import ctypes, json\n"
        "ok = blas.configure_from_env()\n"
        "import mlx.core as mx\n"
        "a = mx.ones((64, 64)); mx.eval(a @ a)\n"
        "glob = ctypes.cast(ctypes.CDLL(None).cblas_sgemm, ctypes.c_void_p).value\n"
        "mine = ctypes.cast(blas._loaded.cblas_sgemm, ctypes.c_void_p).value\n"
        "print(json.dumps({'ok': ok, 'same': glob == mine, 'info': blas.active_blas(),\n"
        "                  'sum': float((a @ a).sum())}))\n"
    )
    out = json.loads(_child(code, LANGCHAIN_STARCODER_BLAS="openblas").splitlines()[-1])
    assert out["ok"] is True
    assert out["same"] is True  # what MLX binds cblas_sgemm to is OpenBLAS's
    assert "OpenBLAS" in out["info"]["config"]
    assert out["sum"] == 64 * 64 * 64


@NEEDS_WHEEL
def test_logits_match_the_reference_blas(tiny_path: Path, tmp_path: Path) -> None:
    from benchmarks.harness import run_child

    logits = {}
    for variant in ("reference", "openblas"):
        args = {
            "checkpoint": str(tiny_path),
            "blas": variant,
            "prompt_tokens": 48,
            "decode_prompt_tokens": 8,
            "decode_tokens": 4,
            "logits_tokens": 32,
            "logits_out": str(tmp_path / f"{variant}.npy"),
        }
        result = run_child("blas", args)
        assert result["prefill_tps"] > 0 and result["decode_tps"] > 0
        assert (result["blas"] is None) == (variant == "reference")
        logits[variant] = np.load(tmp_path / f"{variant}.npy")
    assert logits["reference"].shape == (32, 1024)
    np.testing.assert_allclose(logits["openblas"], logits["reference"], rtol=0, atol=1e-4)
