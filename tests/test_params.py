"""engine.params: layout, the one initializer, flatten/unflatten."""
from __future__ import annotations

import numpy as np
import pytest

from engine import ModelConfig, init_params, num_params, param_specs
from engine.params import flatten, unflatten


def expected_layout(c, n_layer, block, vocab):
    names = [("wte", (vocab, c)), ("wpe", (block, c)), ("lm_head", (vocab, c))]
    for i in range(n_layer):
        names += [(f"layer{i}.attn_wq", (c, c)), (f"layer{i}.attn_wk", (c, c)),
                  (f"layer{i}.attn_wv", (c, c)), (f"layer{i}.attn_wo", (c, c)),
                  (f"layer{i}.mlp_fc1", (4 * c, c)), (f"layer{i}.mlp_fc2", (c, 4 * c))]
    return names


@pytest.mark.parametrize("c, n_layer, n_head, block, vocab", [(16, 1, 4, 16, 27), (8, 3, 2, 5, 11)])
def test_layout_order_shapes_and_offsets(c, n_layer, n_head, block, vocab):
    model = ModelConfig(c, n_layer, n_head, block)
    specs = param_specs(model, vocab)
    expected = expected_layout(c, n_layer, block, vocab)
    assert [(s.name, s.shape) for s in specs] == expected
    offset = 0
    for s in specs:  # contiguous, in order, no gaps
        assert s.offset == offset and s.size == s.shape[0] * s.shape[1] and s.end == offset + s.size
        offset = s.end
    assert num_params(model, vocab) == offset == model.num_params(vocab)


def test_qkv_are_adjacent_in_every_layer():
    model = ModelConfig(8, 3, 2, 8)
    by_name = {s.name: s for s in param_specs(model, 10)}
    for i in range(3):
        q, k, v = (by_name[f"layer{i}.attn_w{x}"] for x in "qkv")
        assert k.offset == q.end and v.offset == k.end


def test_init_is_deterministic_per_seed_and_differs_across_seeds():
    model = ModelConfig(16, 2, 4, 16)
    a = init_params(model, 27, seed=7, std=0.08)
    b = init_params(model, 27, seed=7, std=0.08)
    c = init_params(model, 27, seed=8, std=0.08)
    assert a.dtype == np.float32 and a.shape == (num_params(model, 27),)
    assert np.array_equal(a, b)
    assert not np.any(a == c)  # independent draws: no entry should coincide
    # std scales the same draw
    d = init_params(model, 27, seed=7, std=0.02)
    np.testing.assert_allclose(d, a * 0.25, rtol=1e-6)


def test_init_std_and_mean_per_tensor():
    model = ModelConfig(64, 2, 4, 64)
    std = 0.05
    flat = init_params(model, 27, seed=3, std=std)
    assert np.all(np.isfinite(flat))
    for s in param_specs(model, 27):
        x = flat[s.offset : s.end].astype(np.float64)
        # sampling error of a std estimate is about std/sqrt(2n): allow 6 of those
        tol = 6 / np.sqrt(2 * s.size)
        assert abs(x.std() / std - 1) < tol, s.name
        assert abs(x.mean()) < 6 * std / np.sqrt(s.size), s.name
    # tensors are not copies of each other
    specs = param_specs(model, 27)
    q, k = specs[3], specs[4]
    assert not np.allclose(flat[q.offset : q.end], flat[k.offset : k.end])


def test_unflatten_gives_views_with_the_layout_shapes():
    model = ModelConfig(8, 2, 2, 8)
    specs = param_specs(model, 10)
    flat = np.arange(num_params(model, 10), dtype=np.float32)
    params = unflatten(flat, specs)
    assert list(params) == [s.name for s in specs]
    for s in specs:
        assert params[s.name].shape == s.shape
        assert params[s.name][0, 0] == s.offset  # row-major from the spec's offset
        assert params[s.name][-1, -1] == s.end - 1
    params["wpe"][1, 2] = -1.0  # a view: writes reach the flat buffer
    wpe = specs[1]
    assert flat[wpe.offset + 1 * 8 + 2] == -1.0


def test_flatten_unflatten_round_trip():
    model = ModelConfig(8, 2, 2, 8)
    specs = param_specs(model, 10)
    flat = init_params(model, 10, seed=1, std=0.1)
    copies = {k: np.array(v, dtype=np.float64) for k, v in unflatten(flat, specs).items()}
    back = flatten(copies, specs)
    assert back.dtype == np.float32 and np.array_equal(back, flat)
    assert back is not flat


def test_flatten_rejects_missing_extra_and_misshapen():
    model = ModelConfig(8, 2, 2, 8)
    specs = param_specs(model, 10)
    params = {k: v.copy() for k, v in unflatten(init_params(model, 10, 0, 0.1), specs).items()}

    missing = dict(params)
    del missing["layer1.mlp_fc2"]
    with pytest.raises(ValueError, match=r"missing.*layer1\.mlp_fc2"):
        flatten(missing, specs)

    extra = dict(params, **{"layer2.attn_wq": params["layer0.attn_wq"]})
    with pytest.raises(ValueError, match=r"unexpected.*layer2\.attn_wq"):
        flatten(extra, specs)

    wrong = dict(params, wte=params["wte"].T)
    with pytest.raises(ValueError) as info:
        flatten(wrong, specs)
    assert "wte" in str(info.value) and "(8, 10)" in str(info.value) and "(10, 8)" in str(info.value)
