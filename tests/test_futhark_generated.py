"""The generated C shipped in kernels/generated/: its staleness check against
the kernel sources, the commands that check and regenerate it, that each
program exports exactly the entry points its backend calls, that the
package carries it, that the GPU targets' code compiles against the
installed headers, and (with a real Futhark compiler) that regenerating
gives the same bytes."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from engine import BackendError
from engine.backends import futhark_backend as fbk
from engine.futhark import cc
from engine.futhark import generated as gen
from engine.futhark import tools as ft
from engine.futhark.__main__ import main as futhark_main
from futhark_support import copy_kernels, edit_kernel, requires_real_futhark, stand_in_futhark


# -- the shipped code and its staleness check ------------------------------------

def test_the_generated_folder_matches_the_kernel_sources():
    """Fails after an edit of kernels/*.fut until kernels/generated/ is regenerated."""
    problems = gen.check()
    assert not problems, "\n".join(problems)
    manifest = gen.read_manifest()
    step_builds = {gen.step_build(t, b) for t in gen.TARGETS for b in (1, 32)}
    assert set(manifest["generated"]) == set(gen.BUILDS) == step_builds | {gen.ORACLE}
    assert manifest["kernel_sources"] == gen.source_hashes(gen.kernel_sources())
    assert {"lib/model.fut", "lib/train.fut", "tests/oracle.fut", "c.fut", "c_batch.fut", "gpu.fut",
            "gpu_batch.fut"} <= set(manifest["kernel_sources"])


def _entry_points(build: str) -> set[str]:
    """The entry points build's generated library exports (Futhark's manifest)."""
    manifest = json.loads((gen.generated_dir() / build / "microgpt.json").read_text(encoding="utf-8"))
    return set(manifest["entry_points"])


@pytest.mark.parametrize("target", gen.TARGETS)
@pytest.mark.parametrize("batch", [1, 32])
def test_each_backends_program_exports_exactly_what_the_backend_calls(target, batch):
    """What the backend calls at a batch size is the whole library of that batch
    size's program: nothing compiled for nobody (the vjp oracle, another target's
    step, the other batch size's step)."""
    build = gen.step_build(target, batch)
    manifest = json.loads((gen.generated_dir() / build / "microgpt.json").read_text(encoding="utf-8"))
    assert manifest["backend"] == gen.futhark_target(build) == target
    assert _entry_points(build) == set(fbk.entry_points(batch, target))


def test_the_oracle_is_a_test_program_for_c_alone():
    assert gen.PROGRAMS[gen.ORACLE] == gen.Program("tests/oracle.fut", "c")
    assert "grad_vjp" in _entry_points(gen.ORACLE)
    assert all("grad_vjp" not in _entry_points(build) for build in gen.BUILDS if build != gen.ORACLE)


def test_the_backend_calls_only_its_listed_entry_points():
    """Every entry-point name the backend's code passes to _call is in ENTRY_POINTS, and
    every listed one is called: read from the module's source, so the list is not a
    copy the code could drift from."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(fbk))
    called = {node.args[0].value for node in ast.walk(tree)
              if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "_call"
              and node.args and isinstance(node.args[0], ast.Constant)}
    getters = {elt.value for node in ast.walk(tree) if isinstance(node, ast.Tuple)
               for elt in node.elts if isinstance(elt, ast.Constant) and str(elt.value).startswith("get_")}
    trains = {fbk.train_entry(1), fbk.train_entry(2), fbk.train_entry(2, in_parts=True)}
    assert called | getters | trains == set(fbk.ENTRY_POINTS)


def test_the_backend_refuses_an_entry_point_it_does_not_list():
    from engine.config import TrainConfig

    backend = object.__new__(fbk.FutharkCBackend)
    backend.train_config = TrainConfig()
    with pytest.raises(ValueError, match="grad_vjp"):
        backend._call("grad_vjp")
    with pytest.raises(ValueError, match="train_batch"):  # the batches' program has it, B = 1's not
        backend._call("train_batch")
    backend.train_config = TrainConfig(batch_size=32)
    for entry in ("train", "sample", "doc_losses"):  # the batches' program has none of them
        with pytest.raises(ValueError, match=entry):
            backend._call(entry)


def test_an_edited_kernel_is_stale_and_names_the_regenerate_command(tmp_path):
    kernels = copy_kernels(tmp_path / "kernels")
    assert gen.check(kernels) == []
    edit_kernel(kernels)
    problem = gen.sources_problem(kernels)
    assert "changed lib/microgpt.fut" in problem and gen.REGENERATE_COMMAND in problem
    assert gen.shipped_problem("c", kernels) == problem
    assert gen.check(kernels) == [problem]


def test_a_new_or_removed_kernel_file_is_stale(tmp_path):
    kernels = copy_kernels(tmp_path / "kernels")
    (kernels / "lib").mkdir(exist_ok=True)
    (kernels / "lib" / "linalg.fut").write_text("def dot [n] (a: [n]f32) (b: [n]f32) = 0f32\n")
    assert "added lib/linalg.fut" in gen.sources_problem(kernels)
    (kernels / "lib" / "linalg.fut").unlink()
    assert gen.sources_problem(kernels) is None
    # a .fut file inside the generated folder is not a kernel source
    (kernels / "generated" / "scratch.fut").write_text("def x = 1\n")
    assert gen.sources_problem(kernels) is None and "generated/scratch.fut" not in gen.kernel_sources(kernels)
    manifest = gen.read_manifest(kernels)
    manifest["kernel_sources"]["old.fut"] = "0" * 64
    (kernels / "generated" / gen.MANIFEST).write_text(json.dumps(manifest))
    assert "removed old.fut" in gen.sources_problem(kernels)


def test_an_edited_or_missing_generated_file_is_caught(tmp_path):
    kernels = copy_kernels(tmp_path / "kernels")
    header = kernels / "generated" / "multicore" / "microgpt.h"
    header.write_bytes(header.read_bytes() + b"/* hand edit */\n")
    assert "changed after it was generated" in gen.target_problem("multicore", kernels)
    assert gen.target_problem("c", kernels) is None
    (kernels / "generated" / "c" / "microgpt.c").unlink()
    assert "microgpt.c is missing" in gen.target_problem("c", kernels)
    (kernels / "generated" / gen.MANIFEST).unlink()
    problem = gen.sources_problem(kernels)
    assert "missing or unreadable" in problem and gen.REGENERATE_COMMAND in problem


def test_check_command(capsys):
    assert futhark_main(["--check"]) == 0
    assert "matches the kernel sources" in capsys.readouterr().out


def test_regenerate_command_without_a_compiler_says_so(clean_env, capsys):
    assert futhark_main(["--regenerate"]) == 1
    assert "Futhark compiler not found" in capsys.readouterr().err


# Writes what `futhark <target> --library -o microgpt <program>` writes, from the sources.
GENERATING_FUTHARK = """[ "$2 $3 $4" = "--library -o microgpt" ] && [ -f "$5" ] || exit 9
echo "/* $1 code of $5 $(cat *.fut lib/*.fut tests/*.fut 2>/dev/null | cksum) */" > microgpt.c
echo "/* $1 header */" > microgpt.h
echo '{"backend": "'$1'"}' > microgpt.json
"""


def test_regenerate_rewrites_every_target_and_the_manifest(clean_env, tmp_path):
    kernels = copy_kernels(tmp_path / "kernels")
    edit_kernel(kernels)
    (kernels / "lib").mkdir(exist_ok=True)
    (kernels / "lib" / "extra.fut").write_text("def one = 1f32\n")
    stand_in_futhark(clean_env / "empty-bin", GENERATING_FUTHARK, "Futhark 0.25.99\n")
    said = []
    manifest = gen.regenerate(ft.find_compiler(), kernels, say=said.append)
    assert gen.check(kernels) == [] and gen.read_manifest(kernels) == manifest
    shipped_sources = {path.relative_to(gen.KERNEL_DIR).as_posix() for path in gen.KERNEL_DIR.rglob("*.fut")
                       if path.relative_to(gen.KERNEL_DIR).parts[0] != gen.GENERATED}
    assert manifest["futhark"] == "0.25.99"
    assert set(manifest["kernel_sources"]) == shipped_sources | {"lib/extra.fut"}
    assert {d.name for d in (kernels / "generated").iterdir() if d.is_dir()} == set(gen.BUILDS)
    for build, program in gen.PROGRAMS.items():
        files = sorted(p.name for p in (kernels / "generated" / build).iterdir())
        assert files == sorted(gen.GENERATED_FILES)
        code = (kernels / "generated" / build / "microgpt.c").read_text()
        assert code.startswith(f"/* {program.target} code of {program.source} ")
    assert any("0.25.99" in line for line in said)


def test_a_failed_regenerate_leaves_the_folder_as_it_was(clean_env, tmp_path):
    kernels = copy_kernels(tmp_path / "kernels")
    edit_kernel(kernels)
    before = {p: p.read_bytes() for p in (kernels / "generated").rglob("*") if p.is_file()}
    stand_in_futhark(clean_env / "empty-bin", """if [ "$1" = "cuda" ]; then echo "Error at microgpt.fut:1:1: no CUDA today" >&2; exit 1; fi
echo "/* $1 */" > microgpt.c; echo > microgpt.h; echo "{}" > microgpt.json
""", "Futhark 0.25.99\n")
    with pytest.raises(BackendError, match=r"(?s)could not compile gpu.fut for the cuda build.*no CUDA today"):
        gen.regenerate(ft.find_compiler(), kernels, say=lambda line: None)
    assert {p: p.read_bytes() for p in (kernels / "generated").rglob("*") if p.is_file()} == before


def test_the_package_ships_the_generated_folder():
    """pyproject's package-data names every generated file (checked in a real wheel for the README)."""
    import tomllib

    data = tomllib.loads((gen.KERNEL_DIR.parent / "pyproject.toml").read_text())
    patterns = data["tool"]["setuptools"]["package-data"]["kernels"]
    shipped = {p.relative_to(gen.KERNEL_DIR).as_posix() for p in gen.generated_dir().rglob("*") if p.is_file()}
    assert shipped == {f"generated/{b}/{n}" for b in gen.BUILDS for n in gen.GENERATED_FILES} | {"generated/manifest.json"}
    sources = {f"{name}" for name in gen.kernel_sources()} - {p.name for p in gen.KERNEL_DIR.glob("*.fut")}
    assert sources and all(any(Path(name).match(pattern) for pattern in patterns) for name in shipped | sources)


# -- the GPU backends' shipped C against the installed headers ---------------------

# NVRTC's API as the generated code uses it (documented in NVIDIA's NVRTC guide),
# for toolkits that ship cuda.h without nvrtc.h (as the CUDA headers here do).
NVRTC_H = """#ifndef MICROGPT_STAND_IN_NVRTC_H
#define MICROGPT_STAND_IN_NVRTC_H
#include <stddef.h>
typedef enum { NVRTC_SUCCESS = 0 } nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;
const char *nvrtcGetErrorString(nvrtcResult result);
nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name, int numHeaders,
                               const char *const *headers, const char *const *includeNames);
nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog);
nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions, const char *const *options);
nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t *ptxSizeRet);
nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char *ptx);
nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *logSizeRet);
nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *log);
#endif
"""


def _compile_object(target: str, includes: list[Path], tmp_path: Path) -> None:
    compiler = cc.find_c_compiler()
    if compiler is None:
        pytest.skip(cc.NO_C_COMPILER)
    source = gen.generated_dir() / target / "microgpt.c"
    cmd = [compiler.path, "-std=c99", "-O0", "-c", *(f"-I{d}" for d in includes), str(source),
           "-o", str(tmp_path / f"{target}.o")]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(cmd)}\n{ft.first_error_lines(result.stderr)}"
    assert (tmp_path / f"{target}.o").stat().st_size > 0


@pytest.mark.parametrize("build", ["cuda", "cuda_batch"])
def test_shipped_cuda_code_compiles_against_the_cuda_headers(build, tmp_path):
    root = ft.cuda_toolkit_root()
    if root is None:
        pytest.skip("no CUDA toolkit headers (cuda.h) here: CUDA_HOME, nvcc on PATH or /usr/local/cuda")
    includes = [root / "include"]
    if not (root / "include" / "nvrtc.h").is_file():
        (tmp_path / "nvrtc.h").write_text(NVRTC_H)
        includes.append(tmp_path)
    _compile_object(build, includes, tmp_path)


@pytest.mark.parametrize("build", ["opencl", "opencl_batch"])
def test_shipped_opencl_code_compiles_against_the_opencl_headers(build, tmp_path):
    roots = [root / "include"] if (root := ft.cuda_toolkit_root()) else []
    found = [d for d in ft._include_dirs(os.environ, roots) if (d / "CL" / "cl.h").is_file()]
    if not found:
        pytest.skip("no OpenCL headers (CL/cl.h) here: apt install opencl-headers")
    _compile_object(build, found[:1], tmp_path)


# -- with a real Futhark compiler ----------------------------------------------------

@requires_real_futhark
def test_regenerating_reproduces_the_shipped_code(real_compiler, tmp_path):
    """Same compiler version, same sources: the same bytes (checked for the c target;
    every build was checked when the folder was made)."""
    version = gen.read_manifest()["futhark"]
    if real_compiler.version != version:
        pytest.skip(f"the shipped code is from Futhark {version}, the compiler here is {real_compiler.version}")
    with open(tmp_path / "log", "w") as log:
        gen.generate(real_compiler, "c", gen.kernel_sources(), tmp_path, log)
    for name in gen.GENERATED_FILES:
        assert (tmp_path / name).read_bytes() == (gen.generated_dir() / "c" / name).read_bytes(), name
