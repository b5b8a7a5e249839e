"""Finding the tools and building the Futhark kernels on demand, without the compiler.

Stand-in executables (a `futhark` that only answers --version or only
fails, a `cc`, an `nvcc`) on a temporary PATH exercise compiler detection
and every reason a backend is unavailable; none of them produces a library,
so nothing here pretends kernels were compiled. The CUDA 13 fix is checked
by compiling generated-style C with the real C compiler against CUDA 12-
and 13-style headers (and the installed CUDA 13 cuda.h where there is one).
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from engine import BackendError, ModelConfig, TrainConfig, Corpus, open_backend
from engine import futhark_build as fb
from engine import futhark_tools as ft

FUTHARK_VERSION_OUTPUT = """Futhark 0.25.9
git: 1a2b3c4 (Mon Jan 1 00:00:00 2024 +0100)
Copyright (C) DIKU, University of Copenhagen, released under the ISC license.
"""


def write_script(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\nPATH=/usr/bin:/bin:$PATH\n" + body)  # its own tools only
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def version_only_futhark(folder: Path, version_output: str = FUTHARK_VERSION_OUTPUT) -> Path:
    """A `futhark` that answers --version and refuses to compile anything."""
    return write_script(folder, "futhark", f"""if [ "$1" = "--version" ]; then
cat <<'EOF'
{version_output}EOF
exit 0
fi
echo "this stand-in compiles nothing" >&2
exit 2
""")


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    """An environment with no compiler anywhere: PATH is an empty folder, the cache is private."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    for var in ("FUTHARK", "CC", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CPATH", "C_INCLUDE_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(ft, "SYSTEM_INCLUDE_DIRS", [])
    monkeypatch.setattr(ft, "system_cuda_roots", lambda: [])
    ft.device_problem.cache_clear()
    yield tmp_path
    ft.device_problem.cache_clear()


# -- the cache key ---------------------------------------------------------------

def test_kernel_sources_are_the_kernels_folder():
    sources = fb.kernel_sources()
    assert "microgpt.fut" in sources
    assert sources["microgpt.fut"] == (fb.KERNEL_DIR / "microgpt.fut").read_bytes()


def test_cache_key_covers_sources_target_compiler_and_python():
    sources = {"microgpt.fut": b"entry main = 1"}
    key = fb.cache_key("c", "0.25.9", sources, python="cpython-311")
    assert key == fb.cache_key("c", "0.25.9", dict(sources), python="cpython-311")
    variants = [
        fb.cache_key("c", "0.25.9", {"microgpt.fut": b"entry main = 2"}, python="cpython-311"),
        fb.cache_key("c", "0.25.9", {**sources, "lib.fut": b"def x = 1"}, python="cpython-311"),
        fb.cache_key("multicore", "0.25.9", sources, python="cpython-311"),
        fb.cache_key("c", "0.25.10", sources, python="cpython-311"),
        fb.cache_key("c", "0.25.9", sources, python="cpython-312"),
    ]
    assert len({key, *variants}) == 6


def test_cache_key_cannot_be_fooled_by_moving_bytes_between_files():
    a = fb.cache_key("c", "1", {"a.fut": b"xy", "b.fut": b""}, python="p")
    b = fb.cache_key("c", "1", {"a.fut": b"x", "b.fut": b"y"}, python="p")
    assert a != b


def test_library_dir_is_per_user_cache_and_changes_with_the_kernel(clean_env, monkeypatch):
    compiler = ft.Compiler("/x/futhark", "0.25.9")
    libdir = fb.library_dir("c", compiler)
    assert libdir.parent == clean_env / "cache" / "microgpt-gui" / "futhark"
    assert libdir.name.startswith("microgpt-c-")
    edited = {**fb.kernel_sources(), "microgpt.fut": fb.kernel_sources()["microgpt.fut"] + b"\n-- edit\n"}
    assert fb.library_dir("c", compiler, sources=edited) != libdir
    assert fb.log_path(libdir).parent == libdir.parent / "logs"


# -- finding the compiler ------------------------------------------------------

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
    available, reason = fb.probe("c")
    assert not available and "Futhark compiler not found" in reason and "FUTHARK" in reason


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


# -- why a backend is unavailable ----------------------------------------------

def test_no_c_compiler_is_reported(clean_env):
    version_only_futhark(clean_env / "empty-bin")
    available, reason = fb.probe("c")
    assert not available and "no C compiler" in reason


def test_c_backends_available_with_compiler_and_cc(clean_env):
    bindir = clean_env / "empty-bin"
    version_only_futhark(bindir)
    write_script(bindir, "cc", "exit 0\n")
    for target in ("c", "multicore"):
        available, reason = fb.probe(target)
        assert available, reason
        assert "Futhark 0.25.9" in reason and "compiles on first use" in reason


def test_cc_variable_names_the_c_compiler(clean_env, monkeypatch):
    write_script(clean_env / "tools", "my-cc", "exit 0\n")
    monkeypatch.setenv("CC", "my-cc -O2")
    assert ft.find_c_compiler() is None  # not on PATH
    monkeypatch.setenv("PATH", str(clean_env / "tools"))
    assert ft.find_c_compiler() == str(clean_env / "tools" / "my-cc")


def test_missing_futhark_ffi_is_reported(clean_env, monkeypatch):
    bindir = clean_env / "empty-bin"
    version_only_futhark(bindir)
    write_script(bindir, "cc", "exit 0\n")
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


def test_cuda_probe_reports_the_device_problem(clean_env, monkeypatch):
    bindir = clean_env / "empty-bin"
    version_only_futhark(bindir)
    write_script(bindir, "cc", "exit 0\n")
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
        assert "Futhark compiler not found" in infos[name].reason


# -- a failed compile -----------------------------------------------------------

FUTHARK_ERROR = """Error at microgpt.fut:42:7-12:
Unknown name "relu'".

If you find this error message confusing, uninformative, or wrong, please open an issue:
  https://github.com/diku-dk/futhark/issues
"""


def failing_futhark(folder: Path) -> Path:
    """A `futhark` that knows its version and rejects the program, as a type error would."""
    return write_script(folder, "futhark", f"""if [ "$1" = "--version" ]; then
echo "Futhark 0.25.9"; exit 0
fi
echo "Compiling $@" >&1
cat >&2 <<'EOF'
{FUTHARK_ERROR}EOF
exit 1
""")


def test_failed_compile_raises_with_the_first_error_lines_and_log(clean_env):
    failing_futhark(clean_env / "empty-bin")
    with pytest.raises(BackendError) as caught:
        fb.build("c")
    message = str(caught.value)
    assert "Error at microgpt.fut:42:7-12" in message and 'Unknown name "relu\'"' in message
    log = fb.log_path(fb.library_dir("c", ft.find_compiler()))
    assert f"Full log: {log}" in message
    text = log.read_text()
    assert "Unknown name" in text and "--library" in text and "[exit status 1]" in text
    # nothing half-built is left to be mistaken for a library: only the log and the lock
    left = {p.name for p in fb.cache_root().iterdir() if not p.name.endswith(".lock")}
    assert left == {"logs"}


def test_failed_compile_reaches_open_backend_caller(clean_env):
    failing_futhark(clean_env / "empty-bin")
    cc = shutil.which("cc", path=os.defpath) or shutil.which("gcc", path=os.defpath)
    if cc is None:
        pytest.skip("no C compiler on the default PATH")
    write_script(clean_env / "empty-bin", "cc", f'exec {cc} "$@"\n')
    corpus = Corpus.from_lines(["anna", "bob"])
    with pytest.raises(BackendError, match=r"(?s)could not compile.*Unknown name.*Full log: .*\.log"):
        open_backend("futhark-c", ModelConfig(), TrainConfig(num_steps=5), corpus)


@pytest.mark.parametrize("text, first", [
    (FUTHARK_ERROR, "Error at microgpt.fut:42:7-12:"),
    ("In file included from x.c:1:\nmicrogpt.c:10:5: warning: unused\nmicrogpt.c:99:3: error: "
     "too few arguments to function 'cuCtxCreate_v4'\n   99 | cuCtxCreate(&c, 0, d);\n",
     "microgpt.c:99:3: error: too few arguments to function 'cuCtxCreate_v4'"),
    ("no errors here\njust the last lines\n", "no errors here"),
])
def test_first_error_lines(text, first):
    lines = fb.first_error_lines(text).splitlines()
    assert lines[0] == first and len(lines) <= 8


def test_cuda13_failure_is_recognised():
    gcc = ("microgpt.c:5208:22: error: too few arguments to function 'cuCtxCreate_v4'\n"
           " 5208 |   CUDA_SUCCEED_FATAL(cuCtxCreate(&ctx->cu_ctx, 0, ctx->dev));\n")
    assert fb.cuda13_incompatible(gcc)
    assert not fb.cuda13_incompatible("microgpt.c:1:1: error: expected ';' before 'int'\n")


@pytest.mark.skipif(os.name == "nt", reason="the gcc/clang flags are not passed to MSVC")
def test_build_env_adds_optimisation_flags_before_the_users(monkeypatch):
    monkeypatch.setenv("CFLAGS", "-DUSER_FLAG -O1")
    flags = fb._build_env("c")["CFLAGS"].split()
    assert "-fno-math-errno" in flags and "-O3" in flags
    # the user's flags come last, so they win (gcc takes the last -O)
    assert flags[-2:] == ["-DUSER_FLAG", "-O1"]
    assert "-ffast-math" not in flags  # results must stay IEEE-rounded
    monkeypatch.delenv("CFLAGS")
    assert fb._build_env("multicore")["CFLAGS"].split() == fb.GCC_CFLAGS.split()


# -- the CUDA 13 fix ------------------------------------------------------------

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
    patched, changed = fb.patch_cuda13(GENERATED_CUDA)
    assert changed
    assert not re.search(r"(?<!microgpt_)cuCtxCreate\(&ctx->cu_ctx", patched)
    assert "microgpt_cuCtxCreate(&ctx->cu_ctx, 0, ctx->dev)" in patched
    assert patched.index("microgpt_cuCtxCreate(CUcontext") > patched.index("#include <cuda.h>")
    assert fb.patch_cuda13(patched) == (patched, False)  # idempotent
    assert fb.patch_cuda13(FIXED_CUDA) == (FIXED_CUDA, False)
    assert fb.patch_cuda13("int main(void) { return 0; }\n")[1] is False


def _syntax_check(cc: str, source: str, include: Path, tmp: Path) -> subprocess.CompletedProcess:
    (tmp / "nvrtc.h").write_text("/* stand-in */\n") if not (include / "nvrtc.h").exists() else None
    src = tmp / "generated.c"
    src.write_text(source)
    return subprocess.run([cc, "-std=c99", "-fsyntax-only", f"-I{include}", f"-I{tmp}", str(src)],
                          capture_output=True, text=True)


@pytest.mark.parametrize("header", ["cuda12", "cuda13"])
def test_patched_code_compiles_against_cuda_12_and_13_headers(tmp_path, header):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    include = tmp_path / "include"
    include.mkdir()
    (include / "cuda.h").write_text(CUDA12_H if header == "cuda12" else CUDA13_H)
    patched, _ = fb.patch_cuda13(GENERATED_CUDA)
    assert _syntax_check(cc, patched, include, tmp_path).returncode == 0
    unpatched = _syntax_check(cc, GENERATED_CUDA, include, tmp_path)
    if header == "cuda13":
        assert unpatched.returncode != 0 and fb.cuda13_incompatible(unpatched.stderr)
    else:
        assert unpatched.returncode == 0


def test_patched_code_compiles_against_the_installed_cuda_13(tmp_path):
    root = ft.cuda_toolkit_root()
    cc = shutil.which("cc") or shutil.which("gcc")
    if root is None or cc is None:
        pytest.skip("no CUDA toolkit (cuda.h) or no C compiler here")
    header = (root / "include" / "cuda.h").read_text(errors="replace")
    if "#define CUDA_VERSION 13" not in header:
        pytest.skip(f"the CUDA toolkit at {root} is not CUDA 13")
    source = GENERATED_CUDA.replace("  #include <nvrtc.h>\n", "")
    assert _syntax_check(cc, source, root / "include", tmp_path).returncode != 0
    patched, _ = fb.patch_cuda13(source)
    result = _syntax_check(cc, patched, root / "include", tmp_path)
    assert result.returncode == 0, result.stderr


# -- the lock -------------------------------------------------------------------

def test_file_lock_excludes_a_second_holder(tmp_path):
    path = tmp_path / "build.lock"
    with fb.FileLock(path):
        with pytest.raises(TimeoutError, match="locked by another process"):
            fb.FileLock(path, timeout=0).acquire()
    second = fb.FileLock(path, timeout=0).acquire()
    second.release()


def test_file_lock_excludes_another_process(tmp_path):
    path = tmp_path / "build.lock"
    code = ("import sys; sys.path.insert(0, sys.argv[2]); from engine.futhark_build import FileLock\n"
            "try:\n    FileLock(sys.argv[1], timeout=0).acquire()\nexcept TimeoutError:\n    sys.exit(3)\n")
    root = str(Path(__file__).resolve().parents[1])
    with fb.FileLock(path):
        held = subprocess.run([sys.executable, "-c", code, str(path), root])
    free = subprocess.run([sys.executable, "-c", code, str(path), root])
    assert (held.returncode, free.returncode) == (3, 0)


def test_an_unwritable_cache_is_a_backend_error(clean_env, monkeypatch):
    version_only_futhark(clean_env / "empty-bin")
    blocker = clean_env / "not-a-folder"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    with pytest.raises(BackendError, match="cannot build in the Futhark cache"):
        fb.build("c")
