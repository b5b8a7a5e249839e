"""Futhark plumbing: finding the tools (tools.py, cc.py), the shipped generated
C and its staleness check (generated.py), and building and caching the CFFI
extension a backend opens (build.py). Imports nothing from engine but errors
and data; the backends use it, never the other way round.

Regenerate kernels/generated/ after editing kernels/**/*.fut:
    python -m engine.futhark --regenerate
"""
from .build import DESCRIPTIONS, import_library, probe
from .generated import REGENERATE_COMMAND, TARGETS

__all__ = ["DESCRIPTIONS", "REGENERATE_COMMAND", "TARGETS", "import_library", "probe"]
