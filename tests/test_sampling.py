"""engine.model.sampling: the key/value-cache sampler gives the names the full-recompute
sampler gives (same seed, temperature and prefix), however its rows are batched,
split and replayed, in bounded memory, and stops when asked; its random numbers
are SplitMix64's (against tests/rng_reference.py and SplitMix64's published
outputs); names stop at max_length."""
from __future__ import annotations

import numpy as np
import pytest

import engine.model.sampling as sampling
from engine import Cancelled, Corpus, ModelConfig, TrainConfig, open_backend
from engine.model.gpt import KVCache, next_token_logits
from rng_reference import draw as reference_draw, splitmix64 as reference_splitmix64, uniform as reference_uniform


def reference_sample(backend, num_samples, temperature, seed, prefix="", max_length=None):
    """The sampler the engine had before the cache: every position reruns the
    model over each row's whole prefix (finished rows included), then each row
    draws with tests/rng_reference.py, one pure-Python number at a time."""
    corpus, model = backend.corpus, backend.model
    bos = corpus.bos
    start = [bos, *corpus.encode(prefix)]
    tokens = np.tile(np.array(start), (num_samples, 1))
    done = np.zeros(num_samples, dtype=bool)
    for position in range(len(prefix), max_length or model.block_size):
        logits = next_token_logits(backend.w, tokens, model, np)
        nxt = np.array([reference_draw(row, temperature, reference_uniform(seed, j, position))
                        for j, row in enumerate(logits)])
        nxt[done] = bos
        done |= nxt == bos
        tokens = np.concatenate([tokens, nxt[:, None]], axis=1)
        if done.all():
            break
    names = []
    for row in tokens[:, len(start):]:
        ends = np.flatnonzero(row == bos)
        names.append(prefix + corpus.decode(row[: ends[0] if len(ends) else len(row)]))
    return names


@pytest.fixture(scope="module")
def trained(small_corpus):
    """A small model trained enough that its names look like names."""
    b = open_backend("numpy", ModelConfig(16, 2, 4, 16), TrainConfig(num_steps=150, learning_rate=0.02),
                     small_corpus)
    b.train(150)
    return b


BLOCK = 80  # long_names' block_size


@pytest.fixture(scope="module")
def long_names(small_corpus):
    """Random parameters with bos made less likely: some names run to block_size 80,
    past the cache's first capacity (32), so it grows twice, and rows finish at many lengths."""
    b = open_backend("numpy", ModelConfig(16, 2, 2, BLOCK), TrainConfig(num_steps=1, init_std=0.3),
                     small_corpus)
    params = b.get_params()
    params["lm_head"][small_corpus.bos] *= 0.7
    b.set_params(params)
    return b


@pytest.mark.parametrize("num_samples, temperature, seed, prefix", [
    (1, 0.5, 0, ""), (30, 0.5, 1, ""), (30, 1.0, 7, "e"), (17, 1.3, 3, "isa"), (25, 0.4, 11, "a"),
])
def test_equals_the_full_recompute_sampler(trained, num_samples, temperature, seed, prefix):
    names = trained.sample(num_samples, temperature, seed, prefix=prefix, max_length=trained.model.block_size)
    assert names == reference_sample(trained, num_samples, temperature, seed, prefix)
    assert len(set(names)) > 1 or num_samples == 1  # a real draw, not one repeated name


@pytest.mark.parametrize("seed, prefix", [(0, ""), (5, "ab")])
def test_equals_the_reference_on_long_names(long_names, seed, prefix):
    names = long_names.sample(40, 1.0, seed, prefix=prefix, max_length=BLOCK)
    lengths = sorted(map(len, names))
    assert lengths[-1] == BLOCK and lengths[0] < 32  # grew and finished early
    assert names == reference_sample(long_names, 40, 1.0, seed, prefix)


def test_batches_splits_and_replays_give_the_same_names(long_names, monkeypatch):
    """Rows in batches of 3 and a cache bound that forces splits mid-name: the split-off
    rows replay their tokens before drawing more, and every name stays the same."""
    want = reference_sample(long_names, 20, 1.0, 4)
    replays, caches = [], []
    generate, resized = sampling.Sampler._generate, KVCache.resized

    def recording_generate(self, rows, replay):
        replays.append(replay)
        return generate(self, rows, replay)

    def recording_resized(self, rows, capacity, length, xp):
        new = resized(self, rows, capacity, length, xp)
        caches.append((new.rows, new.rows * capacity * KVCache.bytes_per_token(long_names.model)))
        return new

    monkeypatch.setattr(sampling, "MAX_BATCH_ROWS", 3)
    bound = 2 * 40 * KVCache.bytes_per_token(long_names.model)  # 2 rows of 40 positions
    monkeypatch.setattr(sampling, "CACHE_LIMIT", bound)
    monkeypatch.setattr(sampling.Sampler, "_generate", recording_generate)
    monkeypatch.setattr(KVCache, "resized", recording_resized)
    assert long_names.sample(20, 1.0, 4, max_length=BLOCK) == want
    assert any(r > 0 for r in replays), "no batch was split and replayed"
    assert max(size for rows, size in caches if rows > 1) <= bound


def test_a_long_prefix_runs_in_chunks_with_the_same_names(long_names, monkeypatch):
    prefix = "ab" * 20
    want = reference_sample(long_names, 6, 0.8, 2, prefix)
    monkeypatch.setattr(sampling, "CHUNK_BYTES", 4 * long_names.model.n_head * 41 * 7)  # 7 positions
    assert long_names.sample(6, 0.8, 2, prefix=prefix, max_length=BLOCK) == want


def test_splitmix64_gives_its_published_outputs():
    """SplitMix64 seeded with 0 (Vigna's splitmix64.c): its first outputs are
    splitmix64 of the states 0, gamma, 2 gamma."""
    gamma = sampling.GOLDEN_GAMMA
    states = np.array([0, gamma, (2 * gamma) % 2**64], dtype=np.uint64)
    published = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert sampling.splitmix64(states).tolist() == published
    assert [reference_splitmix64(int(x)) for x in states] == published


@pytest.mark.parametrize("seed", [0, 1, 42, 2**31 - 1, 2**63 + 5, 2**64 - 1, 2**64 + 3, 10**30])
def test_uniforms_equal_the_pure_python_reference(seed):
    samples = np.array([0, 1, 2, 7, 255, 9_999, 2**40])
    for position in (0, 1, 15, 1023):
        want = [reference_uniform(seed, int(j), position) for j in samples]
        got = sampling.uniforms(seed, samples, position)
        assert got.dtype == np.float64 and got.tolist() == want


def test_uniforms_are_uniform_and_independent_of_the_row_grouping():
    u = sampling.uniforms(3, np.arange(200_000), 5)
    assert 0 <= u.min() and u.max() < 1
    counts = np.histogram(u, bins=20, range=(0, 1))[0]
    # chi-square with 19 degrees of freedom: 43.8 is its 0.999 quantile
    expected = len(u) / 20
    assert ((counts - expected) ** 2 / expected).sum() < 43.8
    rows = np.array([4, 17, 180_000])
    assert sampling.uniforms(3, rows, 5).tolist() == u[rows].tolist()
    # neighbouring seeds, samples and positions are unrelated
    assert abs(np.corrcoef(u[:-1], u[1:])[0, 1]) < 0.01
    assert abs(np.corrcoef(u, sampling.uniforms(4, np.arange(200_000), 5))[0, 1]) < 0.01
    assert abs(np.corrcoef(u, sampling.uniforms(3, np.arange(200_000), 6))[0, 1]) < 0.01


def test_draw_equals_the_reference_draw():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(500, 27)).astype(np.float32)
    u = rng.random(500)
    got = sampling.draw(logits.astype(np.float64) / 0.7, u)
    assert got.tolist() == [reference_draw(row, 0.7, x) for row, x in zip(logits, u)]


def test_cancel_is_polled_between_positions_of_every_batch(long_names, monkeypatch):
    monkeypatch.setattr(sampling, "MAX_BATCH_ROWS", 4)
    before = long_names.get_state().params.copy()
    for stop_at in (1, 2, 40, 100):
        calls = []

        def cancel():
            calls.append(1)
            return len(calls) >= stop_at

        with pytest.raises(Cancelled):
            long_names.sample(12, 1.0, 0, cancel=cancel, max_length=BLOCK)
        assert len(calls) == stop_at
    assert np.array_equal(long_names.get_state().params, before)
    # never cancelled: polled at least once per position of the longest name
    polls = []
    long_names.sample(12, 1.0, 0, cancel=lambda: polls.append(1) and False, max_length=BLOCK)
    assert len(polls) >= BLOCK


def test_sample_count_is_capped_with_the_reason(trained):
    with pytest.raises(ValueError) as info:
        trained.sample(sampling.MAX_SAMPLES + 1)
    message = str(info.value)
    assert f"{sampling.MAX_SAMPLES:,}" in message and f"{sampling.MAX_SAMPLES + 1:,}" in message
    assert len(trained.sample(sampling.MAX_SAMPLES, 1.0, 0)) == sampling.MAX_SAMPLES


def test_a_million_names_are_refused_before_any_work(trained, monkeypatch):
    monkeypatch.setattr(sampling, "Sampler", None)  # nothing may start
    with pytest.raises(ValueError, match="at most"):
        trained.sample(10**6)


def test_memory_bytes_bounds_the_caches_and_logits():
    # the largest block engine.config allows, with a name's keys and values (1 GiB)
    # over sampling's CACHE_LIMIT
    tiny, big_block = ModelConfig(16, 1, 4, 16), ModelConfig(4096, 8, 4, 4096)
    rows = sampling.batch_rows(27)
    assert rows == sampling.MAX_BATCH_ROWS
    small = sampling.memory_bytes(tiny, 27)
    assert small < 2 * sampling.CHUNK_BYTES  # small models hold little
    # one name of 4,096 positions cannot be split: its whole cache is counted
    one_name = KVCache.bytes_per_token(big_block) * 4096
    assert one_name > sampling.CACHE_LIMIT
    assert sampling.memory_bytes(big_block, 27) >= 2 * one_name
    # a large vocabulary draws fewer rows at once
    assert sampling.batch_rows(10_001) * 10_001 * sampling.DRAW_BYTES_PER_LOGIT <= sampling.DRAW_BYTES


def test_names_do_not_depend_on_the_batch_size(trained, monkeypatch):
    want = trained.sample(50, 0.9, 8)
    monkeypatch.setattr(sampling, "MAX_BATCH_ROWS", 7)
    assert trained.sample(50, 0.9, 8) == want


def test_cached_steps_equal_the_full_forward(long_names):
    """forward() one position at a time over a KVCache gives the hidden states of
    one forward over the whole sequence (the same function, two ways of calling it)."""
    from engine.model.gpt import forward

    b = long_names
    xp = np
    tokens = np.array([[b.corpus.bos, 3, 1, 4, 1, 5, 9, 2, 6], [b.corpus.bos, 2, 7, 1, 8, 2, 8, 1, 8]])
    full, acts = forward(b.w, tokens, b.model, xp, keep=True)
    cache = KVCache.empty(b.model, 2, 16, xp, np.float32)
    steps = [forward(b.w, tokens[:, :3], b.model, xp, kv=cache, start=0)[0]]
    steps += [forward(b.w, tokens[:, t : t + 1], b.model, xp, kv=cache, start=t)[0] for t in range(3, 9)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-5, atol=1e-5)
    p = acts[1][5]  # layer 0's attention probabilities (rows, heads, T, T): causal, rows sum to 1
    np.testing.assert_allclose(p.sum(axis=-1), 1.0, rtol=1e-6)
    assert np.all(np.triu(p[0, 0], 1) == 0)


def test_training_on_a_large_vocabulary_needs_no_vocab_by_vocab_table():
    """The wte gradient and the target log-probabilities index rows; no V x V one-hot
    table (5,001 x 5,001 float32 would be 100 MB)."""
    import tracemalloc

    chars = [chr(0x4E00 + i) for i in range(5000)]
    corpus = Corpus(["".join(chars[i : i + 8]) for i in range(0, 5000, 8)], shuffled=True)
    b = open_backend("numpy", ModelConfig(8, 1, 2, 16), TrainConfig(num_steps=4), corpus)
    tracemalloc.start()
    try:
        b.train(2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 20 * 2**20, f"a step allocated {peak / 2**20:.0f} MiB"


# max_length ---------------------------------------------------------------------

def test_names_stop_at_the_longest_document_plus_the_margin_by_default(long_names, small_corpus):
    longest = max(map(len, small_corpus.docs))  # "elizabeth"
    assert sampling.longest_document(small_corpus) == longest == 9
    default = longest + sampling.MAX_LENGTH_MARGIN
    assert long_names.default_max_length() == default < BLOCK
    names = long_names.sample(40, 1.0, 0)
    assert max(map(len, names)) == default  # an untrained model runs names to the cap
    assert names == reference_sample(long_names, 40, 1.0, 0, max_length=default)
    # a prefix longer than every document still leaves MAX_LENGTH_MARGIN characters to draw
    prefix = "ab" * 6
    assert long_names.default_max_length(len(prefix)) == len(prefix) + sampling.MAX_LENGTH_MARGIN
    assert max(map(len, long_names.sample(20, 1.0, 0, prefix=prefix))) == len(prefix) + sampling.MAX_LENGTH_MARGIN


def test_default_max_length_is_capped_at_block_size():
    assert sampling.default_max_length(15, 16) == 16  # tiny on names.txt: microgpt's block_size
    assert sampling.default_max_length(15, 1024) == 20
    assert sampling.default_max_length(3, 1024, prefix_length=30) == 35
    assert sampling.default_max_length(3000, 64) == 64


@pytest.mark.parametrize("max_length", [1, 2, 7, 33, BLOCK])
def test_a_shorter_max_length_cuts_the_same_names(long_names, max_length):
    """A name's draws depend only on (seed, sample, position) and its own earlier
    characters, so max_length m gives the block_size names cut to m characters."""
    full = long_names.sample(30, 1.0, 6, max_length=BLOCK)
    assert long_names.sample(30, 1.0, 6, max_length=max_length) == [n[:max_length] for n in full]


def test_max_length_with_a_prefix_equals_the_reference(long_names):
    names = long_names.sample(15, 0.9, 3, prefix="ab", max_length=6)
    assert max(map(len, names)) == 6 and all(n.startswith("ab") for n in names)
    assert names == reference_sample(long_names, 15, 0.9, 3, "ab", max_length=6)


@pytest.mark.parametrize("max_length, prefix, message", [
    (BLOCK + 1, "", f"max_length must be at most block_size ({BLOCK}), got {BLOCK + 1}"),
    (0, "", "max_length must be at least 1, got 0"),
    (-3, "", "max_length must be at least 1, got -3"),
    (2, "ab", "max_length must be longer than the prefix (2 characters), got 2"),
    (2.0, "", "max_length must be a whole number, got 2.0"),
    (True, "", "max_length must be a whole number, got True"),
])
def test_bad_max_lengths_are_refused(long_names, max_length, prefix, message):
    with pytest.raises(ValueError) as info:
        long_names.sample(3, 1.0, 0, prefix=prefix, max_length=max_length)
    assert str(info.value) == message
