"""CUDA 13 gave cuCtxCreate a parameters argument; CUDA code from Futhark before
0.25.34 calls the three-argument form. The shipped code (0.25.34) handles both;
this patches code a user's older compiler generates."""
from __future__ import annotations

import re

# Futhark 0.25.34 was the first release whose CUDA code compiles against CUDA 13.
CUDA13_FIXED_IN = "0.25.34"

_ARG = r"\s*([^,()]+?)\s*"
_CUDA13_CALL = re.compile(rf"\bcuCtxCreate\({_ARG},{_ARG},{_ARG}\)")
_CUDA13_CALL4 = re.compile(rf"\bcuCtxCreate\({_ARG},{_ARG},{_ARG},{_ARG}\)")
_CUDA13_SHIM = """
/* microgpt-gui: CUDA 13 gave cuCtxCreate a parameters argument (NULL: none). */
static inline CUresult microgpt_cuCtxCreate(CUcontext *ctx, unsigned int flags, CUdevice dev) {
#if defined(CUDA_VERSION) && CUDA_VERSION >= 13000
  return cuCtxCreate(ctx, NULL, flags, dev);
#else
  return cuCtxCreate(ctx, flags, dev);
#endif
}
"""


def patch_cuda13(source: str) -> tuple[str, bool]:
    """Make generated CUDA code that calls the three-argument cuCtxCreate
    (Futhark before 0.25.34) compile against CUDA 13 as well as older CUDA.

    Returns (source, patched). Code that already handles CUDA 13 (it calls
    the four-argument form somewhere) is left alone.
    """
    if not _CUDA13_CALL.search(source) or _CUDA13_CALL4.search(source):
        return source, False
    patched = _CUDA13_CALL.sub(r"microgpt_cuCtxCreate(\1, \2, \3)", source)
    include = re.search(r"^[ \t]*#include\s*<cuda\.h>.*$", patched, flags=re.M)
    if include:
        at = include.end()
        patched = patched[:at] + "\n" + _CUDA13_SHIM + patched[at:]
    else:
        patched = "#include <cuda.h>\n" + _CUDA13_SHIM + patched
    return patched, True


def cuda13_incompatible(c_compiler_output: str) -> bool:
    """True if a C compile failed on the three-argument cuCtxCreate that CUDA 13 rejects."""
    return bool(re.search(r"cuCtxCreate", c_compiler_output)) and bool(
        re.search(r"(?i)too (few|many) arguments|incompatible|expected", c_compiler_output))
