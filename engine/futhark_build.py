"""Compiling kernels/microgpt.fut on demand into a per-user cache, and
importing it; whether a backend can run here (with engine.futhark_tools).

A build is `futhark <target> --library` followed by futhark-ffi's CFFI
build, in a private temporary directory that is renamed into place when
complete, under a file lock: two processes compiling at once wait for each
other instead of corrupting the cache. Both compilers' output goes to a log
file whose path every failure names.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping

from .errors import BackendError
from .data import user_cache_dir
from .futhark_tools import (Compiler, CompilerNotFound, cuda_toolkit_root, device_problem,
                            ffi_problem, find_c_compiler, find_compiler)

KERNEL_DIR = Path(__file__).resolve().parent.parent / "kernels"
KERNEL = "microgpt"
TARGETS = ("c", "multicore", "cuda", "opencl")
BUILD_FORMAT = 2  # bump when the build steps change: old cache entries are then ignored

# Futhark 0.25.34 was the first release whose CUDA code compiles against CUDA 13.
CUDA13_FIXED_IN = "0.25.34"
DESCRIPTIONS = {
    "c": "sequential C",
    "multicore": "multicore C",
    "cuda": "CUDA",
    "opencl": "OpenCL",
}


def probe(target: str) -> tuple[bool, str]:
    """(available, reason): what a person sees in the backend list."""
    try:
        compiler = find_compiler()
    except CompilerNotFound as exc:
        return False, str(exc)
    problem = (ffi_problem()
               or (None if find_c_compiler() else
                   "no C compiler found (cc, gcc or clang on PATH, or CC): install one, "
                   "e.g. `apt install gcc` or Xcode's command line tools")
               or device_problem(target))
    if problem:
        return False, problem
    built = is_complete(library_dir(target, compiler))
    when = "compiled" if built else "compiles on first use (a minute or two)"
    return True, f"Futhark {compiler.version}, {DESCRIPTIONS[target]}; {when}"


# -- the cache -----------------------------------------------------------------

def kernel_sources(kernel_dir: Path = KERNEL_DIR) -> dict[str, bytes]:
    """Every .fut file under kernel_dir, by relative path."""
    files = sorted(kernel_dir.rglob("*.fut"))
    if not any(f.name == f"{KERNEL}.fut" for f in files):
        raise BackendError(f"the kernel source {kernel_dir / (KERNEL + '.fut')} is missing")
    return {f.relative_to(kernel_dir).as_posix(): f.read_bytes() for f in files}


def python_tag() -> str:
    try:
        from importlib.metadata import version

        ffi = version("futhark-ffi")
    except Exception:  # not installed: the probe says so before any build
        ffi = "?"
    return f"{sys.implementation.cache_tag}-{sys.platform}-{'.'.join(map(str, sys.version_info[:3]))}-ffi{ffi}"


def cache_key(target: str, compiler_version: str, sources: Mapping[str, bytes],
              python: str | None = None) -> str:
    """A digest of everything a compiled library depends on."""
    digest = hashlib.sha256()
    for part in (f"build{BUILD_FORMAT}", target, compiler_version, python or python_tag()):
        digest.update(part.encode() + b"\0")
    for name in sorted(sources):
        digest.update(f"{name}\0{len(sources[name])}\0".encode())
        digest.update(sources[name])
    return digest.hexdigest()[:20]


def cache_root() -> Path:
    return user_cache_dir() / "futhark"


def library_dir(target: str, compiler: Compiler, root: Path | None = None,
                sources: Mapping[str, bytes] | None = None) -> Path:
    key = cache_key(target, compiler.version, kernel_sources() if sources is None else sources)
    return (root or cache_root()) / f"{KERNEL}-{target}-{key}"


def log_path(libdir: Path) -> Path:
    return libdir.parent / "logs" / f"{libdir.name}.log"


def module_name(target: str) -> str:
    return f"{KERNEL}_{target}"  # CFFI makes the module `_microgpt_<target>`


def _extension(libdir: Path, target: str) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = libdir / f"_{module_name(target)}{suffix}"
        if path.is_file():
            return path
    return None


def is_complete(libdir: Path) -> bool:
    return (libdir / "build.json").is_file()


class FileLock:
    """An exclusive lock on a file (flock, or msvcrt on Windows), across processes."""

    def __init__(self, path: Path, timeout: float | None = None, poll: float = 0.2):
        self.path, self.timeout, self.poll = Path(path), timeout, poll
        self._file = None

    def acquire(self) -> "FileLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+b")
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            try:
                _lock_nb(handle)
                self._file = handle
                return self
            except OSError:
                if deadline is not None and time.monotonic() >= deadline:
                    handle.close()
                    raise TimeoutError(f"{self.path} is locked by another process") from None
                time.sleep(self.poll)

    def release(self) -> None:
        if self._file is not None:
            _unlock(self._file)
            self._file.close()
            self._file = None

    def __enter__(self) -> "FileLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


if sys.platform == "win32":
    import msvcrt

    def _lock_nb(handle) -> None:
        handle.seek(0)
        msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)

    def _unlock(handle) -> None:
        handle.seek(0)
        msvcrt.locking(handle.fileno(), msvcrt.LK_UNLCK, 1)
else:
    import fcntl

    def _lock_nb(handle) -> None:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _unlock(handle) -> None:
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# -- compiling -----------------------------------------------------------------

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


def cuda13_incompatible(c_compiler_output: str) -> bool:
    """True if a C compile failed on the three-argument cuCtxCreate that CUDA 13 rejects."""
    return bool(re.search(r"cuCtxCreate", c_compiler_output)) and bool(
        re.search(r"(?i)too (few|many) arguments|incompatible|expected", c_compiler_output))


_FFI_BUILD = (
    "import sys, futhark_ffi.build as b; "
    "b.build(sys.argv[1], sys.argv[2]).compile(tmpdir=sys.argv[3], verbose=True)"
)


# C compiler flags for the CFFI build, after Python's own (usually -O3) and
# before the user's CFLAGS. -fno-math-errno lets gcc inline sqrtf (Adam calls
# it once per parameter per step) instead of calling libm to set errno; it
# does not change any result. Measured with futhark c 0.25.9 and gcc 12:
# about 6% per step from s32 up. (-ffast-math, -march=native and the flags that
# allow reassociation gained no more than this, so the rounding stays IEEE's.)
GCC_CFLAGS = "-O3 -fno-math-errno"


def _build_env(target: str) -> dict[str, str]:
    """The environment for the CFFI build: optimisation flags (gcc/clang syntax, so not
    on Windows, where Python builds with MSVC), and CUDA's headers and libraries where
    the toolkit is."""
    env = dict(os.environ)
    if os.name != "nt":
        env["CFLAGS"] = f"{GCC_CFLAGS} {env.get('CFLAGS', '')}".strip()
    root = cuda_toolkit_root(env) if target in ("cuda", "opencl") else None
    if root is not None:
        libs = next((d for d in (root / "lib64", root / "lib") if d.is_dir()), root / "lib64")
        env["CPPFLAGS"] = f"{env.get('CPPFLAGS', '')} -I{root / 'include'}".strip()
        env["LDFLAGS"] = f"{env.get('LDFLAGS', '')} -L{libs} -Wl,-rpath,{libs}".strip()
    return env


def _run(cmd: list[str], log, cwd: Path, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """Run cmd, appending its output to the log; (exit status, output)."""
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


def build(target: str, compiler: Compiler | None = None, root: Path | None = None) -> Path:
    """The directory of the compiled library for target, compiling it if needed."""
    if target not in TARGETS:
        raise ValueError(f"unknown Futhark target {target!r}; choose from {', '.join(TARGETS)}")
    compiler = compiler or find_compiler()
    sources = kernel_sources()
    libdir = library_dir(target, compiler, root, sources)
    if is_complete(libdir):
        return libdir
    try:
        with FileLock(libdir.parent / f".{libdir.name}.lock"):
            if not is_complete(libdir):  # nobody built it while we waited
                _compile(target, compiler, sources, libdir)
    except OSError as exc:
        raise BackendError(f"cannot build in the Futhark cache {libdir.parent}: {exc}") from None
    return libdir


def _compile(target: str, compiler: Compiler, sources: Mapping[str, bytes], libdir: Path) -> None:
    log = log_path(libdir)
    log.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{libdir.name}.", dir=libdir.parent))
    try:
        for name, data in sources.items():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            (work / name).write_bytes(data)
        with open(log, "w", encoding="utf-8") as out:
            out.write(f"microgpt-gui: building {KERNEL}.fut for Futhark's {target} backend with "
                      f"Futhark {compiler.version} ({compiler.path}), Python {python_tag()}\n\n")
            status, output = _run([compiler.path, target, "--library", "-o", KERNEL, f"{KERNEL}.fut"],
                                  out, work)
            if status != 0:
                raise BackendError(
                    f"Futhark {compiler.version} could not compile the kernels for the {target} backend:\n"
                    f"{first_error_lines(output)}\nFull log: {log}")
            if target == "cuda":
                generated = work / f"{KERNEL}.c"
                text, patched = patch_cuda13(generated.read_text(encoding="utf-8"))
                if patched:
                    generated.write_text(text, encoding="utf-8")
                    out.write("microgpt-gui: patched the three-argument cuCtxCreate call for CUDA 13\n\n")
            status, output = _run([sys.executable, "-c", _FFI_BUILD, KERNEL, module_name(target), "."],
                                  out, work, _build_env(target))
            if status != 0 or _extension(work, target) is None:
                if target == "cuda" and cuda13_incompatible(output):
                    raise BackendError(
                        f"the CUDA code of Futhark {compiler.version} does not compile against this "
                        f"CUDA 13 toolkit (cuCtxCreate gained an argument); upgrade Futhark to "
                        f"{CUDA13_FIXED_IN} or newer. Full log: {log}")
                raise BackendError(
                    f"the C compiler could not build the Futhark {target} library:\n"
                    f"{first_error_lines(output)}\nFull log: {log}")
        shutil.copy2(log, work / "build.log")
        (work / "build.json").write_text(json.dumps({
            "target": target, "futhark": compiler.version, "futhark_path": compiler.path,
            "python": python_tag(), "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }, indent=1))
        if libdir.exists():  # a leftover from an interrupted older build format
            shutil.rmtree(libdir)
        os.replace(work, libdir)  # publish the complete build in one step
    finally:
        shutil.rmtree(work, ignore_errors=True)


_modules: dict[Path, object] = {}


def import_library(libdir: Path, target: str):
    """The CFFI module (with .ffi and .lib) of a complete build, imported once per process."""
    if libdir not in _modules:
        path = _extension(libdir, target)
        if path is None:
            raise BackendError(f"the Futhark {target} build in {libdir} is incomplete; delete it and retry")
        spec = importlib.util.spec_from_file_location(f"_{module_name(target)}", path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except ImportError as exc:
            raise BackendError(f"the compiled Futhark {target} library could not be loaded: {exc}") from None
        _modules[libdir] = module
    return _modules[libdir]
