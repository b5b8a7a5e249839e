"""Helpers and fixtures for the Futhark tests (a pytest plugin, see conftest.py):
stand-in executables, a copy of the kernels folder to edit, the real Futhark
compiler where one is found, an environment in which no Futhark compiler
(or no tool at all) can be found, the session's shipped-code builds, and an
independent reference of the kernel's sampler.

The sampler's reference draws with tests/rng_reference.py (pure-Python
SplitMix64 and the float64 inverse-CDF draw of engine/model/sampling.py's
definition), after NumPy's full forward pass over the whole prefix for every
token (engine.model.gpt.next_token_logits, no cache).
"""
from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest

from engine.data.corpus import CACHE_DIR_ENV
from engine.futhark import build as fbuild
from engine.futhark import cc, generated
from engine.futhark import tools as ft
from engine.model.gpt import Weights, next_token_logits

from rng_reference import draw, uniform

REPO_ROOT = Path(__file__).resolve().parents[1]

FUTHARK_VERSION_OUTPUT = """Futhark 0.25.9
git: 1a2b3c4 (Mon Jan 1 00:00:00 2024 +0100)
Copyright (C) DIKU, University of Copenhagen, released under the ISC license.
"""
FUTHARK_ERROR = """Error at microgpt.fut:42:7-12:
Unknown name "relu'".

If you find this error message confusing, uninformative, or wrong, please open an issue:
  https://github.com/diku-dk/futhark/issues
"""
CLANG_VERSION = "Debian clang version 14.0.6"
GCC_VERSION = "gcc (Debian 12.2.0-14+deb12u1) 12.2.0"


def write_script(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\nPATH=/usr/bin:/bin:$PATH\n" + body)  # its own tools only
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def stand_in_futhark(folder: Path, body: str, version_output: str = FUTHARK_VERSION_OUTPUT) -> Path:
    """A `futhark` that answers --version with version_output and otherwise runs body."""
    return write_script(folder, "futhark", f"""if [ "$1" = "--version" ]; then
cat <<'EOF'
{version_output}EOF
exit 0
fi
{body}""")


def version_only_futhark(folder: Path, version_output: str = FUTHARK_VERSION_OUTPUT) -> Path:
    """A `futhark` that answers --version and refuses to compile anything."""
    return stand_in_futhark(folder, 'echo "this stand-in compiles nothing" >&2\nexit 2\n', version_output)


def stand_in_cc(folder: Path, name: str, version_line: str, body: str = "exit 0\n") -> Path:
    """A C compiler that answers --version like the real one and otherwise runs body."""
    return write_script(folder, name, f"""if [ "$1" = "--version" ]; then
echo "{version_line}"; exit 0
fi
{body}""")


def copy_kernels(dest: Path) -> Path:
    """A copy of kernels/ (sources, generated folder and manifest) to edit."""
    shutil.copytree(generated.KERNEL_DIR, dest, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def edit_kernel(kernel_dir: Path) -> None:
    """Change lib/microgpt.fut without changing what it computes."""
    source = kernel_dir / "lib" / "microgpt.fut"
    source.write_bytes(source.read_bytes() + b"\n-- an edit\n")


def real_futhark() -> str | None:
    """A real Futhark compiler: FUTHARK, or `futhark` on PATH (nothing beside the repository)."""
    candidates = [os.environ.get("FUTHARK"), shutil.which("futhark")]
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def hide_futhark(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Make sure no Futhark compiler can be found: FUTHARK names a file that does not
    exist (it wins over PATH, in this process and in the builds' subprocesses)."""
    monkeypatch.setenv("FUTHARK", str(folder / "no-futhark-here"))
    with pytest.raises(ft.CompilerNotFound):
        ft.find_compiler()


CLANG = cc.CCompiler("/usr/bin/clang", "/usr/bin/clang", "clang", CLANG_VERSION)

REAL_FUTHARK = real_futhark()
requires_real_futhark = pytest.mark.skipif(
    REAL_FUTHARK is None, reason="needs a Futhark compiler (set FUTHARK, or put futhark on PATH)")


@pytest.fixture
def real_compiler(monkeypatch) -> ft.Compiler:
    """The real Futhark compiler, named by FUTHARK for this test."""
    monkeypatch.setenv("FUTHARK", REAL_FUTHARK)
    return ft.find_compiler()


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    """An environment with no tools anywhere: PATH is an empty folder, the cache is private."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    for var in ("FUTHARK", "CC", "CFLAGS", "CPPFLAGS", "LDFLAGS", "LDSHARED", cc.PORTABLE_VARIABLE,
                "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CPATH", "C_INCLUDE_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)  # the suite's (conftest.py): the default's place instead
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(ft, "SYSTEM_INCLUDE_DIRS", [])
    monkeypatch.setattr(ft, "system_cuda_roots", lambda: [])
    ft.device_problem.cache_clear()
    yield tmp_path
    ft.device_problem.cache_clear()


@pytest.fixture
def with_clang(clean_env):
    """clean_env plus a stand-in clang 14 on PATH: the shipped code is buildable."""
    return stand_in_cc(clean_env / "empty-bin", "clang", CLANG_VERSION)


@pytest.fixture(scope="session")
def futhark_cpu_builds(tmp_path_factory) -> dict:
    """The futhark-c and futhark-multicore libraries (each target's program for one
    document a step and for batches) and the tests' oracle program, built once per session from the shipped C (kernels/generated/) with no Futhark
    compiler to be found; later
    sessions find them in the suite's build cache (conftest.py: pytest's cache
    folder, not the user's). Skips where there is no C compiler."""
    if cc.find_c_compiler() is None:
        pytest.skip(cc.NO_C_COMPILER)
    with pytest.MonkeyPatch.context() as monkeypatch:
        hide_futhark(monkeypatch, tmp_path_factory.mktemp("no-futhark"))
        builds = {}
        for target in ("c", "multicore", "c_batch", "multicore_batch", generated.ORACLE):
            plan = fbuild.plan(target)
            assert plan.origin.kind == "shipped", plan.origin
            builds[target] = fbuild.build(target)
    return builds


def build_compiler(libdir: Path) -> cc.CCompiler:
    """The C compiler a build was made with (its cache key's cc=), described again."""
    key = json.loads((libdir / "build.json").read_text())["key"]
    path = next(part for part in key if part.startswith("cc=")).partition("=")[2]
    return cc.find_c_compiler({"PATH": os.environ.get("PATH", ""), "CC": path})


@pytest.fixture
def session_compiler(futhark_cpu_builds, monkeypatch) -> cc.CCompiler:
    """The C compiler of the session's builds, kept for this test: a compiler installed
    since (clang beside gcc) would otherwise be found first, and plan another library."""
    compiler = build_compiler(futhark_cpu_builds["c"])
    if "CC" not in os.environ:  # the user's CC is what the builds used already
        monkeypatch.setenv("CC", compiler.path)
    return compiler


# futhark-multicore on a test-sized model runs futhark-c's sequential build at one
# document a step and at small batches (one thread is faster there), and trains
# batches of 8 or more in parts; this name runs its parallel build on two threads.
MULTICORE_2_THREADS = "futhark-multicore-2-threads"
MULTICORE_3_THREADS = "futhark-multicore-3-threads"  # products split unevenly in tasks
# Batches of a test-sized model train in parts on two threads (batches_in_parts);
# MULTICORE_2_THREADS's run the products' tasks instead (no model is small enough
# for parts there), MULTICORE_PARTS's train every batch from 2 documents in parts.
MULTICORE_PARTS = "futhark-multicore-in-parts"
CPU_BACKENDS = ["futhark-c", "futhark-multicore", MULTICORE_2_THREADS]
THREADS_OF = {MULTICORE_2_THREADS: "2", MULTICORE_3_THREADS: "3", MULTICORE_PARTS: "2"}


@pytest.fixture(autouse=True)
def _register_two_thread_multicore(request, monkeypatch):
    """MULTICORE_2_THREADS, MULTICORE_3_THREADS and MULTICORE_PARTS are backend names
    for the tests that are given them: futhark-multicore under the engine's own
    thread-count override, and its rule for batches in parts set as they say."""
    callspec = getattr(request.node, "callspec", None)
    names = [value for value in (callspec.params.values() if callspec else ())
             if isinstance(value, str) and value in THREADS_OF]
    if not names:
        return
    from engine import backends as registry
    from engine.backends import futhark_backend as fbk

    monkeypatch.setenv(fbk.THREADS_ENV, THREADS_OF[names[0]])
    if names[0] == MULTICORE_PARTS:
        monkeypatch.setattr(fbk, "PARTS_MIN_BATCH", 2)
    else:
        monkeypatch.setattr(fbk, "PARTS_MAX_PARAMS", 0)
    monkeypatch.setitem(registry._REGISTRY, names[0], registry._REGISTRY["futhark-multicore"])


class Oracle:
    """The tests' program (kernels/tests/oracle.fut, sequential C) for one backend's
    run: `vjp`'s loss and gradient of a training step, and the GPU programs'
    step (#gpu products) where no GPU is needed. Its model and weights are its
    own: states go in as host arrays."""

    def __init__(self, backend):
        from engine.backends import futhark_backend as fbk

        self._fut = fbk.open_context(generated.ORACLE)
        self._model = self._fut.new_model(*fbk.model_arguments(
            backend.model, backend.train_config, backend.corpus, backend.specs, 1, backend.split.n_train))

    def _weights(self, state, step: int):
        return self._fut.new_weights(self._model, state.params, state.m, state.v, step)

    def gradient(self, state, step: int) -> tuple[float, np.ndarray]:
        """vjp's loss and gradient of training step `step` at state's parameters."""
        loss, grad = self._fut.grad_vjp(self._model, self._weights(state, step), step)
        return float(loss), self._fut.from_futhark(grad)

    def gpu_steps(self, state, step: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """k steps of gpu.fut's training (train at B = 1, train_batch above) from state
        at step `step`: the losses, the parameters and the first moments after them."""
        weights, losses = self._fut.train_gpu(self._model, self._weights(state, step), k)
        return (self._fut.from_futhark(losses), self._fut.from_futhark(self._fut.get_params(weights)),
                self._fut.from_futhark(self._fut.get_m(weights)))


def backend_steps(backend, state, step: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """k steps of backend's own program from state at step `step`, as Oracle.gpu_steps."""
    from engine.backends import futhark_backend as fbk

    weights = backend._call("new_weights", backend._model, state.params, state.m, state.v, step)
    entry = fbk.train_entry(backend.train_config.batch_size, backend.trains_in_parts())
    weights, losses = backend._call(entry, backend._model, weights, k)
    return tuple(backend._values(x) for x in (losses, backend._call("get_params", weights),
                                               backend._call("get_m", weights)))


def assert_same_kernel_run(name: str, actual, desired, *, rtol: float, atol: float) -> None:
    """Two runs of backend `name`'s kernel from the same state: bit for bit on one
    thread; on two (MULTICORE_2_THREADS) the multicore scheduler splits sums by
    timing, so the last bits may differ: within the caller's rtol and atol then
    (NaN equals NaN)."""
    if name == MULTICORE_2_THREADS:
        np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(actual, desired)


# -- the sampler's reference ---------------------------------------------------

def reference_samples(params, specs, model, bos: int, num_samples: int, temperature: float,
                      seed: int, prefix=(), max_length: int | None = None) -> list[list[int]]:
    """Each sample's token ids after bos + prefix (names of at most max_length
    characters, default block_size), recomputing the whole sequence for every token."""
    weights = Weights(np.asarray(params, dtype=np.float32), specs, model)
    samples = []
    for j in range(num_samples):
        sequence, drawn = [bos, *prefix], []
        for position in range(len(prefix), max_length or model.block_size):
            logits = next_token_logits(weights, np.array([sequence]), model, np)[0]
            token = draw(logits, temperature, uniform(seed, j, position))
            if token == bos:
                break
            drawn.append(token)
            sequence.append(token)
        samples.append(drawn)
    return samples
