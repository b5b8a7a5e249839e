"""Free memory and sizes people can read: what the memory checks refuse with;
and the growing buffers that keep a run's per-step values.

On Linux an allocation past free memory can succeed and then get the process
killed, so sizes a person typed are checked against this before anything is
allocated (Backend, read_checkpoint).
"""
from __future__ import annotations

import os

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
