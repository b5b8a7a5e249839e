"""Keeping a batched step's freed memory for the next step (glibc's malloc).

glibc hands the free memory at the top of its heap back to the system once
there is more of it than a trim threshold (twice the mmap threshold, 128 KiB
at the start); the next allocation then maps it again, one page fault per
page. A batch on a small model allocates and frees a few MiB of activations
each step, all of it below those thresholds, so every step paid for its pages
again: a third of `learn`'s step at batch 32 (figures: docs/performance.md,
"Freed memory stays in glibc's heap").

glibc raises both thresholds by itself when a block it mapped on its own
(larger than the mmap threshold, at most 32 MiB) is freed: keep_freed_memory
frees one block the size of a step's activations, so a step's memory stays in
the heap for the next one. mallopt could set the thresholds too, but setting
any of them turns that adjustment off for the rest of the process, and large
models' activations are then mapped and unmapped every step, many times
slower. Elsewhere than glibc this allocates and frees one untouched block,
and changes nothing.
"""
from __future__ import annotations

import numpy as np

# glibc's largest dynamic mmap threshold on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX):
# a freed block raises the thresholds only if its chunk (the block, malloc's
# header, rounded up to whole pages) is at most this; a block of exactly 32 MiB
# is a page over it and raised nothing (every step from about s256 at 32
# documents on, whose activations pass 32 MiB, until 2026-12-05)
MMAP_THRESHOLD_MAX = 32 << 20
LARGEST_BLOCK = MMAP_THRESHOLD_MAX - (64 << 10)


def keep_freed_memory(step_bytes: int) -> None:
    """Let about step_bytes of memory freed during a step stay in the heap (see above).
    The block is never written, so it costs no memory."""
    np.empty(min(step_bytes, LARGEST_BLOCK), dtype=np.uint8)
