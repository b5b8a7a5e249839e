"""engine.data.corpus: microgpt's training order, vocabulary, encoding, file handling,
the token arrays, and the packaged default dataset."""
from __future__ import annotations

import fnmatch
import hashlib
import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from engine import Corpus, DatasetError, default_dataset_path
import engine.data.corpus as data
from fifo_support import fifo_refusal

REPO_ROOT = Path(__file__).resolve().parents[1]


# ---- training order and vocabulary -------------------------------------------

def test_training_order_is_microgpts(names_path, names_corpus, microgpt_docs):
    expected = microgpt_docs(names_path)
    assert len(names_corpus.docs) == len(expected) == 32033
    assert names_corpus.docs == expected


def test_vocabulary_and_bos_on_names(names_corpus):
    assert names_corpus.chars == list("abcdefghijklmnopqrstuvwxyz")
    assert names_corpus.bos == 26
    assert names_corpus.vocab_size == 27
    assert len(names_corpus) == 32033


def test_vocabulary_is_sorted_unique_characters():
    corpus = Corpus.from_lines(["zoë", "bob", "Éva", "a-b"])
    assert corpus.chars == sorted(set("zoëbobÉvaa-b"))
    assert corpus.bos == len(corpus.chars) and corpus.vocab_size == corpus.bos + 1


def test_encode_decode_round_trip(names_corpus):
    for doc in names_corpus.docs[:200]:
        ids = names_corpus.encode(doc)
        assert ids == [names_corpus.chars.index(ch) for ch in doc]
        assert names_corpus.decode(ids) == doc
    # decode drops bos tokens wherever they appear
    bos = names_corpus.bos
    assert names_corpus.decode([bos, *names_corpus.encode("anna"), bos]) == "anna"


def test_encode_unknown_character_is_a_value_error(small_corpus):
    with pytest.raises(ValueError, match="'Q'"):
        small_corpus.encode("emQa")


def test_from_lines_strips_and_skips_empty_lines():
    corpus = Corpus.from_lines(["  anna \n", "\n", "bob\r\n", "   ", "\t", "cy"])
    assert sorted(corpus.docs) == ["anna", "bob", "cy"]


def test_from_file_handles_crlf_whitespace_and_empty_lines(tmp_path):
    path = tmp_path / "crlf.txt"
    path.write_bytes(b"anna\r\n\r\n  bob  \r\n\n\ncy\t\r\n\r\n")
    corpus = Corpus.from_file(path)
    assert sorted(corpus.docs) == ["anna", "bob", "cy"]
    assert "\r" not in corpus.chars and " " not in corpus.chars
    assert corpus.docs == Corpus.from_lines(["anna", "bob", "cy"]).docs  # same shuffle


def test_from_file_reads_utf8(tmp_path):
    path = tmp_path / "utf8.txt"
    path.write_text("zoë\nchloé\nbjörn\n", encoding="utf-8")
    corpus = Corpus.from_file(path)
    assert sorted(corpus.docs) == ["björn", "chloé", "zoë"]
    assert "ë" in corpus.chars and "ö" in corpus.chars


@pytest.mark.parametrize("lines", [[], [""], ["", "   ", "\r", "\t"]])
def test_empty_corpus_is_a_dataset_error(lines):
    with pytest.raises(ValueError, match="no documents"):
        Corpus.from_lines(lines)


def test_empty_file_names_the_file(tmp_path):
    path = tmp_path / "blank.txt"
    path.write_text("\n  \n\r\n")
    with pytest.raises(DatasetError) as info:
        Corpus.from_file(path)
    assert "blank.txt" in str(info.value) and "no documents" in str(info.value)


def test_non_utf8_file_names_the_line(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"anna\nbob\nchlo\xe9\ndave\n")
    with pytest.raises(DatasetError) as info:
        Corpus.from_file(path)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "line 3" in message and "UTF-8" in message and "latin1.txt" in message


def test_missing_file_and_directory_are_dataset_errors(tmp_path):
    with pytest.raises(DatasetError, match="not found"):
        Corpus.from_file(tmp_path / "nope.txt")
    with pytest.raises(DatasetError, match="directory"):
        Corpus.from_file(tmp_path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_fifo_is_refused_without_blocking(tmp_path):
    """A FIFO with no writer: opening it to read would wait forever."""
    error = fifo_refusal(tmp_path / "names.fifo", Corpus.from_file, DatasetError)
    assert "named pipe" in str(error) and "names.fifo" in str(error)


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_devices_are_refused_not_read():
    with pytest.raises(DatasetError, match="/dev/null is a character device"):
        Corpus.from_file("/dev/null")
    # endless: through the bounded reader, so that if the device check ever goes,
    # this reads 64 MiB and fails, instead of filling the machine's memory
    with pytest.raises(DatasetError, match="character device"):
        data.read_dataset_bytes("/dev/zero")


def test_files_over_the_size_limit_are_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "MAX_DATASET_BYTES", 1000)
    path = tmp_path / "big.txt"
    path.write_bytes(b"anna\n" * 200)  # exactly 1000 bytes: accepted
    assert len(Corpus.from_file(path)) == 200
    path.write_bytes(b"anna\n" * 201)
    with pytest.raises(DatasetError) as info:
        Corpus.from_file(path)
    assert "big.txt" in str(info.value) and "1000 bytes" in str(info.value)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_file_that_reports_no_size_is_read_with_a_bound(monkeypatch):
    """/proc files report size 0 and still have content: the read stops at the limit."""
    with pytest.raises(DatasetError, match="larger than"):
        data.read_dataset_bytes("/proc/self/status", limit=100)
    assert len(data.read_dataset_bytes("/proc/self/status", limit=1 << 20)) > 100


class ChangedMidRead:
    """A dataset file that another program changes while it is being read: the
    first `head` bytes are read, then `change(path)` runs on the real file, then
    the read goes on to its end (the file object is the real one, so the reader's
    fstat sees the real sizes and times)."""

    def __init__(self, path: Path, head: int, change):
        self.path, self.head, self.change = path, head, change
        self.file = open(path, "rb", buffering=0)  # no read-ahead past head

    def read(self, n: int = -1) -> bytes:
        first = self.file.read(self.head)
        self.change(self.path)
        return first + self.file.read(-1 if n < 0 else n - len(first))

    def fileno(self) -> int:
        return self.file.fileno()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def half_a_dataset(tmp_path) -> tuple[Path, int]:
    path = tmp_path / "names.txt"
    path.write_bytes(b"anna\nbob\n" * 6000)  # 54,000 bytes, 12,000 names
    return path, path.stat().st_size // 2


def read_while(monkeypatch, path, head, change) -> str:
    """The DatasetError's message when `change` happens `head` bytes into the read."""
    monkeypatch.setattr(data, "open_regular_file",
                        lambda p: (ChangedMidRead(Path(p), head, change), os.stat(p).st_size))
    with pytest.raises(DatasetError) as info:
        Corpus.from_file(path)
    return str(info.value)


@pytest.mark.parametrize("to", [0, 27_000, 40_000])
def test_a_dataset_truncated_while_it_is_read_is_refused(tmp_path, monkeypatch, to):
    """A 57 MiB file truncated to 0 or to half while it was read loaded the part read
    (2,727 and 3,001 documents of 6,000), silently (issue 27)."""
    path, half = half_a_dataset(tmp_path)
    message = read_while(monkeypatch, path, half, lambda p: os.truncate(p, to))
    assert message == (f"{path} changed while it was being read: it had 54,000 bytes when opened, "
                       f"{max(half, to):,} were read, and it has {to:,} now. Another program is writing "
                       "it; open it again once that has finished")


def test_a_dataset_that_grows_while_it_is_read_is_refused(tmp_path, monkeypatch):
    path, half = half_a_dataset(tmp_path)

    def append(p):
        with open(p, "ab") as f:
            f.write(b"carla\n" * 10)

    message = read_while(monkeypatch, path, half, append)
    assert "changed while it was being read: it had 54,000 bytes when opened, 54,060 were read" in message


def test_a_dataset_rewritten_in_place_while_it_is_read_is_refused(tmp_path, monkeypatch):
    """Same size, other bytes: the modification time tells (set here a second on, so
    that the test does not depend on the file system's clock resolution)."""
    path, half = half_a_dataset(tmp_path)

    def rewrite(p):
        stat = os.stat(p)
        with open(p, "r+b") as f:
            f.write(b"emma\nava\n" * 6000)
        os.utime(p, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))

    message = read_while(monkeypatch, path, half, rewrite)
    assert "changed while it was being read: it had 54,000 bytes when opened, 54,000 were read, and it " \
           "has 54,000 now" in message


def test_a_dataset_left_alone_while_it_is_read_loads(tmp_path, monkeypatch):
    """The hook itself changes nothing when the change does nothing."""
    path, half = half_a_dataset(tmp_path)
    monkeypatch.setattr(data, "open_regular_file",
                        lambda p: (ChangedMidRead(Path(p), half, lambda _: None), os.stat(p).st_size))
    assert len(Corpus.from_file(path)) == 12_000


def test_a_utf8_byte_order_mark_is_not_a_character(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffzoë\nanna\n".encode("utf-8"))
    corpus = Corpus.from_file(path)
    assert "\ufeff" not in corpus.chars
    assert sorted(corpus.docs) == ["anna", "zoë"]
    assert corpus.vocab_size == len(set("zoëanna")) + 1


def test_the_vocabulary_is_capped_with_the_reason():
    cap = data.MAX_VOCAB_CHARS
    chars = [chr(0x4E00 + i) for i in range(cap + 1)]
    with pytest.raises(DatasetError) as info:
        Corpus.from_lines(["".join(chars[i : i + 50]) for i in range(0, cap + 1, 50)])
    message = str(info.value)
    assert f"{cap + 1:,} different characters" in message and f"at most {cap:,}" in message
    assert len(Corpus.from_lines(["".join(chars[:cap])]).chars) == cap


# ---- token arrays and steps ----------------------------------------------------

def test_token_arrays_layout(names_corpus):
    a = names_corpus.arrays
    bos = names_corpus.bos
    assert a.tokens.dtype == np.int32 and len(a.offsets) == len(a.lengths) == len(names_corpus)
    assert a.offsets[0] == 0
    assert np.array_equal(a.offsets[1:], np.cumsum(a.lengths)[:-1])
    assert len(a.tokens) == sum(len(d) + 2 for d in names_corpus.docs)
    assert a.max_length == max(len(d) for d in names_corpus.docs) + 2
    for d in (0, 1, 2, 1000, len(names_corpus) - 1):
        doc = names_corpus.docs[d]
        run = a.tokens[a.offsets[d] : a.offsets[d] + a.lengths[d]].tolist()
        assert run == [bos] + [names_corpus.chars.index(ch) for ch in doc] + [bos]


def reference_tokens(docs, chars) -> list[int]:
    """The token runs built one document and one character at a time."""
    index = {ch: i for i, ch in enumerate(chars)}
    bos = len(chars)
    return [t for doc in docs for t in [bos, *(index[ch] for ch in doc), bos]]


@pytest.mark.parametrize("chunk_chars", [1, 7, 1 << 22])
def test_token_arrays_match_the_document_by_document_runs(chunk_chars, monkeypatch):
    """Whole-array passes, in chunks of documents of any size: the same tokens as
    encoding each document in turn (non-ASCII, astral and a surrogate character too)."""
    from engine.data import corpus as corpus_module

    monkeypatch.setattr(corpus_module, "ARRAY_CHUNK_CHARS", chunk_chars)
    rng = random.Random(3)
    alphabet = list("abcxyzé") + ["\u00e9", "\U0001f600", "\udc80", "\u4e2d"]
    docs = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(300)]
    corpus = Corpus(docs, shuffled=True)
    a = corpus.arrays
    assert a.tokens.tolist() == reference_tokens(docs, corpus.chars)
    assert a.lengths.tolist() == [len(d) + 2 for d in docs]
    assert a.offsets.tolist() == [sum(len(d) + 2 for d in docs[:i]) for i in range(len(docs))]
    unsorted = list(reversed(corpus.chars))  # a checkpoint's vocabulary, in any order
    assert Corpus(docs, unsorted, shuffled=True).arrays.tokens.tolist() == reference_tokens(docs, unsorted)


def test_token_arrays_name_a_character_outside_the_vocabulary():
    with pytest.raises(ValueError, match="'d' is not in the vocabulary"):
        Corpus(["abc", "abd"], ["a", "b", "c"], shuffled=True).arrays  # noqa: B018


def test_long_documents_are_counted():
    """(What they train on: test_learning.py's test_long_documents_train_on_their_first_block_size_tokens.)"""
    docs = ["ab", "abcdefg", "abcdefgh", "abcdefghijkl"]  # 2, 7, 8, 12 characters
    corpus = Corpus(docs, shuffled=True)  # keep this order
    block = 8
    # a document fits when len(doc) <= block_size - 1 (its final bos target is then seen)
    assert corpus.count_truncated(block) == sum(len(d) > block - 1 for d in docs) == 2
    assert corpus.count_truncated(64) == 0


def test_names_truncation_count(names_corpus):
    lengths = [len(d) for d in names_corpus.docs]
    assert names_corpus.count_truncated(16) == sum(n > 15 for n in lengths) == 0
    assert names_corpus.count_truncated(8) == sum(n > 7 for n in lengths) > 0


def test_from_training_order_keeps_order_and_rejects_unknown_characters():
    corpus = Corpus.from_training_order(["cab", "abc"], ["a", "b", "c"])
    assert corpus.docs == ["cab", "abc"]
    with pytest.raises(DatasetError, match="outside the vocabulary"):
        Corpus.from_training_order(["cab", "abd"], ["a", "b", "c"])


# ---- the packaged default dataset -----------------------------------------------

MAKEMORE_NAMES_SHA256 = "0a30b5557f192f32ab962680889aac5f6fda0f4cecf40a6d0b5694f58ea8cc4d"


def test_the_packaged_names_txt_is_makemores_with_its_licence():
    path = data.DEFAULT_DATASET_PATH
    assert hashlib.sha256(path.read_bytes()).hexdigest() == MAKEMORE_NAMES_SHA256
    assert default_dataset_path() == path
    licence = (path.parent / "LICENSE-makemore.txt").read_text()
    assert "MIT License" in licence and "Copyright (c) 2022 Andrej Karpathy" in licence
    assert "github.com/karpathy/makemore" in licence and MAKEMORE_NAMES_SHA256 in licence


def test_the_wheel_and_sdist_ship_the_dataset_and_its_licence():
    import tomllib

    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "engine*" in config["packages"]["find"]["include"]
    patterns = config["package-data"]["engine.data.datasets"]
    for name in ("names.txt", "LICENSE-makemore.txt"):
        assert any(fnmatch.fnmatch(name, p) for p in patterns), name
        assert (data.DEFAULT_DATASET_PATH.parent / name).is_file()
    assert (data.DEFAULT_DATASET_PATH.parent / "__init__.py").is_file()  # a package find_packages sees


@pytest.mark.parametrize("change", ["edited", "missing"])
def test_a_damaged_packaged_dataset_is_refused(tmp_path, change):
    copy = tmp_path / "names.txt"
    if change == "edited":
        raw = bytearray(data.DEFAULT_DATASET_PATH.read_bytes())
        raw[0] ^= 1
        copy.write_bytes(bytes(raw))
    with pytest.raises(DatasetError, match="reinstall microgpt-gui, or choose a text file") as info:
        default_dataset_path(copy)
    assert str(copy) in str(info.value)


def test_the_default_corpus_needs_no_network(no_network):
    corpus = data.load_corpus(None)
    assert len(corpus) == 32033 and corpus.vocab_size == 27


# ---- files that are not text --------------------------------------------------------

@pytest.mark.parametrize("content, line, code", [
    (b"\0" * 4096, 1, "U+0000"),
    (b"anna\nbob\n\0\0\0\n", 3, "U+0000"),
    (b"anna\nbo\x1b[31mb\n", 2, "U+001B"),
    (b"\x7fELF\x02\x01\x01\0\0\0", 1, "U+007F"),
])
def test_a_binary_file_is_refused_naming_the_line(tmp_path, content, line, code):
    path = tmp_path / "data.bin"
    path.write_bytes(content)
    with pytest.raises(DatasetError) as info:
        Corpus.from_file(path)
    message = str(info.value)
    assert f"{path} is not a text file: line {line} holds the control character {code}" in message
    assert "\n" not in message


def test_tabs_and_windows_line_ends_are_text(tmp_path):
    path = tmp_path / "names.txt"
    path.write_bytes(b"anna\r\n\tbob\r\n")
    assert sorted(Corpus.from_file(path).docs) == ["anna", "bob"]


def test_empty_documents_are_refused_in_training_order():
    with pytest.raises(DatasetError, match="it holds no documents"):
        Corpus.from_training_order([""], ["a"])
    with pytest.raises(DatasetError, match="document 2 of 3 is empty"):
        Corpus.from_training_order(["a", "", "a"], ["a"])
