"""Free memory and sizes people can read: what the memory checks refuse with;
and the growing buffers that keep a run's per-step values.

On Linux an allocation past free memory can succeed and then get the process
killed, so sizes a person typed are checked against this before anything is
allocated (Backend, read_checkpoint).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def grown(buffer: np.ndarray, needed: int, keep: int, least: int = 0, most: int | None = None) -> np.ndarray:
    """buffer if it holds `needed` values; else a new one of twice its size (at
    least `needed` and `least`, at most `most`) holding its first `keep` values.
    Doubling keeps a long run's appends cheap, and its memory what its steps so
    far need."""
    if needed <= len(buffer):
        return buffer
    size = max(needed, 2 * len(buffer), least)
    if most is not None:
        size = min(size, most)
    out = np.empty(size, dtype=buffer.dtype)
    out[:keep] = buffer[:keep]
    return out


def available_memory_bytes() -> int | None:
    """Memory this process can still allocate: the least of the machine's available
    memory, its cgroup's headroom (a container's limit) and its address-space
    limit (RLIMIT_AS); None if none is known."""
    bound = tightest_bound()
    return bound[1] if bound else None


# what bounds the memory this process can allocate, and how a message names it (the
# functions are looked up by name when called, so a test can replace one)
_BOUNDS = (("", "machine_available_bytes"),
           (" (under this process's cgroup memory limit)", "cgroup_headroom_bytes"),
           (" (under this process's address-space limit, ulimit -v)", "address_space_headroom_bytes"))


def tightest_bound() -> tuple[str, int] | None:
    """(note for a message, bytes) of the least of the bounds; None if none is known."""
    known = [(note, n) for note, name in _BOUNDS if (n := globals()[name]()) is not None]
    return min(known, key=lambda bound: bound[1]) if known else None


def limit_note() -> str:
    """" (under this process's cgroup memory limit)" where a process limit, not the
    machine's free memory, is what a size was refused against; else ""."""
    bound = tightest_bound()
    return bound[0] if bound else ""


def machine_available_bytes() -> int | None:
    """Memory the OS can hand out without swapping (Linux's MemAvailable); None if unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


# cgroup v1 writes "no limit" as a number near 2^63
_UNLIMITED = 1 << 60
# (limit, usage, the reclaimable page cache counted in usage) files of cgroup v2 and v1
_CGROUP_FILES = (("memory.max", "memory.current", "inactive_file"),
                 ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2's no limit) is None


def _stat_value(path: Path, key: str) -> int:
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


def cgroup_folders(proc_cgroup: Path = Path("/proc/self/cgroup"),
                   root: Path = Path("/sys/fs/cgroup")) -> list[Path]:
    """This process's memory cgroup folders (v2, or v1's memory controller), innermost
    first with every ancestor up to the mount point: a limit set on any of them applies."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return []
    folders = []
    for line in lines:
        parts = line.split(":", 2)  # "0::/path" (v2), "4:memory:/path" (v1)
        if len(parts) != 3:
            continue
        controllers, relative = parts[1], parts[2]
        if controllers == "" and (root / "cgroup.controllers").is_file():
            mount = root
        elif "memory" in controllers.split(",") and (root / "memory").is_dir():
            mount = root / "memory"
        else:
            continue
        folder = mount / relative.strip().lstrip("/")
        if not folder.is_dir():  # a container sees its own cgroup at the mount point
            folder = mount
        while True:
            folders.append(folder)
            if folder == mount or mount not in folder.parents:
                break
            folder = folder.parent
    return folders


def cgroup_headroom_bytes(proc_cgroup: Path = Path("/proc/self/cgroup"),
                          root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The least (limit - usage) over this process's memory cgroups, not counting
    reclaimable page cache as used; None where no limit is set."""
    headroom = None
    for folder in cgroup_folders(proc_cgroup, root):
        for limit_file, usage_file, cache_key in _CGROUP_FILES:
            limit, usage = _read_int(folder / limit_file), _read_int(folder / usage_file)
            if limit is None or limit >= _UNLIMITED or usage is None:
                continue
            free = max(0, limit - max(0, usage - _stat_value(folder / "memory.stat", cache_key)))
            headroom = free if headroom is None else min(headroom, free)
    return headroom


def address_space_headroom_bytes() -> int | None:
    """RLIMIT_AS less the address space this process already uses; None without a limit."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY or soft < 0:
            return None
        with open("/proc/self/statm") as statm:
            used = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (ImportError, OSError, ValueError, IndexError, AttributeError):
        return None
    return max(0, soft - used)


def format_bytes(n: float) -> str:
    """1536 -> '1.5 KiB', 3 * 2**40 -> '3.0 TiB'."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_count(n: int) -> str:
    """A count with thousands separators, or in powers of ten past 10^10."""
    return f"{n:,}" if n < 10**10 else f"{n:.2g}".replace("e+", "e")
