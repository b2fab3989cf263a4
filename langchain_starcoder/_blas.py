"""Opt-in: run MLX's float32 matmuls on an optimized OpenBLAS (Linux CPU build of MLX).

The ``mlx[cpu]`` wheel for Linux links the netlib *reference* BLAS, which multiplies float32
matrices at about 2 GFLOP/s on one core. MLX calls BLAS through the standard ``cblas_sgemm``
symbol, so an optimized OpenBLAS loaded into the process with ``RTLD_GLOBAL`` *before MLX is
imported* takes those calls over: on a 2-core Xeon a 64x3072x12288 matmul went from 2 to
69 GFLOP/s on one thread, float32 prefill of a StarCoder2-3b-shaped model 43x faster and decode
1.9x (see ``benchmarks/RESULTS.md``). Quantized and float16/bfloat16 kernels never call BLAS, so they do
not change. Results stay within float32 rounding of the reference BLAS (logits within 1e-4).

It is off by default: it swaps a process-wide library, and it only matters on Linux. It is never
used on macOS (MLX uses Accelerate and the GPU there).

Setup:
    .. code-block:: bash

        pip install -e ".[openblas]"   # from the checkout: the ngsolve-openblas wheel
        export LANGCHAIN_STARCODER_BLAS=openblas       # read when langchain_starcoder is imported

    ``LANGCHAIN_STARCODER_BLAS`` may also name a library file, such as a system OpenBLAS
    (``/usr/lib/x86_64-linux-gnu/libopenblas.so.0``). Any library must export the standard
    LP64 names (``cblas_sgemm``): ``scipy-openblas32/64`` prefix theirs and cannot be used.

In code, before anything imports ``mlx``:
    .. code-block:: python

        import os

        os.environ["LANGCHAIN_STARCODER_BLAS"] = "openblas"
        import langchain_starcoder  # loads OpenBLAS, then MLX

If MLX was imported first, nothing changes and a warning says so.

OpenBLAS runs on one thread unless ``OPENBLAS_NUM_THREADS`` (or ``OMP_NUM_THREADS``) says
otherwise. On an idle 2-core machine two threads were up to 2x faster than one; on a busy one they
were 6x slower than one, and slower than the reference BLAS (OpenBLAS's worker threads spin while
they wait). One thread never lost, so it is the default; on an idle machine set the variable.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

ENV_VAR = "LANGCHAIN_STARCODER_BLAS"
#: The PyPI wheel behind ``LANGCHAIN_STARCODER_BLAS=openblas``: OpenBLAS 0.3.33 built for every
#: x86 core (DYNAMIC_ARCH), standard symbol names, LP64.
WHEEL = "ngsolve-openblas"
_WHEEL_MODULE = "ngsolve_openblas"
_OFF = ("", "0", "off", "false", "no", "none", "reference")
_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")

_loaded: ctypes.CDLL | None = None
_loaded_path: str | None = None


def use_optimized_blas(library: str | os.PathLike[str] | None = None) -> bool:
    """Load an optimized OpenBLAS for MLX's float32 matmuls; True if it is (now) in effect.

    Args:
        library: A BLAS shared library to load; by default the OpenBLAS of the
            ``ngsolve-openblas`` wheel.

    Returns False, with a warning, when it cannot take effect: on macOS, when MLX is already
    imported, when the wheel is missing, or when the library lacks the standard LP64 symbols.
    """
    global _loaded, _loaded_path
    if _loaded is not None:
        return True
    if sys.platform == "darwin":
        _warn("An optimized BLAS is only for Linux; on macOS MLX already uses Accelerate and the GPU.")
        return False
    if not sys.platform.startswith("linux"):
        _warn(f"An optimized BLAS is only supported on Linux, not {sys.platform}.")
        return False
    if "mlx.core" in sys.modules:
        _warn(
            "MLX was imported before the optimized BLAS could be loaded, so MLX keeps its reference "
            f"BLAS. Set {ENV_VAR}=openblas before importing langchain_starcoder or mlx."
        )
        return False
    path = Path(library) if library is not None else _wheel_library()
    if path is None:
        _warn(
            f"No optimized BLAS found: `pip install {WHEEL}` (or `pip install -e '.[openblas]'` in the "
            "checkout), "
            f"or set {ENV_VAR} to the path of an OpenBLAS library."
        )
        return False
    try:
        lib = _load(path)
    except OSError as e:
        _warn(f"Could not load the BLAS library {path}: {e}")
        return False
    if not any(os.environ.get(v) for v in _THREAD_VARS) and hasattr(lib, "openblas_set_num_threads"):
        # One thread unless asked: on a busy 2-core machine OpenBLAS's spinning worker threads made
        # prefill 6x and decode 2.5x slower than one thread (on an idle one, 2x faster).
        lib.openblas_set_num_threads(1)
    _loaded, _loaded_path = lib, str(path)
    return True


def configure_from_env() -> bool:
    """Apply ``LANGCHAIN_STARCODER_BLAS`` ("openblas" or a library path); unset does nothing.

    The package calls this at import, before it imports MLX.
    """
    value = os.environ.get(ENV_VAR, "").strip()
    if value.lower() in _OFF:
        return False
    if value.lower() == "openblas":
        return use_optimized_blas()
    if os.sep in value or value.endswith(".so") or ".so." in value:
        return use_optimized_blas(value)
    _warn(f"{ENV_VAR}={value!r} is not understood; use 'openblas' or the path of a BLAS library.")
    return False


def active_blas() -> dict[str, object] | None:
    """What :func:`use_optimized_blas` loaded (path, OpenBLAS config, core, threads), or None."""
    if _loaded is None:
        return None
    info: dict[str, object] = {"path": _loaded_path}
    for key, name, restype in (
        ("config", "openblas_get_config", ctypes.c_char_p),
        ("core", "openblas_get_corename", ctypes.c_char_p),
        ("threads", "openblas_get_num_threads", ctypes.c_int),
    ):
        fn = getattr(_loaded, name, None)
        if fn is not None:
            fn.restype = restype
            value = fn()
            info[key] = value.decode() if isinstance(value, bytes) else value
    return info


def _warn(msg: str) -> None:
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _wheel_library() -> Path | None:
    """The OpenBLAS file of the ngsolve-openblas wheel, found without importing it.

    (Importing it would load the library itself, and fail where libgfortran is not installed.)
    """
    spec = importlib.util.find_spec(_WHEEL_MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("libopenblas*.so*"))
        if found:
            return found[0]
    return None


def _load(path: Path) -> ctypes.CDLL:
    """Load ``path`` privately, check its symbols, then make them global for MLX to bind to."""
    if not path.is_file():
        msg = f"{path} does not exist"
        raise OSError(msg)
    try:
        return _load_checked(str(path))
    except OSError as e:
        if "libgfortran" not in str(e):
            raise
    # OpenBLAS wheels need libgfortran.so.5, which many systems lack; the mlx[cpu] and numpy
    # wheels bundle one. Point the library's $ORIGIN at a folder of links that holds it.
    gfortran = _bundled_gfortran()
    if gfortran is None:
        msg = "it needs libgfortran.so.5 (install it, e.g. `apt install libgfortran5`)"
        raise OSError(msg)
    folder = Path(tempfile.mkdtemp(prefix="langchain-starcoder-blas-"))
    try:
        (folder / path.name).symlink_to(path.resolve())
        for sibling in gfortran.parent.iterdir():  # libquadmath and other libraries it needs
            (folder / sibling.name).symlink_to(sibling)
        (folder / "libgfortran.so.5").symlink_to(gfortran)
        return _load_checked(str(folder / path.name))
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # once loaded, the links are not needed


def _load_checked(path: str) -> ctypes.CDLL:
    local = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
    if not hasattr(local, "cblas_sgemm"):
        msg = (
            "it exports no cblas_sgemm (scipy-openblas32/64 prefix their symbols, so MLX cannot use "
            "them); use an OpenBLAS with standard names"
        )
        raise OSError(msg)
    config = getattr(local, "openblas_get_config", None)
    if config is not None:
        config.restype = ctypes.c_char_p
        if b"USE64BITINT" in config():
            msg = "it is an ILP64 (64-bit integer) build; MLX calls BLAS with 32-bit integers"
            raise OSError(msg)
    # Loading the same file again with RTLD_GLOBAL promotes it to the global symbol scope.
    return ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def _bundled_gfortran() -> Path | None:
    """A libgfortran.so.5 shipped inside an installed wheel (mlx[cpu] first, then numpy, scipy)."""
    candidates: list[Path] = []
    for entry in sys.path:
        folder = Path(entry or ".")
        for libs in ("mlx_cpu.libs", "numpy.libs", "scipy.libs"):
            candidates.extend(sorted((folder / libs).glob("libgfortran*.so.5*")))
    return candidates[0] if candidates else None
