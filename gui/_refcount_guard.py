"""Work around a reference-count bug in PySide6/shiboken6 6.12 on Python < 3.12.

There, methods that return None (every void Qt method: setText, setEnabled,
processEvents, ...) and Signal.emit (which returns a bool) hand back None,
True or False without taking a reference. From Python 3.12 on these objects
are immortal (PEP 683) and nothing happens; on 3.11 each call drops one
reference that was never taken, and after some thousand calls Python aborts
with "Fatal Python error: none_dealloc" (or bool_dealloc). A training window
makes thousands of such calls a minute.

The fix is what 3.12 does: give None, True and False a reference count that
can never run out. They live as long as the interpreter anyway, so nothing
is leaked.
"""
from __future__ import annotations

import ctypes
import sys

_RESERVE = 1 << 48  # 2.8e14 leaked references: centuries at a million calls a second


def make_singletons_immortal() -> bool:
    """Raise the reference counts of None, True and False on CPython < 3.12 (idempotent)."""
    if sys.implementation.name != "cpython" or sys.version_info >= (3, 12):
        return False
    for obj in (None, True, False):
        refcount = ctypes.c_ssize_t.from_address(id(obj))  # ob_refcnt, PyObject's first field
        if refcount.value < _RESERVE:
            refcount.value += _RESERVE
    return True
