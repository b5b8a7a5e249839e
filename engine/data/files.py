"""Opening files a person chose (datasets, checkpoints) without blocking on them.

A FIFO with no writer blocks open() for reading forever, and a device never
ends; so files are opened with O_NONBLOCK and refused unless fstat() says they
are regular files.
"""
from __future__ import annotations

import os
import stat
from typing import BinaryIO

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


class NotARegularFile(OSError):
    """The path is a directory, pipe, device or socket; .kind says which ("a directory", ...)."""

    def __init__(self, path, kind: str):
        super().__init__(f"{path} is {kind}, not a regular file")
        self.kind = kind


def open_regular_file(path) -> tuple[BinaryIO, int]:
    """(binary file object, size in bytes) of a regular file, opened for reading.

    Raises FileNotFoundError, NotARegularFile, or another OSError.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except IsADirectoryError:
        raise NotARegularFile(path, "a directory") from None
    try:
        info = os.fstat(fd)
        for is_kind, kind in _KINDS:
            if is_kind(info.st_mode):
                raise NotARegularFile(path, kind)
        return os.fdopen(fd, "rb"), info.st_size
    except BaseException:
        os.close(fd)
        raise
