"""Checkpoints: one .npz with configs, vocabulary, documents in training order,
parameters, Adam moments, step and loss history; written atomically.

Reading trusts nothing in the file. The zip directory's member names are
checked before anything is decompressed, and each member's declared size
against what its field can hold; each .npy header (dtype and shape) is read
before its data, so nothing is allocated from a size the file merely claims;
then the values. Every field that is wrong is a CheckpointError naming it.
The data of a stored member (np.savez stores, it does not compress) is read
from the file straight into its array in one call, as is its CRC computed:
both let go of the GIL, so a window reading a checkpoint in a background
thread keeps its GUI thread waiting for the GIL only while the small members
and the checks run (`python scripts/checkpoint_read_gil.py`).

Writing goes to a temporary file beside the destination, locked while it is
written and until it is renamed over it: a save killed midway leaves the
previous checkpoint intact, and the next save to that folder removes the
leftover (unlocked files of our own name pattern only: a dead writer holds
no lock).
"""
from __future__ import annotations

import math
import os
import re
import secrets
import struct
import time
import zipfile
import zlib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from ..config import ModelConfig, TrainConfig
from ..data.corpus import MAX_DATASET_BYTES, MAX_VOCAB_CHARS, Corpus
from ..errors import CheckpointError, DatasetError
from .heldout import HeldoutPoint
from ..data.files import NotARegularFile, open_regular_file
from ..memory import available_memory_bytes, format_bytes, limit_note

try:
    import fcntl
except ImportError:  # Windows: a file being written cannot be deleted there anyway
    fcntl = None

FORMAT_VERSION = 2
# Format 1 (before batches and held-out documents) has none of these members;
# it loads as the run it was: one document per step, nothing held out, no warm-up.
NEW_IN_2 = {"train.batch_size": 1, "train.holdout": 0, "train.warmup_steps": 0,
            "heldout_steps": None, "heldout_losses": None}
READABLE_VERSIONS = (1, 2)
_PARAM_ARRAYS = ("params", "m", "v")
_CONFIGS = (("model.", ModelConfig), ("train.", TrainConfig))
NPY_HEADER_BYTES = 4096  # the most a member's .npy header may take
SCALAR_BYTES = NPY_HEADER_BYTES + 64

TEMP_SUFFIX = ".microgpt-tmp"
# Where locks say nothing (Windows; an empty file whose writer may not have locked it
# yet), a temporary file this old was left by a killed save.
STALE_TEMP_SECONDS = 300
_TEMP_NAME = re.compile(r".+\.[0-9a-f]{12}" + re.escape(TEMP_SUFFIX))
_OLD_TEMP_NAME = re.compile(r".+\.npz\.[a-z0-9_]{8}\.tmp")  # mkstemp's, from earlier versions


@dataclass
class Checkpoint:
    model: ModelConfig
    train: TrainConfig
    corpus: Corpus
    params: np.ndarray
    m: np.ndarray
    v: np.ndarray
    step: int
    losses: np.ndarray
    backend: str
    heldout: list[HeldoutPoint] = field(default_factory=list)  # held-out evaluations, by step


def _fields() -> dict[str, str]:
    """Every member of a checkpoint (without .npy) and what it holds: int, float, text or array."""
    kinds = {"format_version": "int", "step": "int", "backend": "text", "chars": "text", "docs": "text"}
    for prefix, config in _CONFIGS:
        for f in fields(config):
            kinds[prefix + f.name] = "int" if f.type in ("int", "int | None") else "float"
    kinds.update({name: "array" for name in (*_PARAM_ARRAYS, "losses", "heldout_steps", "heldout_losses")})
    return kinds


# ---- writing ----------------------------------------------------------------------

def save_checkpoint(path, backend) -> Path:
    """Write backend's full training state to path (temporary file + rename)."""
    path = Path(path)
    state = backend.get_state()
    corpus = backend.corpus
    payload = {
        "format_version": np.int64(FORMAT_VERSION),
        "backend": np.str_(backend.name),
        "step": np.int64(state.step),
        "chars": np.str_("".join(corpus.chars)),
        "docs": np.str_("\n".join(corpus.docs)),
        "params": state.params, "m": state.m, "v": state.v,
        "losses": backend.loss_history,
    }
    for prefix, cfg in (("model.", backend.model), ("train.", backend.train_config)):
        for key, value in asdict(cfg).items():
            payload[prefix + key] = np.asarray(value)
    payload["train.holdout"] = np.int64(backend.holdout)  # the count it resolved to, not None
    heldout = backend.heldout_history
    payload["heldout_steps"] = np.array([p.step for p in heldout], dtype=np.int64)
    payload["heldout_losses"] = np.array([p.loss for p in heldout], dtype=np.float64)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(path.parent)
    fd, tmp = _create_temp_file(path)
    try:
        with os.fdopen(fd, "wb") as out:
            if fcntl is not None:  # held until closed: a concurrent save's cleanup leaves it alone
                fcntl.flock(out.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            np.savez(out, **payload)
            out.flush()
            os.fsync(out.fileno())
            if fcntl is not None:  # renamed while locked: no other save's cleanup takes it
                os.replace(tmp, path)
        if fcntl is None:  # Windows renames only closed files
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _create_temp_file(path: Path) -> tuple[int, str]:
    """A new file beside path, named <name>.<12 hex>.microgpt-tmp. Created with mode
    0666 less the umask, as any file the user saves (mkstemp's 0600 is for secrets)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        tmp = str(path.parent / f"{path.name}.{secrets.token_hex(6)}{TEMP_SUFFIX}")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue


def remove_stale_temp_files(folder, min_age: float = STALE_TEMP_SECONDS) -> list[str]:
    """Delete the temporary files killed saves left in folder; return their names.

    Only files named as save_checkpoint names them (or as earlier versions did,
    <name>.npz.<8 characters>.tmp) and not locked: a save in progress holds a lock
    on its file from before its first byte until it is renamed, and a killed
    process's lock is gone. Where that cannot tell (no flock; an empty file), only
    files older than min_age seconds.
    """
    removed = []
    now = time.time()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        if not (_TEMP_NAME.fullmatch(entry.name) or _OLD_TEMP_NAME.fullmatch(entry.name)):
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            info = entry.stat(follow_symlinks=False)
            if (fcntl is None or info.st_size == 0) and now - info.st_mtime < min_age:
                continue
            if _locked(entry.path):
                continue
            os.unlink(entry.path)
            removed.append(entry.name)
        except OSError:  # gone meanwhile, or not ours to delete
            continue
    return removed


def _locked(path: str) -> bool:
    if fcntl is None:
        return False
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the lock taken here


# ---- reading ----------------------------------------------------------------------

def read_checkpoint(path) -> Checkpoint:
    """Read and validate a checkpoint without opening a backend."""
    path = Path(path)
    try:
        f, _ = open_regular_file(path)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint not found: {path}") from None
    except NotARegularFile as exc:
        raise CheckpointError(f"{path} is {exc.kind}, not a checkpoint file") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from None
    with f:
        if f.read(6) == b"\x93NUMPY":
            raise CheckpointError(f"{path} is a single NumPy array (.npy), not a microgpt-gui "
                                  "checkpoint (.npz)")
        f.seek(0)
        try:
            with zipfile.ZipFile(f) as z:
                return _read(z, path)
        except CheckpointError:
            raise
        except MemoryError:
            raise CheckpointError(f"{path}: not enough memory to read this checkpoint") from None
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError,
                RuntimeError) as exc:
            raise CheckpointError(
                f"{path} is not a readable microgpt-gui checkpoint (truncated or corrupt: {exc})"
            ) from None


def _read(z: zipfile.ZipFile, path: Path) -> Checkpoint:
    kinds = _fields()
    members = _members(z, path, kinds)

    def value(key: str):
        kind = kinds[key]
        if kind == "text":
            limit = {"chars": 4 * MAX_VOCAB_CHARS, "docs": 4 * MAX_DATASET_BYTES}.get(key, 1024)
            arr = _read_member(z, members[key], path, key, NPY_HEADER_BYTES + limit,
                               f"text of at most {limit // 4:,} characters",
                               lambda shape, dtype: _expect_scalar(path, key, shape, dtype, "U", "text"))
            return str(arr[()])
        wanted = ("iu", "an integer") if kind == "int" else ("fiu", "a number")
        arr = _read_member(z, members[key], path, key, SCALAR_BYTES, f"{wanted[1]}",
                           lambda shape, dtype: _expect_scalar(path, key, shape, dtype, *wanted))
        number = arr[()].item()
        return int(number) if kind == "int" else float(number)

    version = value("format_version")
    if version not in READABLE_VERSIONS:
        raise CheckpointError(f"{path} has checkpoint format {version}; this version reads "
                              f"{' and '.join(map(str, READABLE_VERSIONS))}")
    _check_version_members(members, version, path)

    def setting(key: str):
        return value(key) if key in members else NEW_IN_2[key]

    try:  # the configs refuse what is outside engine.config.FIELD_LIMITS, as they do for a new run
        model, train = (config(**{f.name: setting(prefix + f.name) for f in fields(config)})
                        for prefix, config in _CONFIGS)
    except ValueError as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"{path} holds an invalid configuration: {exc}") from None
    try:
        corpus = Corpus.from_training_order(value("docs").split("\n"), list(value("chars")))
    except DatasetError as exc:
        raise CheckpointError(f"{path}: its dataset ('docs') is unusable: {exc}") from None
    step, backend = value("step"), value("backend")
    if not 0 <= step <= train.num_steps:
        raise CheckpointError(f"{path}: step {step} is outside 0..num_steps ({train.num_steps:,})")

    n = model.num_params(corpus.vocab_size)
    need, free = 4 * (3 * n + step), available_memory_bytes()
    if free is not None and need > free:
        raise CheckpointError(
            f"{path}: its {n:,} parameters, Adam moments and {step:,} losses need "
            f"{format_bytes(need)} of memory to read, but {format_bytes(free)} is available{limit_note()}")
    arrays = {}
    for key in _PARAM_ARRAYS:
        arrays[key] = _read_float32(z, members[key], path, key, n, (
            f"the model {model} with vocabulary {corpus.vocab_size} has {n} parameters"))
    losses = _read_float32(z, members["losses"], path, "losses", step, None)
    for key, arr in (*arrays.items(), ("losses", losses)):
        bad = arr.size - int(np.count_nonzero(np.isfinite(arr)))
        if bad:
            raise CheckpointError(f"{path}: '{key}' holds {bad:,} NaN or infinite values; "
                                  "a run cannot continue from it")
    negative = int(np.count_nonzero(arrays["v"] < 0))
    if negative:
        raise CheckpointError(f"{path}: 'v' holds {negative:,} negative values, but Adam's second "
                              "moment is an average of squares")
    heldout = _read_heldout(z, members, path, step) if version >= 2 else []
    return Checkpoint(model, train, corpus, arrays["params"], arrays["m"], arrays["v"],
                      step, losses, backend, heldout)


def _check_version_members(members: dict, version: int, path: Path) -> None:
    """Format 2's members are all there in a format 2 file, and none in a format 1 file."""
    for key in NEW_IN_2:
        if version >= 2 and key not in members:
            raise CheckpointError(f"{path} is not a microgpt-gui checkpoint: it has no '{key}'")
        if version < 2 and key in members:
            raise CheckpointError(f"{path} is not a microgpt-gui checkpoint: it has an unexpected "
                                  f"member '{key}.npy' for format {version}")


def _read_heldout(z, members: dict, path: Path, step: int) -> list[HeldoutPoint]:
    """The held-out evaluations: at most one per step from 0 to `step`, in order, finite."""
    found = {}
    for key, dtype in (("heldout_steps", np.int64), ("heldout_losses", np.float64)):
        def expect(shape, got, key=key, dtype=dtype):
            if got != dtype or len(shape) != 1 or shape[0] > step + 1:
                raise CheckpointError(f"{path}: '{key}' must be a 1-D {np.dtype(dtype)} array of at "
                                      f"most {step + 1:,} values (one per step), got {got} {shape}")
        found[key] = _read_member(z, members[key], path, key, NPY_HEADER_BYTES + 8 * (step + 1),
                                  f"at most {step + 1:,} values", expect)
    steps, losses = found["heldout_steps"], found["heldout_losses"]
    if len(steps) != len(losses):
        raise CheckpointError(f"{path}: {len(steps)} held-out steps but {len(losses)} held-out losses")
    if len(steps) and (steps[0] < 0 or steps[-1] > step or np.any(np.diff(steps) <= 0)):
        raise CheckpointError(f"{path}: 'heldout_steps' must rise from 0 to at most step {step:,}")
    if not np.all(np.isfinite(losses)):
        raise CheckpointError(f"{path}: 'heldout_losses' holds NaN or infinite values")
    return [HeldoutPoint(int(s), float(x)) for s, x in zip(steps, losses)]


def _members(z: zipfile.ZipFile, path: Path, kinds: dict[str, str]) -> dict[str, zipfile.ZipInfo]:
    """The zip directory's entries by field name, refusing unknown, repeated and missing ones."""
    members = {}
    for info in z.infolist():
        key = info.filename[: -len(".npy")] if info.filename.endswith(".npy") else None
        if key not in kinds:
            raise CheckpointError(f"{path} is not a microgpt-gui checkpoint: it has an unexpected "
                                  f"member '{info.filename}'")
        if key in members:
            raise CheckpointError(f"{path}: '{key}' appears twice")
        members[key] = info
    for key in kinds:
        if key not in members and key not in NEW_IN_2:  # those: _check_version_members
            raise CheckpointError(f"{path} is not a microgpt-gui checkpoint: it has no '{key}'")
    return members


def _expect_scalar(path, key, shape, dtype, kinds: str, what: str) -> None:
    if shape != () or dtype.kind not in kinds:
        got = f"an array of shape {shape}" if shape != () else f"a value of type {dtype}"
        raise CheckpointError(f"{path}: '{key}' must be {what}, got {got}")


def _read_float32(z, info, path, key: str, length: int, why: str | None) -> np.ndarray:
    def expect(shape, dtype):
        if dtype != np.float32 or len(shape) != 1:
            raise CheckpointError(f"{path}: '{key}' must be a 1-D float32 array, got {dtype} {shape}")
        if shape[0] != length:
            if why is None:
                raise CheckpointError(f"{path}: step {length} does not match its loss history "
                                      f"({shape[0]} losses)")
            raise CheckpointError(f"{path}: '{key}' has {shape[0]} values but {why}")

    return _read_member(z, info, path, key, NPY_HEADER_BYTES + 4 * length,
                        f"a 1-D float32 array of {length:,} values", expect)


def _read_member(z: zipfile.ZipFile, info: zipfile.ZipInfo, path, key: str, max_bytes: int,
                 what: str, expect) -> np.ndarray:
    """One .npy member, checked before its data is read: the size the zip directory
    declares, then the dtype and shape its header states (expect(shape, dtype)
    raises when they are wrong), then that the two agree."""
    if info.file_size > max_bytes:
        raise CheckpointError(f"{path}: '{key}' declares {format_bytes(info.file_size)}, more than "
                              f"{what} takes (at most {format_bytes(max_bytes)})")
    with z.open(info) as stream:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise CheckpointError(f"{path}: '{key}' has .npy version {version}, which is not read here")
        if dtype.hasobject:
            raise CheckpointError(f"{path}: '{key}' holds Python objects, which are not read")
        expect(shape, dtype)
        data_bytes = math.prod(shape) * dtype.itemsize
        if stream.tell() + data_bytes != info.file_size:
            raise CheckpointError(f"{path}: '{key}' is damaged: its header describes {data_bytes:,} "
                                  f"bytes, its zip entry holds {info.file_size - stream.tell():,}")
        arr = np.empty(shape, dtype=dtype, order="F" if fortran else "C")
        view = memoryview(arr.reshape(-1, order="A")).cast("B") if data_bytes else memoryview(b"")
        if info.compress_type == zipfile.ZIP_STORED:  # as np.savez writes them
            if info.compress_size != info.file_size:
                raise CheckpointError(f"{path}: '{key}' is damaged: its zip entry stores "
                                      f"{info.compress_size:,} bytes of {info.file_size:,}")
            _read_stored_data(z.fp, info, stream.tell(), view, key)
            return arr
        _read_into(stream, view, key)
        if stream.read(1):  # reading to the end also checks the CRC
            raise CheckpointError(f"{path}: '{key}' holds more data than its header describes")
    return arr


def _read_into(f, view: memoryview, key: str) -> None:
    done = 0
    while done < len(view):
        got = f.readinto(view[done:])
        if not got:
            raise EOFError(f"'{key}' ends early")
        done += got


def _read_stored_data(f, info: zipfile.ZipInfo, header_bytes: int, view: memoryview, key: str) -> None:
    """The data of a stored (uncompressed) member, after its .npy header of header_bytes,
    read from the file straight into view, and the member's CRC checked as zipfile checks
    it. zipfile's reader would copy it through bytes objects in Python, holding the GIL
    throughout (a GUI thread beside a read waits for it hundreds of times); here it is
    one read and one CRC, both C calls that let go of the GIL. The local header's name
    and flags were checked when zipfile opened the member."""
    f.seek(info.header_offset + zipfile.sizeFileHeader - 4)
    name_bytes, extra_bytes = struct.unpack("<2H", f.read(4))
    f.seek(info.header_offset + zipfile.sizeFileHeader + name_bytes + extra_bytes)
    crc = zlib.crc32(f.read(header_bytes))
    _read_into(f, view, key)
    if zlib.crc32(view, crc) != info.CRC:
        raise zipfile.BadZipFile(f"Bad CRC-32 for file {info.filename!r}")
