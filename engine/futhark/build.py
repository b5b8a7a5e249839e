"""Building a Futhark backend's CFFI extension into the per-user cache (or the
folder $MICROGPT_GUI_CACHE_DIR names), and importing it; whether a backend can run here.

The C comes from kernels/generated/ (shipped: only a C compiler is needed)
while it matches the kernel sources; otherwise a Futhark compiler generates
it from the sources (local). A build runs futhark-ffi's CFFI build in a
private temporary directory that is renamed into place when complete, under
a file lock: two processes building at once wait for each other instead of
corrupting the cache. Every attempt's output is appended to a log file whose
path every failure names. A build takes tens of seconds, so it is announced:
listeners (add_build_listener) get a BuildEvent when it starts and ends.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping

from ..data.corpus import user_cache_dir
from ..errors import BackendError
from .cc import (NATIVE, NO_C_COMPILER, SPIN_WAIT_HEADER, CCompiler, build_environment, cpu_description,
                 find_c_compiler)
from .cuda13 import CUDA13_FIXED_IN, cuda13_incompatible, patch_cuda13
from .generated import (BATCHED, BUILDS, GENERATED_FILES, KERNEL, KERNEL_DIR, ORACLE, PROGRAMS, TARGETS,
                        futhark_target, generate, is_batched, step_build,
                        generated_dir, kernel_sources, shipped_digest, shipped_problem, shipped_version,
                        source_hashes)
from .lock import FileLock
from .tools import (Compiler, CompilerNotFound, cuda_toolkit_root, device_problem, ffi_problem,
                    find_compiler, first_error_lines, run_logged)

BUILD_FORMAT = 4  # bump when the build steps change: old cache entries are then ignored
_TARGET_DESCRIPTIONS = {"c": "sequential C", "multicore": "multicore C", "cuda": "CUDA", "opencl": "OpenCL"}
DESCRIPTIONS = {  # by build
    **_TARGET_DESCRIPTIONS,
    **{f"{t}{BATCHED}": f"{what} for batches" for t, what in _TARGET_DESCRIPTIONS.items()},
    ORACLE: "the tests' vjp oracle in sequential C",
}
# How long a first build takes, measured (issue 20: 21-34 s for futhark-c, clang 14
# and gcc 12 on a loaded 2-core machine); a local build also runs the Futhark compiler.
BUILD_ESTIMATES = {"shipped": "about 20-40 s", "local": "about 1-2 min"}
# The variables that change what the CFFI build produces (all go into the cache key).
BUILD_VARIABLES = ("CC", "CFLAGS", "CPPFLAGS", "LDFLAGS", "LDSHARED")


@dataclass(frozen=True)
class Origin:
    """Where a build's C comes from: the shipped folder, or a local Futhark compile."""
    kind: str     # "shipped" or "local"
    futhark: str  # the Futhark version that generated (or will generate) the code
    digest: str   # shipped: its generated files; local: the kernel sources
    compiler: Compiler | None = None  # local: the Futhark compiler to run
    sources: Mapping[str, bytes] = field(default_factory=dict, repr=False, compare=False)


@dataclass(frozen=True)
class Plan:
    """Everything one build depends on, and where it lives in the cache."""
    target: str
    origin: Origin
    cc: CCompiler
    env: Mapping[str, str] = field(repr=False)
    key_parts: tuple[str, ...]
    libdir: Path
    kernel_dir: Path


def choose_origin(target: str, kernel_dir: Path = KERNEL_DIR) -> Origin:
    """The shipped code while it matches the kernel sources, else a Futhark compile;
    never stale code (BackendError when the sources changed and no compiler is found)."""
    sources = kernel_sources(kernel_dir)
    problem = shipped_problem(target, kernel_dir, sources)
    if problem is None:
        return Origin("shipped", shipped_version(kernel_dir), shipped_digest(target, kernel_dir))
    try:
        compiler = find_compiler()
    except CompilerNotFound as exc:
        raise BackendError(f"the shipped {target} code cannot be used, and compiling the kernels needs "
                           f"a Futhark compiler: {problem}. {exc}") from None
    digest = hashlib.sha256(json.dumps(source_hashes(sources)).encode()).hexdigest()
    return Origin("local", compiler.version, digest, compiler, sources)


def python_tag() -> str:
    try:
        from importlib.metadata import version

        ffi = version("futhark-ffi")
    except Exception:  # not installed: the probe says so before any build
        ffi = "?"
    return f"{sys.implementation.cache_tag}-{sys.platform}-{'.'.join(map(str, sys.version_info[:3]))}-ffi{ffi}"


def key_parts(target: str, origin: Origin, cc: CCompiler, env: Mapping[str, str]) -> tuple[str, ...]:
    """Everything a compiled library depends on, one "name=value" string each."""
    parts = [f"format={BUILD_FORMAT}", f"target={target}", f"origin={origin.kind}",
             f"futhark={origin.futhark}", f"code={origin.digest}",
             f"cc={cc.path}", f"cc_version={cc.version}", f"python={python_tag()}"]
    parts += [f"{var}={env.get(var, '')}" for var in BUILD_VARIABLES]
    if str(SPIN_WAIT_HEADER) in env.get("CFLAGS", ""):  # its text, not only its path
        parts.append(f"spin_wait={hashlib.sha256(SPIN_WAIT_HEADER.read_bytes()).hexdigest()[:16]}")
    if NATIVE in env.get("CFLAGS", "").split():  # the code runs only on CPUs like this one
        parts.append(f"cpu={hashlib.sha256(cpu_description().encode()).hexdigest()[:16]}")
    return tuple(parts)


def spins(target: str) -> bool:
    """Whether a build's C is compiled with cc.SPIN_WAIT_HEADER: the multicore programs'."""
    return futhark_target(target) == "multicore"


def cache_key(parts: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:20]


def cache_root() -> Path:
    """Where the builds go: futhark/ in the user's cache folder (~/.cache/microgpt-gui on
    Linux) or in $MICROGPT_GUI_CACHE_DIR (engine.data.corpus.user_cache_dir)."""
    return user_cache_dir() / "futhark"


def _cuda_paths(target: str, env: dict[str, str]) -> dict[str, str]:
    """CUDA's headers and libraries for the cuda and opencl builds, where the toolkit is."""
    root = cuda_toolkit_root(env) if futhark_target(target) in ("cuda", "opencl") else None
    if root is not None:
        libs = next((d for d in (root / "lib64", root / "lib") if d.is_dir()), root / "lib64")
        env["CPPFLAGS"] = f"{env.get('CPPFLAGS', '')} -I{root / 'include'}".strip()
        env["LDFLAGS"] = f"{env.get('LDFLAGS', '')} -L{libs} -Wl,-rpath,{libs}".strip()
    return env


def plan(target: str, kernel_dir: Path = KERNEL_DIR, root: Path | None = None) -> Plan:
    """What a build of target needs and where it goes; BackendError saying why it cannot run."""
    if target not in BUILDS:
        raise ValueError(f"unknown Futhark build {target!r}; choose from {', '.join(BUILDS)}")
    problem = ffi_problem()
    cc = None if problem else find_c_compiler()
    problem = problem or (None if cc else NO_C_COMPILER) or device_problem(futhark_target(target))
    if problem:
        raise BackendError(problem)
    origin = choose_origin(target, kernel_dir)
    env = _cuda_paths(target, build_environment(cc, tiled=is_batched(target), spin_wait=spins(target)))
    parts = key_parts(target, origin, cc, env)
    libdir = (root or cache_root()) / f"{KERNEL}-{target}-{cache_key(parts)}"
    return Plan(target, origin, cc, env, parts, libdir, kernel_dir)


def _source(build: Plan) -> str:
    """Who generated a build's code, and which C compiler builds it."""
    what, origin = DESCRIPTIONS[build.target], build.origin
    if origin.kind == "shipped":
        source = f"{what} generated by Futhark {origin.futhark} (shipped)"
    else:
        source = (f"{what} from the edited kernel sources, compiled by Futhark {origin.futhark} "
                  f"({origin.compiler.path})")
    return f"{source}, C compiler {build.cc.name}"


def _first_use(build: Plan) -> tuple[str, str]:
    """What a build not built yet does when first opened, and about how long it takes."""
    kind = build.origin.kind
    return ("compiles C on first use" if kind == "shipped" else "compiles on first use"), BUILD_ESTIMATES[kind]


def describe(build: Plan, built: bool) -> str:
    """The probe's reason: who generated the code, which C compiler builds it, and whether it is built."""
    does, estimate = _first_use(build)
    return f"{_source(build)}; {'built' if built else f'{does} ({estimate})'}"


def probe(target: str, kernel_dir: Path = KERNEL_DIR) -> tuple[bool, str]:
    """(available, reason) of one build."""
    try:
        build = plan(target, kernel_dir)
    except BackendError as exc:
        return False, str(exc)
    return True, describe(build, is_complete(build.libdir))


def probe_backend(target: str, kernel_dir: Path = KERNEL_DIR) -> tuple[bool, str]:
    """(available, reason): what a person sees in the backend list for a backend's
    Futhark target, whose runs open one of two builds (one document a step, or
    batches): "built" only where both are, else which one still compiles."""
    try:
        single = plan(target, kernel_dir)
    except BackendError as exc:
        return False, str(exc)
    single_built = is_complete(single.libdir)
    reason = describe(single, single_built)
    try:
        batches = plan(step_build(target, 2), kernel_dir)
    except BackendError as exc:  # e.g. its shipped C edited: runs at B = 1 still work
        return True, f"{reason} (batches cannot run: {exc})"
    if is_complete(batches.libdir) == single_built:
        return True, reason
    does, estimate = _first_use(batches)
    if single_built:
        return True, f"{_source(single)}; built (batches: {does}, {estimate})"
    return True, f"{_source(single)}; built for batches (one document a step: {does}, {estimate})"


# -- the cache -----------------------------------------------------------------

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


# -- announcing a build ------------------------------------------------------------

@dataclass(frozen=True)
class BuildEvent:
    """A build of one backend's library: phase "start", then "done" or "failed"."""
    phase: str        # "start", "done" or "failed"
    backend: str      # "futhark-c"
    origin: str       # "shipped" (only a C compiler runs) or "local" (Futhark compiles the sources)
    compiler: str     # the C compiler, "clang 14.0.6"
    futhark: str      # the Futhark version that generated (local: generates) the C
    estimate: str     # how long it usually takes, "about 20-40 s"
    seconds: float = 0.0  # done, failed: how long it took

    def message(self) -> str:
        """One line for people: "building futhark-c from the shipped C with clang 14.0.6
        (first use, about 20-40 s)..." at the start, "built futhark-c in 23 s" at the end."""
        if self.phase == "start":
            tools = (f"the shipped C with {self.compiler}" if self.origin == "shipped" else
                     f"the edited kernel sources with Futhark {self.futhark} and {self.compiler}")
            return f"building {self.backend} from {tools} (first use, {self.estimate})..."
        verb = "built" if self.phase == "done" else "could not build"
        return f"{verb} {self.backend} in {self.seconds:.0f} s"


BuildListener = Callable[[BuildEvent], None]
_listeners: list[BuildListener] = []


def add_build_listener(listener: BuildListener) -> Callable[[], None]:
    """Call listener(BuildEvent) at the start and end of every build in this process
    (from the thread that builds); returns the function that removes it."""
    _listeners.append(listener)
    return lambda: _listeners.remove(listener) if listener in _listeners else None


def _announce(event: BuildEvent) -> None:
    for listener in list(_listeners):
        listener(event)


def build_label(target: str) -> str:
    """A build as people read it: "futhark-c", "futhark-c (batches)"."""
    return f"futhark-{target.removesuffix(BATCHED)}" + (" (batches)" if is_batched(target) else "")


def build(target: str, kernel_dir: Path = KERNEL_DIR, root: Path | None = None) -> Path:
    """The directory of the compiled library for target, building it if needed."""
    this = plan(target, kernel_dir, root)
    if is_complete(this.libdir):
        return this.libdir
    event = BuildEvent("start", build_label(target), this.origin.kind, this.cc.name, this.origin.futhark,
                       BUILD_ESTIMATES[this.origin.kind])
    _announce(event)
    start = time.monotonic()
    try:
        with FileLock(this.libdir.parent / f".{this.libdir.name}.lock"):
            if not is_complete(this.libdir):  # nobody built it while we waited
                _compile(this)
    except OSError as exc:
        _announce(replace(event, phase="failed", seconds=time.monotonic() - start))
        raise BackendError(f"cannot build in the Futhark cache {this.libdir.parent}: {exc}") from None
    except BaseException:
        _announce(replace(event, phase="failed", seconds=time.monotonic() - start))
        raise
    _announce(replace(event, phase="done", seconds=time.monotonic() - start))
    return this.libdir


# distutils' command lines go to the log whatever the setuptools version: newer
# ones log through `logging`, which prints nothing below WARNING without a handler
_FFI_BUILD = (
    "import logging, sys, futhark_ffi.build as b; "
    "logging.basicConfig(level=logging.INFO, format='%(message)s', stream=sys.stdout); "
    "b.build(sys.argv[1], sys.argv[2]).compile(tmpdir=sys.argv[3], verbose=True)"
)


def _read_log(log: Path, limit: int = 200_000) -> str:
    """The end of a build log, for an error's details (a window shows it on request)."""
    try:
        return log.read_text(encoding="utf-8", errors="replace")[-limit:]
    except OSError:
        return ""


def _compile(this: Plan) -> None:
    target, origin, libdir = this.target, this.origin, this.libdir
    log = log_path(libdir)
    log.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{libdir.name}.", dir=libdir.parent))
    try:
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"microgpt-gui: building {KERNEL} ({PROGRAMS[target].source}) for Futhark's "
                      f"{PROGRAMS[target].target} backend, "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n" + "".join(f"  {p}\n" for p in this.key_parts) + "\n")
            if origin.kind == "local":
                try:
                    generate(origin.compiler, target, origin.sources, work, out)
                except BackendError as exc:
                    raise BackendError(f"{exc}\nFull log: {log}", details=_read_log(log)) from None
            else:
                for name in GENERATED_FILES:
                    shutil.copyfile(generated_dir(this.kernel_dir) / target / name, work / name)
                out.write(f"copied the shipped {target} code ({', '.join(GENERATED_FILES)}) from "
                          f"{generated_dir(this.kernel_dir) / target}\n\n")
            if futhark_target(target) == "cuda":
                generated = work / f"{KERNEL}.c"
                text, patched = patch_cuda13(generated.read_text(encoding="utf-8"))
                if patched:
                    generated.write_text(text, encoding="utf-8")
                    out.write("microgpt-gui: patched the three-argument cuCtxCreate call for CUDA 13\n\n")
            status, output = run_logged([sys.executable, "-c", _FFI_BUILD, KERNEL, module_name(target), "."],
                                        out, work, this.env)
            if status != 0 or _extension(work, target) is None:
                if futhark_target(target) == "cuda" and cuda13_incompatible(output):
                    raise BackendError(
                        f"the CUDA code of Futhark {origin.futhark} does not compile against this "
                        f"CUDA 13 toolkit (cuCtxCreate gained an argument); upgrade Futhark to "
                        f"{CUDA13_FIXED_IN} or newer. Full log: {log}", details=output)
                raise BackendError(
                    f"the C compiler ({this.cc.name}, {this.cc.path}) could not build the Futhark {target} "
                    f"library:\n{first_error_lines(output)}\nFull log: {log} (CC selects another compiler)",
                    details=output)
        for intermediate in (*work.glob("*.o"), work / f"_{module_name(target)}.c"):
            intermediate.unlink(missing_ok=True)  # CFFI's object file and its copy of the C
        shutil.copy2(log, work / "build.log")
        (work / "build.json").write_text(json.dumps({
            "target": target, "origin": origin.kind, "futhark": origin.futhark, "c_compiler": this.cc.name,
            "key": list(this.key_parts), "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
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
