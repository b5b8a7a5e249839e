"""Whether the `cupy` backend can run here: CuPy imports, a CUDA device answers
and a tiny kernel runs; else a reason a person can act on (install CuPy, the
driver is missing or too old, no device, broken CUDA libraries).

Imports without CuPy; probe_cupy imports it when it runs.
"""
from __future__ import annotations

import os

INSTALL_HINT = "pip install 'microgpt-gui[cuda]'"

# CUDA runtime status codes the probe explains (cudaError_t).
CUDA_ERROR_INITIALIZATION = 3
CUDA_ERROR_INSUFFICIENT_DRIVER = 35
CUDA_ERROR_NO_DEVICE = 100
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_SYSTEM_DRIVER_MISMATCH = 803


def _import_cupy():
    import cupy

    return cupy


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def _visible_devices_note() -> str:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return f" (CUDA_VISIBLE_DEVICES is set to {value!r})" if value is not None else ""


def _cuda_error_reason(runtime, exc) -> str:
    """A sentence a person can act on, for a CUDA runtime error raised while finding devices."""
    status = getattr(exc, "status", None)
    if status == CUDA_ERROR_INSUFFICIENT_DRIVER:
        # CUDA reports a missing driver the same way as an old one; the driver version tells them apart.
        try:
            driver = int(runtime.driverGetVersion())
        except Exception:
            driver = 0
        if driver == 0:
            return ("no NVIDIA driver found: CuPy is installed, but this machine has no NVIDIA GPU "
                    "driver (install the NVIDIA driver if it has an NVIDIA GPU)")
        try:
            needed = f"CUDA {_cuda_version(int(runtime.runtimeGetVersion()))}"
        except Exception:
            needed = "a newer CUDA"
        return (f"the NVIDIA driver is too old for this CuPy (the driver supports CUDA "
                f"{_cuda_version(driver)}, this CuPy needs {needed}): update the NVIDIA driver, "
                "or install the CuPy wheel that matches it (e.g. cupy-cuda11x)")
    if status in (CUDA_ERROR_NO_DEVICE, CUDA_ERROR_INVALID_DEVICE):
        return ("no CUDA device found: the NVIDIA driver answers but sees no GPU"
                f"{_visible_devices_note()}; check that `nvidia-smi` lists one")
    if status == CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
        return ("the NVIDIA driver's kernel module and library versions differ (was the driver "
                f"updated without a reboot?): reboot or reinstall the driver ({exc})")
    return f"CUDA did not start: {exc}"


def probe_cupy(import_cupy=_import_cupy) -> tuple[bool, str]:
    """(available, reason): CuPy imports, a CUDA device answers, and a tiny kernel runs.

    Never raises. `import_cupy` is injectable for tests of this logic.
    """
    try:
        cupy = import_cupy()
    except ImportError as exc:
        if getattr(exc, "name", None) == "cupy":
            return False, f"CuPy is not installed: {INSTALL_HINT}"
        return False, f"CuPy is installed but does not import ({exc}); reinstall it: {INSTALL_HINT}"
    except Exception as exc:
        return False, f"CuPy failed to import ({type(exc).__name__}: {exc}); reinstall it: {INSTALL_HINT}"
    try:
        runtime = cupy.cuda.runtime
        error_type = runtime.CUDARuntimeError
    except Exception as exc:
        return False, f"CuPy is incomplete ({exc}); reinstall it: {INSTALL_HINT}"
    try:
        count = int(runtime.getDeviceCount())
    except error_type as exc:
        return False, _cuda_error_reason(runtime, exc)
    except Exception as exc:
        return False, f"CUDA did not start: {exc}"
    if count < 1:
        return False, f"no CUDA device found{_visible_devices_note()}"
    try:
        x = cupy.arange(4, dtype=cupy.float32)
        value = float((x * 2) @ x)  # an elementwise kernel (NVRTC) and a matmul (cuBLAS)
    except error_type as exc:
        return False, _cuda_error_reason(runtime, exc)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return False, (f"found {count} CUDA device(s), but CuPy could not run a test kernel: {first}. "
                       "CuPy needs the CUDA libraries NVRTC and cuBLAS: install the CUDA toolkit, "
                       "or pip install 'cupy-cuda12x[ctk]'")
    if value != 28.0:
        return False, f"a test computation on the GPU returned {value}, expected 28.0"
    try:
        name = runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
        name = name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        name = "CUDA device"
    return True, f"CuPy {getattr(cupy, '__version__', '?')} on {name}"


_probe_result: tuple[bool, str] | None = None


def probe(refresh: bool = False) -> tuple[bool, str]:
    """probe_cupy(), run once per process (a device does not come and go)."""
    global _probe_result
    if _probe_result is None or refresh:
        _probe_result = probe_cupy()
    return _probe_result
