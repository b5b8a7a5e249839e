"""The C compiler that builds the generated code, and its flags.

clang is preferred where it is installed: it vectorises the kernels' dot
products, which gcc 12 leaves scalar. CC, when set, is always honoured.
The flags are one constant per compiler so they are easy to change; they
never include -ffast-math or -ffinite-math-only, under which the compiler
may assume isnan/isinf are false and the divergence check would vanish.
"""
from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Mapping

# Measured by the profiling study of issue 9 (Futhark 0.25.34, clang 14, gcc 12):
# -march=native and the reassociation flags let the dot products vectorise; the
# alias-check limit lets Adam's loop (4 arrays read, 3 written) vectorise.
# -fno-math-errno inlines sqrtf. -ffp-contract=fast fuses a multiply and an add
# across the generated code's statements into one FMA (clang's default fuses
# only within one expression, and Futhark's C puts each operation in its own
# statement: no FMA at all), one rounding instead of two: s64 steps took 15-20%
# less (issue 21). The rest keeps IEEE semantics for NaN and inf.
CLANG_CFLAGS = ("-O3 -march=native -fno-math-errno -fassociative-math -fno-signed-zeros "
                "-fno-trapping-math -ffp-contract=fast -mllvm -runtime-memory-check-threshold=200")
GCC_CFLAGS = ("-O3 -march=native -fno-math-errno -fassociative-math -fno-signed-zeros "
              "-fno-trapping-math -ffp-contract=fast --param vect-max-version-for-alias-checks=200")
# The batched programs' products (kernels/lib/batch.fut tiled_product) are tiles of 10
# dot products (8 when this came in): clang 14 interleaved that vector loop 4 times (the
# sums 4 times over, spilled to the stack) and 2 x 2 tiles not at all (4 FMA chains, each
# waiting on the last: 0.8 FMA a cycle); 8 or 10 chains run once keep both FMA units
# busy, 1.3-1.7x faster products (`futhark bench`, s256's shapes). Only for those
# programs: it changes the order of the one-document programs' vectorised sums, which
# must stay bit for bit.
CLANG_TILE_CFLAGS = "-mllvm -force-vector-interleave=1"
OTHER_CFLAGS = "-O3"  # a compiler we do not recognise gets only what every cc accepts
# The multicore programs' C is compiled with this header included first: it makes the
# Futhark scheduler's idle workers spin briefly before they sleep (the header says why).
# clang and gcc only (-include).
SPIN_WAIT_HEADER = Path(__file__).with_name("spin_wait.h")
SPIN_VARIABLE = "MICROGPT_FUTHARK_SPIN_US"  # read by the header at run time; 0: no spinning
# Python's own CFLAGS ask for debug info; without it the compile of the shipped C was
# up to 45% faster and the object files 2-7x smaller (clang 14, gcc 12).
NO_DEBUG_INFO = "-g0"
# Flags that let the compiler assume no NaN or inf exists: never used.
FINITE_MATH_FLAGS = ("-ffast-math", "-ffinite-math-only", "-Ofast")

NATIVE = "-march=native"
PORTABLE_VARIABLE = "MICROGPT_PORTABLE"  # set to 1: build for any CPU of this architecture
_WRAPPERS = {"ccache", "sccache", "distcc"}


@dataclass(frozen=True)
class CCompiler:
    command: str  # what CC is set to for the build (the user's CC, or the path found)
    path: str     # the compiler executable
    family: str   # "clang", "gcc" or "other"
    version: str  # the first line of `--version`

    @property
    def name(self) -> str:
        """A short name for people: "clang 14.0.6"."""
        number = re.search(r"\d+\.\d+(?:\.\d+)?", self.version)
        family = self.family if self.family != "other" else os.path.basename(self.path)
        return f"{family} {number.group(0)}" if number else family


@lru_cache(maxsize=16)
def _version_line(path: str, mtime_ns: int, size: int) -> str:
    try:
        run = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = (run.stdout or run.stderr).strip().splitlines()
    return lines[0].strip() if lines else ""


def _family(version: str) -> str:
    text = version.lower()
    if "clang" in text:
        return "clang"
    if "gcc" in text or "free software foundation" in text:
        return "gcc"
    return "other"


def _describe(command: str, path: str) -> CCompiler:
    stat = os.stat(path)
    version = _version_line(path, stat.st_mtime_ns, stat.st_size)
    return CCompiler(command, path, _family(version), version)


def find_c_compiler(env: Mapping[str, str] | None = None) -> CCompiler | None:
    """CC if set (and found), else clang, gcc or cc on PATH."""
    env = os.environ if env is None else env
    search = env.get("PATH")
    if env.get("CC"):
        words = shlex.split(env["CC"])
        while len(words) > 1 and os.path.basename(words[0]) in _WRAPPERS:
            words = words[1:]  # "ccache gcc": the compiler is gcc
        path = shutil.which(words[0], path=search) if words else None
        return _describe(env["CC"], path) if path else None
    for name in ("clang", "gcc", "cc"):
        path = shutil.which(name, path=search)
        if path:
            return _describe(path, path)
    return None


NO_C_COMPILER = ("no C compiler found (clang, gcc or cc on PATH, or CC): install one, "
                 "e.g. `apt install clang` or `apt install gcc`, or Xcode's command line tools")


def native_allowed(env: Mapping[str, str] | None = None) -> bool:
    """-march=native: on x86-64 unless MICROGPT_PORTABLE is set (to anything but 0)."""
    env = os.environ if env is None else env
    if env.get(PORTABLE_VARIABLE, "0") not in ("", "0"):
        return False
    return platform.machine().lower() in ("x86_64", "amd64")


def optimisation_flags(compiler: CCompiler, env: Mapping[str, str] | None = None,
                       tiled: bool = False, spin_wait: bool = False) -> list[str]:
    """Our flags for this compiler (they come before the user's CFLAGS, which win);
    tiled: for a program whose products are register tiles (the batched step's);
    spin_wait: for a multicore program (SPIN_WAIT_HEADER)."""
    base = {"clang": CLANG_CFLAGS, "gcc": GCC_CFLAGS}.get(compiler.family, OTHER_CFLAGS)
    flags = shlex.split(base)
    if tiled and compiler.family == "clang":
        flags += shlex.split(CLANG_TILE_CFLAGS)
    if spin_wait and compiler.family in ("clang", "gcc"):
        flags += ["-include", str(SPIN_WAIT_HEADER)]
    if not native_allowed(env):
        flags = [f for f in flags if f != NATIVE]
    return [*flags, NO_DEBUG_INFO]


def cpu_description() -> str:
    """What -march=native depends on: the CPU model and its feature flags."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
                fields = {}
                for line in info:
                    name, _, value = line.partition(":")
                    name = name.strip()
                    if name in ("model name", "flags", "Features", "CPU part") and name not in fields:
                        fields[name] = " ".join(value.split())
                    if not line.strip() and fields:
                        break  # the first processor describes them all
            return "; ".join(f"{k}: {v}" for k, v in sorted(fields.items()))
        except OSError:
            pass
    if sys.platform == "darwin":
        try:
            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string", "machdep.cpu.features",
                                   "machdep.cpu.leaf7_features"], capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return f"{platform.machine()} {platform.processor()}"


def build_environment(compiler: CCompiler, env: Mapping[str, str] | None = None,
                      tiled: bool = False, spin_wait: bool = False) -> dict[str, str]:
    """The variables that set the compiler and flags for the CFFI build (distutils reads
    CC, LDSHARED and CFLAGS), on top of env. Not on Windows, where Python builds with MSVC.
    tiled, spin_wait: as optimisation_flags."""
    env = dict(os.environ if env is None else env)
    if os.name == "nt":
        return env
    env["CC"] = compiler.command
    ours = shlex.join(optimisation_flags(compiler, env, tiled, spin_wait))  # quoted: the header's path
    env["CFLAGS"] = f"{ours} {env.get('CFLAGS', '')}".strip()
    # distutils links with LDSHARED and passes it CFLAGS too. It swaps in CC when
    # Python's LDSHARED starts with Python's CC; otherwise do it here, so that clang's
    # flags never reach the gcc Python was built with.
    python_cc, ldshared = sysconfig.get_config_var("CC") or "", sysconfig.get_config_var("LDSHARED") or ""
    if "LDSHARED" not in env and ldshared and not ldshared.startswith(python_cc):
        env["LDSHARED"] = " ".join([compiler.command, *ldshared.split()[1:]])
    return env
