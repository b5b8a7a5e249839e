"""Finding the tools a Futhark backend needs and saying why one is missing: the
Futhark compiler, the C compiler and its flags, CUDA and OpenCL; the CUDA 13
patch for code from older Futhark compilers.

Stand-in executables (a `futhark` or `clang` that only answers --version,
or only fails) on a temporary PATH exercise detection; nothing here builds
a library. The CUDA 13 patch is checked by compiling generated-style C with
the real C compiler against CUDA 12- and 13-style headers (and the
installed CUDA 13 cuda.h where there is one).
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from engine.futhark import build as fb
from engine.futhark import cc
from engine.futhark import generated as gen
from engine.futhark import tools as ft
from engine.futhark.cuda13 import cuda13_incompatible, patch_cuda13
from futhark_support import (CLANG, CLANG_VERSION, FUTHARK_ERROR, FUTHARK_VERSION_OUTPUT, GCC_VERSION,
                             stand_in_cc, version_only_futhark, write_script)


# -- the C compiler and its flags ------------------------------------------------

def test_clang_is_preferred_over_gcc(clean_env):
    bindir = clean_env / "empty-bin"
    assert cc.find_c_compiler() is None
    stand_in_cc(bindir, "gcc", GCC_VERSION)
    found = cc.find_c_compiler()
    assert (found.family, found.name, found.path) == ("gcc", "gcc 12.2.0", str(bindir / "gcc"))
    stand_in_cc(bindir, "clang", CLANG_VERSION)
    found = cc.find_c_compiler()
    assert (found.family, found.name, found.command) == ("clang", "clang 14.0.6", str(bindir / "clang"))


def test_cc_variable_names_the_c_compiler(clean_env, monkeypatch):
    stand_in_cc(clean_env / "empty-bin", "clang", CLANG_VERSION)
    stand_in_cc(clean_env / "tools", "my-cc", GCC_VERSION)
    monkeypatch.setenv("CC", "my-cc")
    assert cc.find_c_compiler() is None  # not on PATH: CC is honoured, not replaced by clang
    monkeypatch.setenv("PATH", f"{clean_env / 'tools'}{os.pathsep}{clean_env / 'empty-bin'}")
    found = cc.find_c_compiler()
    assert (found.command, found.path, found.family) == ("my-cc", str(clean_env / "tools" / "my-cc"), "gcc")
    write_script(clean_env / "tools", "ccache", "exit 0\n")
    monkeypatch.setenv("CC", "ccache my-cc")
    found = cc.find_c_compiler()
    assert (found.command, found.path) == ("ccache my-cc", str(clean_env / "tools" / "my-cc"))


def test_each_compiler_gets_its_flags(clean_env, monkeypatch):
    gcc = cc.CCompiler("gcc", "/usr/bin/gcc", "gcc", GCC_VERSION)
    other = cc.CCompiler("tcc", "/usr/bin/tcc", "other", "tcc version 0.9.27")
    monkeypatch.setattr(cc.platform, "machine", lambda: "x86_64")
    assert cc.optimisation_flags(CLANG, {}) == [*cc.CLANG_CFLAGS.split(), cc.NO_DEBUG_INFO]
    assert cc.optimisation_flags(gcc, {}) == [*cc.GCC_CFLAGS.split(), cc.NO_DEBUG_INFO]
    assert cc.optimisation_flags(other, {}) == ["-O3", cc.NO_DEBUG_INFO]
    assert "-march=native" in cc.optimisation_flags(gcc, {cc.PORTABLE_VARIABLE: "0"})
    for compiler in (CLANG, gcc):
        assert "-march=native" not in cc.optimisation_flags(compiler, {cc.PORTABLE_VARIABLE: "1"})
    monkeypatch.setattr(cc.platform, "machine", lambda: "aarch64")
    assert "-march=native" not in cc.optimisation_flags(CLANG, {})


def test_only_the_batched_programs_are_compiled_for_register_tiles(clean_env, monkeypatch):
    """clang's loop interleaving changes the order of vectorised sums: the one-document
    programs must keep theirs (bit for bit), the batched ones run their tiles uninterleaved."""
    gcc = cc.CCompiler("gcc", "/usr/bin/gcc", "gcc", GCC_VERSION)
    tile_flags = cc.CLANG_TILE_CFLAGS.split()
    tiled, plain = cc.optimisation_flags(CLANG, {}, tiled=True), cc.optimisation_flags(CLANG, {})
    assert tiled[:len(plain) - 1] == plain[:-1] and tiled[len(plain) - 1:-1] == tile_flags
    assert cc.optimisation_flags(gcc, {}, tiled=True) == cc.optimisation_flags(gcc, {})  # a clang option
    monkeypatch.delenv("LDSHARED", raising=False)
    assert " ".join(tile_flags) in cc.build_environment(CLANG, tiled=True)["CFLAGS"]
    assert " ".join(tile_flags) not in cc.build_environment(CLANG)["CFLAGS"]
    assert [b for b in gen.BUILDS if gen.is_batched(b)] == [f"{t}{gen.BATCHED}" for t in gen.TARGETS]


def test_only_the_multicore_programs_include_the_spin_wait_header(clean_env, monkeypatch, tmp_path):
    """The header turns the Futhark scheduler's waits into spin-then-block ones: the
    multicore programs' only (the others have no worker threads), clang and gcc only."""
    gcc = cc.CCompiler("gcc", "/usr/bin/gcc", "gcc", GCC_VERSION)
    other = cc.CCompiler("tcc", "/usr/bin/tcc", "other", "tcc version 0.9.27")
    assert cc.SPIN_WAIT_HEADER.is_file() and cc.SPIN_VARIABLE in cc.SPIN_WAIT_HEADER.read_text()
    for compiler in (CLANG, gcc):
        flags = cc.optimisation_flags(compiler, {}, spin_wait=True)
        assert flags[-3:-1] == ["-include", str(cc.SPIN_WAIT_HEADER)]
        assert "-include" not in cc.optimisation_flags(compiler, {})
    assert "-include" not in cc.optimisation_flags(other, {}, spin_wait=True)
    assert [b for b in gen.BUILDS if fb.spins(b)] == ["multicore", "multicore_batch"]
    # the header's path reaches the compiler whole, spaces and all
    monkeypatch.delenv("LDSHARED", raising=False)
    spaced = tmp_path / "a folder" / "spin_wait.h"
    monkeypatch.setattr(cc, "SPIN_WAIT_HEADER", spaced)
    words = shlex.split(cc.build_environment(CLANG, spin_wait=True)["CFLAGS"])
    assert words[words.index("-include") + 1] == str(spaced)


def test_no_flag_lets_the_compiler_assume_finite_math():
    """Under -ffinite-math-only the compiler may drop isnan/isinf, and the divergence check with them."""
    for flags in (cc.CLANG_CFLAGS, cc.GCC_CFLAGS, cc.OTHER_CFLAGS):
        assert not set(flags.split()) & set(cc.FINITE_MATH_FLAGS)


@pytest.mark.skipif(os.name == "nt", reason="the gcc/clang flags are not passed to MSVC")
def test_build_environment_sets_the_compiler_and_puts_the_users_flags_last(monkeypatch):
    monkeypatch.setenv("CFLAGS", "-DUSER_FLAG -O1")
    monkeypatch.delenv("LDSHARED", raising=False)
    env = cc.build_environment(CLANG)
    flags = env["CFLAGS"].split()
    assert env["CC"] == "/usr/bin/clang" and "-fno-math-errno" in flags and "-O3" in flags
    assert flags[-2:] == ["-DUSER_FLAG", "-O1"]  # the user's come last, so they win
    # distutils swaps CC into LDSHARED when Python's LDSHARED starts with Python's CC ...
    config = {"CC": "gcc", "LDSHARED": "gcc -shared -L/py/lib"}
    monkeypatch.setattr(cc.sysconfig, "get_config_var", config.get)
    assert "LDSHARED" not in cc.build_environment(CLANG)
    # ... otherwise we do, so clang's flags never reach another linker
    config["LDSHARED"] = "x86_64-linux-gnu-gcc -shared -L/py/lib"
    assert cc.build_environment(CLANG)["LDSHARED"] == "/usr/bin/clang -shared -L/py/lib"
    monkeypatch.setenv("LDSHARED", "my-linker -shared")
    assert cc.build_environment(CLANG)["LDSHARED"] == "my-linker -shared"


# -- finding the Futhark compiler ------------------------------------------------

@pytest.mark.parametrize("output, version", [
    (FUTHARK_VERSION_OUTPUT, "0.25.9"),
    ("Futhark 0.24.3\n", "0.24.3"),
    ("Futhark 0.26.0-dev\ngit: abc\n", "0.26.0"),
    ("futhark: command not understood\n", None),
])
def test_parse_version(output, version):
    assert ft.parse_version(output) == version


def test_compiler_not_found_says_where_to_get_it(clean_env):
    with pytest.raises(ft.CompilerNotFound, match="futhark-lang.org/releases"):
        ft.find_compiler()


def test_compiler_found_on_path_with_its_version(clean_env):
    script = version_only_futhark(clean_env / "empty-bin")
    compiler = ft.find_compiler()
    assert compiler.path == str(script) and compiler.version == "0.25.9"
    assert compiler.version_tuple == (0, 25, 9)


def test_futhark_variable_overrides_path(clean_env, monkeypatch):
    version_only_futhark(clean_env / "empty-bin")
    other = version_only_futhark(clean_env / "elsewhere", "Futhark 0.24.3\n")
    monkeypatch.setenv("FUTHARK", str(other))
    assert ft.find_compiler() == ft.Compiler(str(other), "0.24.3")


def test_futhark_variable_naming_nothing_is_reported(clean_env, monkeypatch):
    monkeypatch.setenv("FUTHARK", str(clean_env / "no" / "futhark"))
    with pytest.raises(ft.CompilerNotFound, match="FUTHARK=.*does not name a Futhark compiler"):
        ft.find_compiler()


def test_a_broken_compiler_is_reported(clean_env):
    write_script(clean_env / "empty-bin", "futhark", "echo 'segmentation fault' >&2\nexit 139\n")
    with pytest.raises(ft.CompilerNotFound, match="not a working Futhark compiler.*139.*segmentation"):
        ft.find_compiler()


# -- why a backend is unavailable ------------------------------------------------

def test_no_c_compiler_is_reported(clean_env):
    version_only_futhark(clean_env / "empty-bin")
    available, reason = fb.probe("c")
    assert not available and "no C compiler" in reason and "clang" in reason


def test_missing_futhark_ffi_is_reported(with_clang, monkeypatch):
    real = ft.importlib.util.find_spec
    monkeypatch.setattr(ft.importlib.util, "find_spec", lambda name: None if name == "futhark_ffi" else real(name))
    available, reason = fb.probe("c")
    assert not available and "pip install futhark-ffi" in reason


def _libraries(*present):
    return lambda name: f"lib{name}.so" if name in present else None


def test_cuda_without_driver(clean_env):
    assert "no CUDA driver" in ft.cuda_problem(find_library=_libraries("nvrtc"))


def test_cuda_without_toolkit(clean_env):
    assert "CUDA toolkit was not found" in ft.cuda_problem(find_library=_libraries("cuda", "nvrtc"))


def test_cuda_toolkit_found_through_nvcc_on_path(clean_env, monkeypatch):
    toolkit = clean_env / "cuda-13.0"
    write_script(toolkit / "bin", "nvcc", "exit 0\n")
    (toolkit / "include").mkdir()
    (toolkit / "include" / "cuda.h").write_text("/* stand-in */\n")
    (toolkit / "lib64").mkdir()
    monkeypatch.setenv("PATH", f"{toolkit / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert ft.cuda_toolkit_root() == toolkit
    assert "NVRTC" in ft.cuda_problem(find_library=_libraries("cuda"))
    (toolkit / "lib64" / "libnvrtc.so.13").write_bytes(b"")
    assert ft.cuda_problem(find_library=_libraries("cuda")) is None


def test_cuda_toolkit_found_through_cuda_home(clean_env, monkeypatch):
    toolkit = clean_env / "toolkit"
    (toolkit / "include").mkdir(parents=True)
    (toolkit / "include" / "cuda.h").write_text("/* stand-in */\n")
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    assert ft.cuda_problem(find_library=_libraries("cuda", "nvrtc")) is None


def test_cuda_probe_reports_the_device_problem(with_clang, monkeypatch):
    monkeypatch.setattr(ft.ctypes.util, "find_library", lambda name: None)
    ft.device_problem.cache_clear()
    available, reason = fb.probe("cuda")
    assert not available and "no CUDA driver" in reason
    assert fb.probe("c")[0]


def test_opencl_reasons(clean_env, monkeypatch):
    no_platforms, one_platform = (lambda lib: 0), (lambda lib: 1)
    assert "no OpenCL library" in ft.opencl_problem(find_library=_libraries(), count_platforms=one_platform)
    if sys.platform != "darwin":
        assert "CL/cl.h" in ft.opencl_problem(find_library=_libraries("OpenCL"), count_platforms=one_platform)
        headers = clean_env / "include"
        (headers / "CL").mkdir(parents=True)
        (headers / "CL" / "cl.h").write_text("/* stand-in */\n")
        monkeypatch.setenv("CPATH", str(headers))
    assert "no OpenCL platform" in ft.opencl_problem(find_library=_libraries("OpenCL"),
                                                     count_platforms=no_platforms)
    assert ft.opencl_problem(find_library=_libraries("OpenCL"), count_platforms=one_platform) is None


def test_list_backends_lists_the_four_futhark_backends(clean_env):
    import engine

    infos = {info.name: info for info in engine.list_backends()}
    for name in ("futhark-c", "futhark-multicore", "futhark-cuda", "futhark-opencl"):
        assert name in infos and not infos[name].available
        assert "no C compiler" in infos[name].reason


@pytest.mark.parametrize("text, first", [
    (FUTHARK_ERROR, "Error at microgpt.fut:42:7-12:"),
    ("In file included from x.c:1:\nmicrogpt.c:10:5: warning: unused\nmicrogpt.c:99:3: error: "
     "too few arguments to function 'cuCtxCreate_v4'\n   99 | cuCtxCreate(&c, 0, d);\n",
     "microgpt.c:99:3: error: too few arguments to function 'cuCtxCreate_v4'"),
    ("no errors here\njust the last lines\n", "no errors here"),
])
def test_first_error_lines(text, first):
    lines = ft.first_error_lines(text).splitlines()
    assert lines[0] == first and len(lines) <= 8


def test_cuda13_failure_is_recognised():
    gcc = ("microgpt.c:5208:22: error: too few arguments to function 'cuCtxCreate_v4'\n"
           " 5208 |   CUDA_SUCCEED_FATAL(cuCtxCreate(&ctx->cu_ctx, 0, ctx->dev));\n")
    assert cuda13_incompatible(gcc)
    assert not cuda13_incompatible("microgpt.c:1:1: error: expected ';' before 'int'\n")


# -- the CUDA 13 fix (for code from Futhark before 0.25.34) -----------------------

# What Futhark before 0.25.34 generates around context creation.
GENERATED_CUDA = """#include <stdio.h>
  #include <cuda.h>
  #include <nvrtc.h>
#define CUDA_SUCCEED_FATAL(x) do { if ((x) != 0) return 1; } while (0)
struct futhark_context { CUcontext cu_ctx; CUdevice dev; };
int setup(struct futhark_context *ctx) {
  CUDA_SUCCEED_FATAL(cuCtxCreate(&ctx->cu_ctx, 0, ctx->dev));
  return 0;
}
"""
# What 0.25.34 and later generate: already handles both.
FIXED_CUDA = """#include <cuda.h>
int setup(struct futhark_context *ctx) {
#if (CUDART_VERSION >= 13000)
  CUDA_SUCCEED_FATAL(cuCtxCreate(&ctx->cu_ctx, NULL, 0, ctx->dev));
#else
  CUDA_SUCCEED_FATAL(cuCtxCreate(&ctx->cu_ctx, 0, ctx->dev));
#endif
}
"""
CUDA12_H = """#define CUDA_VERSION 12040
typedef int CUresult; typedef struct CUctx_st *CUcontext; typedef int CUdevice;
CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
"""
CUDA13_H = """#define CUDA_VERSION 13000
typedef int CUresult; typedef struct CUctx_st *CUcontext; typedef int CUdevice;
typedef struct CUctxCreateParams_st CUctxCreateParams;
CUresult cuCtxCreate(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev);
"""


def test_patch_cuda13_rewrites_the_three_argument_call():
    patched, changed = patch_cuda13(GENERATED_CUDA)
    assert changed
    assert not re.search(r"(?<!microgpt_)cuCtxCreate\(&ctx->cu_ctx", patched)
    assert "microgpt_cuCtxCreate(&ctx->cu_ctx, 0, ctx->dev)" in patched
    assert patched.index("microgpt_cuCtxCreate(CUcontext") > patched.index("#include <cuda.h>")
    assert patch_cuda13(patched) == (patched, False)  # idempotent
    assert patch_cuda13(FIXED_CUDA) == (FIXED_CUDA, False)
    assert patch_cuda13("int main(void) { return 0; }\n")[1] is False


def test_the_shipped_cuda_code_needs_no_patch():
    source = (gen.generated_dir() / "cuda" / "microgpt.c").read_text(encoding="utf-8")
    assert patch_cuda13(source) == (source, False)


def _syntax_check(cc_path: str, source: str, include: Path, tmp: Path) -> subprocess.CompletedProcess:
    (tmp / "nvrtc.h").write_text("/* stand-in */\n") if not (include / "nvrtc.h").exists() else None
    src = tmp / "generated.c"
    src.write_text(source)
    return subprocess.run([cc_path, "-std=c99", "-fsyntax-only", f"-I{include}", f"-I{tmp}", str(src)],
                          capture_output=True, text=True)


def _c_compiler_path() -> str:
    """The C compiler the backends build with (engine.futhark.cc), or a skip."""
    compiler = cc.find_c_compiler()
    if compiler is None:
        pytest.skip(cc.NO_C_COMPILER)
    return str(compiler.path)


@pytest.mark.parametrize("header", ["cuda12", "cuda13"])
def test_patched_code_compiles_against_cuda_12_and_13_headers(tmp_path, header):
    cc_path = _c_compiler_path()
    include = tmp_path / "include"
    include.mkdir()
    (include / "cuda.h").write_text(CUDA12_H if header == "cuda12" else CUDA13_H)
    patched, _ = patch_cuda13(GENERATED_CUDA)
    assert _syntax_check(cc_path, patched, include, tmp_path).returncode == 0
    unpatched = _syntax_check(cc_path, GENERATED_CUDA, include, tmp_path)
    if header == "cuda13":
        assert unpatched.returncode != 0 and cuda13_incompatible(unpatched.stderr)
    else:
        assert unpatched.returncode == 0


def test_patched_code_compiles_against_the_installed_cuda_13(tmp_path):
    root = ft.cuda_toolkit_root()
    if root is None:
        pytest.skip("no CUDA toolkit (cuda.h) here")
    cc_path = _c_compiler_path()
    header = (root / "include" / "cuda.h").read_text(errors="replace")
    if "#define CUDA_VERSION 13" not in header:
        pytest.skip(f"the CUDA toolkit at {root} is not CUDA 13")
    source = GENERATED_CUDA.replace("  #include <nvrtc.h>\n", "")
    assert _syntax_check(cc_path, source, root / "include", tmp_path).returncode != 0
    patched, _ = patch_cuda13(source)
    result = _syntax_check(cc_path, patched, root / "include", tmp_path)
    assert result.returncode == 0, result.stderr
