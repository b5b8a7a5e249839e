"""OpenBLAS's thread count, set for the duration of a call.

A batch of documents makes matrix products of a few hundred rows, which
OpenBLAS splits over its threads; on 2 cores its threads then spend most of
their time waiting for each other, several times slower than one thread
(figures: docs/performance.md, "A batch's products run on one OpenBLAS
thread"). NumPy has no call for this, so the function is
looked up in the OpenBLAS library NumPy loaded (NumPy's wheels: scipy-openblas).
Where there is none (another BLAS, another platform), one_blas_thread changes
nothing.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import os
from contextlib import contextmanager

# (set, get) function names: NumPy 2's scipy-openblas (64-bit and 32-bit ints), plain OpenBLAS
_NAMES = (("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
          ("scipy_openblas_set_num_threads", "scipy_openblas_get_num_threads"),
          ("openblas_set_num_threads", "openblas_get_num_threads"))


def _loaded_openblas_paths() -> list[str]:
    """OpenBLAS libraries this process has loaded (Linux), else those in NumPy's wheel folder."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line}
        if paths:
            return sorted(paths)
    except OSError:
        pass
    import numpy

    folder = os.path.join(os.path.dirname(os.path.dirname(numpy.__file__)), "numpy.libs")
    return sorted(glob.glob(os.path.join(folder, "*openblas*")))


@functools.lru_cache(maxsize=None)
def thread_functions():
    """(set_num_threads, get_num_threads) of the OpenBLAS NumPy uses, or None."""
    import numpy  # noqa: F401  (loads its BLAS)

    for path in _loaded_openblas_paths():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_name, get_name in _NAMES:
            if hasattr(lib, set_name) and hasattr(lib, get_name):
                setter, getter = getattr(lib, set_name), getattr(lib, get_name)
                setter.argtypes, setter.restype, getter.restype = [ctypes.c_int], None, ctypes.c_int
                return setter, getter
    return None


@contextmanager
def one_blas_thread(enabled: bool = True):
    """Run the block with OpenBLAS on one thread (when enabled and found), then restore it."""
    functions = thread_functions() if enabled else None
    if functions is None:
        yield
        return
    setter, getter = functions
    before = getter()
    setter(1)
    try:
        yield
    finally:
        setter(before)


def set_blas_threads(threads: int) -> bool:
    """OpenBLAS's thread count for the rest of the process (a sweep trial: one per CPU it
    holds); False where no OpenBLAS was found."""
    functions = thread_functions()
    if functions is None:
        return False
    functions[0](max(1, int(threads)))
    return True
