"""The generated C shipped in kernels/generated/, and the check that keeps it
in step with the kernel sources.

Each build compiles one program of kernels/ (PROGRAMS): per backend target a
program for one document a step (c.fut, multicore.fut, gpu.fut for cuda and
opencl) and one for batches (c_batch.fut, ...: build `<target>_batch`), each
exporting exactly the entry points its backend calls at that batch size, and
the tests' oracle, tests/oracle.fut, for c alone. (Two programs per target:
Futhark 0.25.34 compiled the one-document step differently whenever the
batched step beside it changed; kernels/README.md.) kernels/generated/<build>/ holds exactly what
`futhark <target> --library -o microgpt <program>` writes (microgpt.c, .h,
.json); kernels/generated/manifest.json records the Futhark version that
wrote them, the SHA-256 of every kernel source they came from
(kernels/**/*.fut, kernels/lib/ and kernels/tests/ included) and of every
generated file. The shipped code for a build is used only while all of
those still match; otherwise a Futhark compiler has to compile the kernels,
and REGENERATE_COMMAND refreshes the folder.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Mapping

from ..errors import BackendError
from .tools import Compiler, first_error_lines, run_logged

KERNEL_DIR = Path(__file__).resolve().parents[2] / "kernels"
GENERATED = "generated"  # kernels/generated: not a kernel source
KERNEL = "microgpt"  # every generated library's name: microgpt.c, .h and .json


@dataclass(frozen=True)
class Program:
    """What one build compiles: a program of kernels/ and Futhark's backend for it."""
    source: str  # relative to kernels/
    target: str  # `futhark <target> --library`


TARGETS = ("c", "multicore", "cuda", "opencl")  # the backends' Futhark targets; each has two builds
BATCHED = "_batch"  # the suffix of a target's build for batches: "c_batch"
ORACLE = "oracle"  # the tests' build: grad_vjp and the GPU step in sequential C
_SOURCES = {"c": "c", "multicore": "multicore", "cuda": "gpu", "opencl": "gpu"}  # target -> program name
PROGRAMS = {
    **{f"{t}{suffix}": Program(f"{_SOURCES[t]}{suffix}.fut", t) for suffix in ("", BATCHED) for t in TARGETS},
    ORACLE: Program("tests/oracle.fut", "c"),
}
BUILDS = tuple(PROGRAMS)


def step_build(target: str, batch_size: int) -> str:
    """The build whose program trains `batch_size` documents a step on a backend target."""
    return target if batch_size == 1 else f"{target}{BATCHED}"


def is_batched(build: str) -> bool:
    """Whether a build's program trains batches of B > 1 documents ("c_batch")."""
    return build.endswith(BATCHED)


def futhark_target(build: str) -> str:
    """The Futhark backend a build compiles for ("c_batch" -> "c")."""
    return PROGRAMS[build].target


GENERATED_FILES = tuple(f"{KERNEL}.{ext}" for ext in ("c", "h", "json"))
MANIFEST = "manifest.json"
REGENERATE_COMMAND = "python -m engine.futhark --regenerate"


def kernel_sources(kernel_dir: Path = KERNEL_DIR) -> dict[str, bytes]:
    """Every .fut file under kernel_dir except the generated folder, by relative path."""
    files = sorted(f for f in kernel_dir.rglob("*.fut")
                   if f.relative_to(kernel_dir).parts[0] != GENERATED)
    sources = {f.relative_to(kernel_dir).as_posix(): f.read_bytes() for f in files}
    for program in sorted({p.source for p in PROGRAMS.values()}):
        if program not in sources:
            raise BackendError(f"the kernel program {kernel_dir / program} is missing")
    return sources


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def source_hashes(sources: Mapping[str, bytes]) -> dict[str, str]:
    return {name: sha256(sources[name]) for name in sorted(sources)}


@lru_cache(maxsize=32)
def _file_hash(path: str, mtime_ns: int, size: int) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_hash(path: Path) -> str:
    """SHA-256 of a file, read once per process while it is unchanged (the largest is 8 MB)."""
    stat = path.stat()
    return _file_hash(str(path), stat.st_mtime_ns, stat.st_size)


def generated_dir(kernel_dir: Path = KERNEL_DIR) -> Path:
    return kernel_dir / GENERATED


def read_manifest(kernel_dir: Path = KERNEL_DIR) -> dict | None:
    """The folder's manifest, or None where there is none (or it is unreadable)."""
    try:
        manifest = json.loads((generated_dir(kernel_dir) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or not {"futhark", "kernel_sources", "generated"} <= manifest.keys():
        return None
    return manifest


def _differences(recorded: Mapping[str, str], actual: Mapping[str, str]) -> str:
    changed = sorted(n for n in recorded.keys() & actual.keys() if recorded[n] != actual[n])
    parts = [f"{label} {', '.join(names)}" for label, names in (
        ("changed", changed), ("added", sorted(actual.keys() - recorded.keys())),
        ("removed", sorted(recorded.keys() - actual.keys()))) if names]
    return "; ".join(parts)


def sources_problem(kernel_dir: Path = KERNEL_DIR, sources: Mapping[str, bytes] | None = None) -> str | None:
    """Why the generated folder does not match the kernel sources, or None."""
    manifest = read_manifest(kernel_dir)
    folder = generated_dir(kernel_dir)
    if manifest is None:
        return f"{folder / MANIFEST} is missing or unreadable; run `{REGENERATE_COMMAND}`"
    sources = kernel_sources(kernel_dir) if sources is None else sources
    differences = _differences(manifest["kernel_sources"], source_hashes(sources))
    if differences:
        return (f"the kernel sources differ from those {folder} was generated from "
                f"({differences}); run `{REGENERATE_COMMAND}`")
    return None


def target_problem(target: str, kernel_dir: Path = KERNEL_DIR) -> str | None:
    """Why build `target`'s shipped files (a backend's target, or ORACLE) cannot be
    used as they are (missing or edited), or None."""
    manifest = read_manifest(kernel_dir)
    recorded = (manifest or {}).get("generated", {}).get(target)
    folder = generated_dir(kernel_dir) / target
    if not recorded:
        return f"{folder} has no {target} code recorded in its manifest; run `{REGENERATE_COMMAND}`"
    for name in GENERATED_FILES:
        path = folder / name
        if not path.is_file():
            return f"{path} is missing; run `{REGENERATE_COMMAND}`"
        if file_hash(path) != recorded.get(name):
            return f"{path} was changed after it was generated; run `{REGENERATE_COMMAND}`"
    return None


def shipped_problem(target: str, kernel_dir: Path = KERNEL_DIR,
                    sources: Mapping[str, bytes] | None = None) -> str | None:
    """Why the shipped code for target cannot be built as it is, or None."""
    return sources_problem(kernel_dir, sources) or target_problem(target, kernel_dir)


def check(kernel_dir: Path = KERNEL_DIR) -> list[str]:
    """Every problem with the generated folder (empty when it is in step)."""
    problems = [sources_problem(kernel_dir)] + [target_problem(b, kernel_dir) for b in BUILDS]
    return [p for p in problems if p]


def shipped_digest(target: str, kernel_dir: Path = KERNEL_DIR) -> str:
    """The recorded hashes of target's generated files (the files match them when usable)."""
    recorded = read_manifest(kernel_dir)["generated"][target]
    return sha256("".join(f"{n}={recorded[n]};" for n in GENERATED_FILES).encode())


def shipped_version(kernel_dir: Path = KERNEL_DIR) -> str | None:
    manifest = read_manifest(kernel_dir)
    return manifest["futhark"] if manifest else None


# -- generating ----------------------------------------------------------------

def generate_command(compiler_path: str, build: str) -> list[str]:
    """The command that generates build's code: `futhark <target> --library -o microgpt <program>`."""
    program = PROGRAMS[build]
    return [compiler_path, program.target, "--library", "-o", KERNEL, program.source]


def generate(compiler: Compiler, target: str, sources: Mapping[str, bytes], work: Path, log) -> None:
    """Build `target`'s program (a backend's target, or ORACLE) compiled by
    `futhark <its target> --library` over a copy of the sources in work, which
    then holds GENERATED_FILES; raises BackendError with the compiler's first error."""
    for name, data in sources.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_bytes(data)
    status, output = run_logged(generate_command(compiler.path, target), log, work)
    if status != 0:
        raise BackendError(f"Futhark {compiler.version} could not compile {PROGRAMS[target].source} for the "
                           f"{target} build:\n{first_error_lines(output)}")


def _generate_one(compiler: Compiler, target: str, sources: Mapping[str, bytes], work: Path) -> dict[str, bytes]:
    (work / target).mkdir()
    with open(work / f"{target}.log", "w", encoding="utf-8") as log:
        generate(compiler, target, sources, work / target, log)
    return {name: (work / target / name).read_bytes() for name in GENERATED_FILES}


def regenerate(compiler: Compiler, kernel_dir: Path = KERNEL_DIR, say=print) -> dict:
    """Rewrite kernels/generated/ from the kernel sources with compiler; returns the manifest.

    Every target is generated first (in parallel) in a temporary folder, so a
    failure leaves the shipped folder as it was.
    """
    sources = kernel_sources(kernel_dir)
    folder = generated_dir(kernel_dir)
    with tempfile.TemporaryDirectory(prefix="microgpt-regenerate-") as tmp:
        say(f"generating {', '.join(BUILDS)} with Futhark {compiler.version} ({compiler.path})")
        with ThreadPoolExecutor(max_workers=max(1, min(len(BUILDS), os.cpu_count() or 1))) as pool:
            outputs = dict(zip(BUILDS, pool.map(
                lambda b: _generate_one(compiler, b, sources, Path(tmp)), BUILDS)))
    for old in (d for d in folder.iterdir() if d.is_dir() and d.name not in outputs) if folder.is_dir() else ():
        shutil.rmtree(old)  # a build that no longer exists
    for target, files in outputs.items():
        target_dir = folder / target
        if target_dir.exists():
            shutil.rmtree(target_dir)
        target_dir.mkdir(parents=True)
        for name, data in files.items():
            (target_dir / name).write_bytes(data)
        say(f"  {target_dir}: " + ", ".join(f"{n} {len(d):,} bytes" for n, d in files.items()))
    manifest = {
        "futhark": compiler.version,
        "command": f"futhark <target> --library -o {KERNEL} <program>",
        "programs": {b: {"source": p.source, "target": p.target} for b, p in PROGRAMS.items()},
        "regenerate": REGENERATE_COMMAND,
        "kernel_sources": source_hashes(sources),
        "generated": {t: {n: sha256(d) for n, d in files.items()} for t, files in outputs.items()},
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    say(f"  {folder / MANIFEST}")
    return manifest

