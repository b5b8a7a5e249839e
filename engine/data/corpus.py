"""The corpus: documents in microgpt's training order, vocabulary, encoding,
the token arrays every backend trains on, and the default dataset (makemore's
names.txt, shipped in engine/data/datasets/).

This is the one place that shapes the data.
"""
from __future__ import annotations

import codecs
import hashlib
import os
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from ..errors import DatasetError
from .files import NotARegularFile, open_regular_file
from ..memory import format_bytes

DEFAULT_DATASET_PATH = Path(__file__).resolve().parent / "datasets" / "names.txt"  # makemore's, MIT
DEFAULT_DATASET_SHA256 = "0a30b5557f192f32ab962680889aac5f6fda0f4cecf40a6d0b5694f58ea8cc4d"
SHUFFLE_SEED = 42  # microgpt: random.seed(42); random.shuffle(docs)

# names.txt is 0.2 MiB. 64 MiB of names is 9 million lines: it takes over a
# minute and about 1.3 GB to load, and a checkpoint stores its text four times
# over (UTF-32); a larger file is refused before it is read.
MAX_DATASET_BYTES = 64 << 20
# A list of names uses a few dozen characters. Each character has its own
# embedding and output row, and every step scores all of them.
MAX_VOCAB_CHARS = 10_000


@dataclass(frozen=True)
class TokenArrays:
    """All documents as one flat int32 array of `[bos] + ids + [bos]` runs.

    Document d occupies tokens[offsets[d] : offsets[d] + lengths[d]].
    """

    tokens: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray

    @property
    def max_length(self) -> int:
        return int(self.lengths.max())


def char_encoder(chars) -> Callable[[str], list[int]]:
    """text -> the ids of its characters in `chars`; ValueError naming a character
    that is not among them."""
    index = {ch: i for i, ch in enumerate(chars)}

    def encode(text: str) -> list[int]:
        try:
            return [index[ch] for ch in text]
        except KeyError as exc:
            raise ValueError(f"character {exc.args[0]!r} is not in the vocabulary") from None

    return encode


ARRAY_CHUNK_CHARS = 1 << 22  # characters encoded per NumPy pass (bounds the passes' memory)


def token_arrays(docs: list[str], chars: list[str]) -> TokenArrays:
    """The documents as TokenArrays, each character its index in chars (the last, where
    one repeats, as char_encoder's), bos = len(chars); ValueError naming a character
    not in chars. Whole-array NumPy passes over the text: a loop over the documents
    (three NumPy calls each) took 60 ms of CPU for names.txt, in a background thread
    beside the window, taking the GIL 100,000 times from the GUI thread meanwhile."""
    bos = len(chars)
    counts = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))  # characters per document
    lengths = (counts + 2).astype(np.int32)
    offsets = np.zeros(len(docs), dtype=np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    tokens = np.full(int(lengths.sum()), bos, dtype=np.int32)
    codes = np.array([ord(ch) for ch in chars], dtype=np.uint32)
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    first = 0
    while first < len(docs):  # documents in chunks of about ARRAY_CHUNK_CHARS characters
        end = first + max(1, int(np.searchsorted(np.cumsum(counts[first:]), ARRAY_CHUNK_CHARS, side="right")))
        text = "".join(docs[first:end]).encode("utf-32-le", "surrogatepass")
        found = np.frombuffer(text, dtype=np.uint32)
        at = np.searchsorted(sorted_codes, found, side="right") - 1  # the last of equal codes
        unknown = (at < 0) | (sorted_codes[np.maximum(at, 0)] != found)
        if unknown.any():
            raise ValueError(f"character {chr(found[int(np.argmax(unknown))])!r} is not in the vocabulary")
        # character j of document d goes to offsets[d] + 1 + j
        starts = np.repeat(offsets[first:end] + 1 - (np.cumsum(counts[first:end]) - counts[first:end]),
                           counts[first:end])
        tokens[starts + np.arange(len(found))] = order[at]
        first = end
    return TokenArrays(tokens, offsets, lengths)


class Corpus:
    """Documents in training order (shuffled once, as microgpt does) and the vocabulary."""

    def __init__(self, docs: list[str], chars: list[str] | None = None, *, shuffled: bool = False):
        if not docs:
            raise DatasetError("the dataset has no documents (every line is empty)")
        self.docs: list[str] = list(docs)
        if not shuffled:
            random.Random(SHUFFLE_SEED).shuffle(self.docs)
        self.chars: list[str] = sorted(set("".join(self.docs))) if chars is None else list(chars)
        if len(self.chars) > MAX_VOCAB_CHARS:
            raise DatasetError(
                f"the dataset uses {len(self.chars):,} different characters; microgpt-gui handles at "
                f"most {MAX_VOCAB_CHARS:,}, because each character gets its own embedding and output "
                "row and every step scores all of them (a list of names uses a few dozen). Check that "
                "the file is the text you meant, or remove rare characters.")
        self.bos: int = len(self.chars)
        self.vocab_size: int = self.bos + 1
        self._encode = char_encoder(self.chars)
        self._arrays: TokenArrays | None = None

    # construction -----------------------------------------------------------
    @classmethod
    def from_lines(cls, lines: Iterable[str]) -> "Corpus":
        """One document per line; whitespace stripped, empty lines skipped."""
        return cls([doc for doc in (line.strip() for line in lines) if doc])

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Corpus":
        """One document per line of a UTF-8 text file (a byte-order mark is skipped)."""
        path = Path(path)
        raw = read_dataset_bytes(path)
        if raw.startswith(codecs.BOM_UTF8):  # written by some editors; not a character of the text
            raw = raw[len(codecs.BOM_UTF8):]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            column = exc.start - raw.rfind(b"\n", 0, exc.start)
            raise DatasetError(
                f"{path}: line {line} is not valid UTF-8 (byte {column}); save the file as UTF-8 text"
            ) from None
        check_text(text, path)
        try:
            return cls.from_lines(text.split("\n"))
        except DatasetError as exc:
            raise DatasetError(f"{path}: {exc}") from None

    @classmethod
    def from_training_order(cls, docs: list[str], chars: list[str]) -> "Corpus":
        """Rebuild a corpus whose documents are already in training order (checkpoints)."""
        if docs == [""]:
            raise DatasetError("it holds no documents")
        if "" in docs:  # from_lines never makes one: each document is a non-empty line
            raise DatasetError(f"document {docs.index('') + 1:,} of {len(docs):,} is empty")
        corpus = cls(docs, chars, shuffled=True)
        unknown = set("".join(docs)) - set(chars)
        if unknown:
            raise DatasetError(f"documents use characters outside the vocabulary: {sorted(unknown)}")
        return corpus

    # encoding ---------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self._encode(text)

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.chars[i] for i in ids if i != self.bos)

    # shapes the backends train on -------------------------------------------
    @property
    def arrays(self) -> TokenArrays:
        if self._arrays is None:
            self._arrays = token_arrays(self.docs, self.chars)
        return self._arrays

    def count_truncated(self, block_size: int) -> int:
        """Documents longer than block_size - 1 characters lose their tail in training."""
        return int(np.count_nonzero(self.arrays.lengths - 2 > block_size - 1))

    def truncation_note(self, block_size: int) -> str:
        """A sentence for people when some documents are truncated, else ""."""
        n = self.count_truncated(block_size)
        if not n:
            return ""
        return (f"{n} documents longer than {block_size - 1} characters "
                f"(block_size {block_size}) train on their first {block_size} tokens")

    def __len__(self) -> int:
        return len(self.docs)

    def __repr__(self) -> str:
        return f"Corpus({len(self.docs)} docs, vocab {self.vocab_size})"


# Control characters other than tab and line ends: a text file has none, a binary
# file (an image, a zip, a file of NUL bytes) has them within its first bytes.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def check_text(text: str, path) -> None:
    """DatasetError naming the line of the first control character: the file is not text."""
    found = _CONTROL.search(text)
    if found:
        line = text.count("\n", 0, found.start()) + 1
        raise DatasetError(f"{path} is not a text file: line {line:,} holds the control character "
                           f"U+{ord(found.group()):04X}; choose a text file with one document per line")


def read_dataset_bytes(path: Path, limit: int | None = None) -> bytes:
    """The bytes of a regular file of at most `limit` (MAX_DATASET_BYTES) bytes, else a DatasetError.

    Opened without blocking and checked before reading (engine.data.files); the read
    itself stops after limit + 1 bytes, so a file that grows, or reports no
    size, is refused rather than read whole. A file that changes while it is read
    (truncated, grown or rewritten by another program) is refused, not loaded in part.
    """
    limit = MAX_DATASET_BYTES if limit is None else limit
    too_large = (f"{path} is larger than {format_bytes(limit)}, the most microgpt-gui reads as a "
                 "dataset (names.txt is 0.2 MiB); use a smaller part of it")
    try:
        f, size = open_regular_file(path)
        with f:
            if size > limit:
                raise DatasetError(f"{too_large} ({format_bytes(size)})")
            before = os.fstat(f.fileno())
            raw = f.read(limit + 1)
            after = os.fstat(f.fileno())
    except FileNotFoundError:
        raise DatasetError(f"dataset file not found: {path}") from None
    except NotARegularFile as exc:
        if exc.kind == "a directory":
            raise DatasetError(f"dataset path is a directory, not a text file: {path}") from None
        raise DatasetError(f"{path} is {exc.kind}, not a regular file: choose a text file "
                           "with one document per line") from None
    except OSError as exc:
        raise DatasetError(f"cannot read dataset {path}: {exc.strerror or exc}") from None
    if len(raw) > limit:
        raise DatasetError(too_large)
    if changed_while_read(before, after, len(raw)):
        raise DatasetError(
            f"{path} changed while it was being read: it had {before.st_size:,} bytes when opened, "
            f"{len(raw):,} were read, and it has {after.st_size:,} now. Another program is writing "
            "it; open it again once that has finished")
    return raw


def changed_while_read(before: os.stat_result, after: os.stat_result, bytes_read: int) -> bool:
    """Whether a file's read saw something other than its content when opened: its size
    or modification time moved, or the bytes read differ from its size. A file that
    reports size 0 throughout (/proc) has no size to compare the bytes with."""
    if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
        return True
    return bytes_read != before.st_size and before.st_size != 0


# default dataset ------------------------------------------------------------

# Folders that replace the per-user ones (tests, CI, a portable install): the data
# folder holds autosaves, the cache folder the compiled Futhark backends.
DATA_DIR_ENV = "MICROGPT_GUI_DATA_DIR"
CACHE_DIR_ENV = "MICROGPT_GUI_CACHE_DIR"


def user_data_dir() -> Path:
    """Per-user data directory (XDG on Linux, the platform's own elsewhere), or $MICROGPT_GUI_DATA_DIR."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "microgpt-gui"


def user_cache_dir() -> Path:
    """Per-user cache directory (XDG on Linux, the platform's own elsewhere), or $MICROGPT_GUI_CACHE_DIR."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    if sys.platform == "win32":
        return user_data_dir() / "cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "microgpt-gui"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "microgpt-gui"


def default_dataset_path(path: Path = DEFAULT_DATASET_PATH, sha256: str = DEFAULT_DATASET_SHA256) -> Path:
    """makemore's names.txt as shipped in the package, checked against its sha256
    (a damaged installation is a DatasetError, never a different training set)."""
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        raise DatasetError(f"the packaged dataset {path} cannot be read ({exc.strerror or exc}); "
                           "reinstall microgpt-gui, or choose a text file of your own") from None
    if digest != sha256:
        raise DatasetError(f"the packaged dataset {path} has been changed (sha256 {digest}, "
                           f"expected {sha256}); reinstall microgpt-gui, or choose a text file of your own")
    return path


def load_corpus(path: str | os.PathLike | None) -> Corpus:
    """The corpus from a file, or the packaged names.txt when path is None."""
    return Corpus.from_file(path if path is not None else default_dataset_path())
