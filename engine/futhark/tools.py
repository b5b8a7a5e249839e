"""Finding the tools a Futhark backend needs, and saying why one cannot run:
the Futhark compiler (FUTHARK or PATH) and its version, the CUDA driver and
toolkit, an OpenCL loader, headers and platform (the C compiler: cc.py);
running a tool with its output kept in a log.

Every reason is a sentence a person can act on.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Mapping

from ..errors import BackendError

INSTALL_HINT = (
    "install it from https://futhark-lang.org/releases/ (or `brew install futhark`, Nix, "
    "AUR futhark-nightly) and put `futhark` on PATH, or set FUTHARK to its path"
)


class CompilerNotFound(BackendError):
    """No usable Futhark compiler; the message says where to get one."""


@dataclass(frozen=True)
class Compiler:
    path: str
    version: str  # e.g. "0.25.9"

    @property
    def version_tuple(self) -> tuple[int, ...]:
        return version_tuple(self.version)


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def parse_version(output: str) -> str | None:
    """The version from `futhark --version` output ("Futhark 0.25.9 ...")."""
    match = re.search(r"Futhark\s+v?(\d+\.\d+(?:\.\d+)?)", output)
    return match.group(1) if match else None


@lru_cache(maxsize=16)
def _version_of(path: str, mtime_ns: int, size: int) -> str:
    try:
        run = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise CompilerNotFound(f"{path} could not be run as the Futhark compiler ({exc}); {INSTALL_HINT}") from None
    version = parse_version(run.stdout + run.stderr)
    if run.returncode != 0 or version is None:
        output = (run.stdout + run.stderr).strip().splitlines()
        said = f": {output[0]}" if output else ""
        raise CompilerNotFound(
            f"{path} is not a working Futhark compiler (`{Path(path).name} --version` "
            f"exited with {run.returncode}{said}); {INSTALL_HINT}"
        )
    return version


def find_compiler(env: Mapping[str, str] | None = None) -> Compiler:
    """The compiler named by FUTHARK, else `futhark` on PATH, with its version."""
    env = os.environ if env is None else env
    named = env.get("FUTHARK")
    if named:
        path = shutil.which(named, path=env.get("PATH")) if os.sep not in named else named
        if not path or not os.path.isfile(path):
            raise CompilerNotFound(f"FUTHARK={named} does not name a Futhark compiler; {INSTALL_HINT}")
    else:
        path = shutil.which("futhark", path=env.get("PATH"))
        if not path:
            raise CompilerNotFound(f"Futhark compiler not found: {INSTALL_HINT}")
    stat = os.stat(path)
    return Compiler(path, _version_of(path, stat.st_mtime_ns, stat.st_size))


# Where toolkits and headers live when no variable says so (tests replace these).
SYSTEM_INCLUDE_DIRS = [Path("/usr/local/include"), Path("/usr/include")]


def system_cuda_roots() -> list[Path]:
    versioned = sorted(Path("/usr/local").glob("cuda-*"), key=lambda p: version_tuple(p.name), reverse=True)
    return [Path("/usr/local/cuda"), *versioned, Path("/opt/cuda")]


def _include_dirs(env: Mapping[str, str], roots: list[Path]) -> list[Path]:
    dirs = [Path(p) for var in ("CPATH", "C_INCLUDE_PATH") for p in env.get(var, "").split(os.pathsep) if p]
    dirs += [root / "include" for root in roots]
    return dirs + list(SYSTEM_INCLUDE_DIRS)


def cuda_toolkit_root(env: Mapping[str, str] | None = None) -> Path | None:
    """The CUDA toolkit: CUDA_HOME / CUDA_PATH / CUDA_ROOT, nvcc's, or the usual places."""
    env = os.environ if env is None else env
    candidates = [Path(env[v]) for v in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT") if env.get(v)]
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    if nvcc:
        candidates.append(Path(nvcc).resolve().parent.parent)
    candidates += system_cuda_roots()
    for root in candidates:
        if (root / "include" / "cuda.h").is_file():
            return root
    return None


def cuda_problem(env: Mapping[str, str] | None = None,
                 find_library: Callable[[str], str | None] | None = None) -> str | None:
    """Why the CUDA backend cannot build or run here, or None."""
    env = os.environ if env is None else env
    find_library = find_library or ctypes.util.find_library
    if not find_library("cuda"):
        return ("no CUDA driver found (libcuda): the CUDA backend needs an NVIDIA GPU "
                "with its driver installed")
    root = cuda_toolkit_root(env)
    has_header = root is not None or any((d / "cuda.h").is_file() for d in _include_dirs(env, []))
    if not has_header:
        return ("the CUDA toolkit was not found (no cuda.h): install it "
                "(https://developer.nvidia.com/cuda-downloads) and set CUDA_HOME")
    lib_dirs = [root / "lib64", root / "lib"] if root else []
    bundled = any(any(d.glob("*nvrtc*")) for d in lib_dirs if d.is_dir())
    if not find_library("nvrtc") and not bundled:
        return "the CUDA toolkit has no NVRTC library (libnvrtc): reinstall the toolkit or set CUDA_HOME"
    return None


def _count_opencl_platforms(library: str) -> int:
    lib = ctypes.CDLL(library)
    count = ctypes.c_uint32(0)
    status = lib.clGetPlatformIDs(0, None, ctypes.byref(count))
    return count.value if status == 0 else 0


def opencl_problem(env: Mapping[str, str] | None = None,
                   find_library: Callable[[str], str | None] | None = None,
                   count_platforms: Callable[[str], int] = _count_opencl_platforms) -> str | None:
    """Why the OpenCL backend cannot build or run here, or None."""
    env = os.environ if env is None else env
    find_library = find_library or ctypes.util.find_library
    library = find_library("OpenCL")
    if not library:
        return ("no OpenCL library found (libOpenCL): install an OpenCL loader and your device's "
                "driver (Debian: apt install ocl-icd-opencl-dev plus a vendor ICD)")
    if sys.platform != "darwin":
        roots = [root] if (root := cuda_toolkit_root(env)) else []
        if not any((d / "CL" / "cl.h").is_file() for d in _include_dirs(env, roots)):
            return "the OpenCL headers were not found (CL/cl.h): install them (Debian: apt install opencl-headers)"
    try:
        platforms = count_platforms(library)
    except (OSError, AttributeError) as exc:
        return f"the OpenCL library {library} could not be used: {exc}"
    if platforms < 1:
        return ("no OpenCL platform found: install an OpenCL driver (ICD) for your GPU or CPU, "
                "e.g. NVIDIA's driver, ROCm, or pocl")
    return None


def ffi_problem() -> str | None:
    for module in ("futhark_ffi", "cffi"):
        if importlib.util.find_spec(module) is None:
            return f"the Python package {module.replace('_', '-')} is not installed: pip install futhark-ffi"
    return None


@lru_cache(maxsize=8)
def device_problem(target: str) -> str | None:
    """Why target's device cannot be used, or None; asked once per process
    (the checks load system libraries, and their answer does not change)."""
    if target == "cuda":
        return cuda_problem()
    if target == "opencl":
        return opencl_problem()
    return None


def run_logged(cmd: list[str], log, cwd: Path, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Run cmd, appending its output to the open log file; (exit status, output)."""
    log.write(f"$ {shlex.join(cmd)}\n")
    log.flush()
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace")
    except OSError as exc:
        log.write(f"{exc}\n")
        return 127, str(exc)
    log.write(done.stdout)
    log.write(f"[exit status {done.returncode}]\n\n")
    log.flush()
    return done.returncode, done.stdout


def first_error_lines(text: str, limit: int = 8) -> str:
    """The first error a compiler reported and the lines after it (or the last lines)."""
    lines = [line.rstrip() for line in text.splitlines()]
    start = next((i for i, line in enumerate(lines) if re.search(r"(?i)\berror\b", line)), None)
    if start is None:
        chosen = [line for line in lines if line.strip()][-limit:]
    else:
        chosen = lines[start:start + limit]
    while chosen and not chosen[-1].strip():
        chosen.pop()
    return "\n".join(chosen)
