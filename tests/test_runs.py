"""engine.training.records: a run's losses and step times, grown chunk by chunk."""
import numpy as np
import pytest

import engine
from engine.training.records import RunRecord, preset_name


def make(model=None):
    return RunRecord("run 1", "numpy", model or engine.PRESETS["s32"].model, engine.TrainConfig())


def test_chunks_grow_the_record_and_share_their_time_among_their_steps():
    rng = np.random.default_rng(0)
    losses = rng.random(3000).astype(np.float32)
    record, first, seconds = make(), 0, []
    for size in rng.integers(1, 200, 100):
        chunk = losses[first:first + size]
        if not len(chunk):
            break
        record.extend(chunk, first, 0.01 * len(chunk) + 0.5)
        seconds += [(0.01 * len(chunk) + 0.5) / len(chunk)] * len(chunk)
        first += len(chunk)
    np.testing.assert_array_equal(record.losses, losses[:first])
    np.testing.assert_allclose(record.step_seconds, seconds)
    np.testing.assert_allclose(record.wall_seconds(), np.cumsum(seconds))
    assert record.ms_per_step == pytest.approx(1e3 * np.mean(seconds))
    assert record.preset == "s32"


def test_loaded_steps_have_no_time_and_a_rewind_truncates():
    record = make(engine.ModelConfig(n_embd=24, n_layer=1, n_head=2, block_size=8))
    assert record.preset == "custom" and np.isnan(record.ms_per_step)
    record.extend(np.full(10, 3.0), 0)  # from a checkpoint: no timings
    record.extend(np.full(4, 2.0), 10, 0.4)
    np.testing.assert_array_equal(np.isnan(record.wall_seconds()), [True] * 10 + [False] * 4)
    np.testing.assert_allclose(record.wall_seconds()[10:], [0.1, 0.2, 0.3, 0.4])
    assert record.ms_per_step == pytest.approx(100.0)
    record.extend([1.0, 1.5], 5, 1.0)  # a rewound run continues from step 5
    assert record.steps == 7
    np.testing.assert_array_equal(record.losses, [3.0] * 5 + [1.0, 1.5])
    with pytest.raises(ValueError, match="cannot follow"):
        record.extend([1.0], 9)


def test_preset_name_matches_the_network_only():
    for name, preset in engine.PRESETS.items():
        assert preset_name(preset.model) == name


def test_the_loss_csv_has_the_readmes_header_and_leaves_nothing_half_written(tmp_path):
    from engine.training.records import write_loss_csv

    losses = np.random.default_rng(3).random(25)
    smoothed = np.cumsum(losses) / np.arange(1, 26)
    path = tmp_path / "loss.csv"
    assert write_loss_csv(path, np.arange(1, 26), losses, smoothed) == str(path)
    lines = path.read_text().splitlines()
    assert lines[0] == "step,loss,smoothed,heldout" and lines[1].startswith("1,") and len(lines) == 26
    table = np.loadtxt(path, delimiter=",", skiprows=1, usecols=(0, 1, 2))
    np.testing.assert_allclose(table, np.column_stack([np.arange(1, 26), losses, smoothed]), atol=1e-6)
    assert all(line.endswith(",") for line in lines[1:])  # no held-out points: the column is empty
    (tmp_path / "taken").mkdir()
    with pytest.raises(OSError):
        write_loss_csv(tmp_path / "taken", np.arange(1, 3), losses[:2], smoothed[:2])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loss.csv", "taken"]


def test_the_loss_csv_has_the_heldout_loss_on_the_rows_of_its_steps(tmp_path):
    import csv

    from engine.training.heldout import HeldoutPoint
    from engine.training.records import write_loss_csv

    steps = np.arange(1, 41)
    points = [HeldoutPoint(10, 2.5), HeldoutPoint(25, 2.25), HeldoutPoint(40, 2.125), HeldoutPoint(99, 1.0)]
    path = write_loss_csv(tmp_path / "loss.csv", steps, np.ones(40), np.ones(40), points)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    heldout = {int(r["step"]): float(r["heldout"]) for r in rows if r["heldout"]}
    assert heldout == {10: 2.5, 25: 2.25, 40: 2.125}  # a point past the curve's end has no row
    assert len(rows) == 40


def test_a_records_heldout_points_give_best_final_and_names_per_second():
    from engine.training.heldout import HeldoutPoint

    record = RunRecord("run 1", "numpy", engine.PRESETS["learn"].model, engine.PRESETS["learn"].train)
    assert np.isnan(record.best_heldout) and np.isnan(record.final_heldout)
    record.extend(np.ones(100), 0, 0.5)  # 5 ms a step, 32 names each
    record.add_heldout([HeldoutPoint(40, 2.4), HeldoutPoint(80, 2.2)])
    record.add_heldout([HeldoutPoint(100, 2.3)])
    assert (record.best_heldout, record.final_heldout) == (2.2, 2.3)
    assert record.names_per_second == pytest.approx(32 / 0.005)
    record.add_heldout([HeldoutPoint(60, 2.0)])  # rewound to step 60: what followed goes
    assert [p.step for p in record.heldout] == [40, 60]
    record.add_heldout([HeldoutPoint(5, 3.0)], replacing=True)
    assert [p.step for p in record.heldout] == [5]


def test_an_ended_run_is_compacted_to_block_means():
    rng = np.random.default_rng(1)
    losses = rng.random(10_001).astype(np.float32)
    record = make()
    record.extend(losses[:5000], 0)  # from a checkpoint: untimed
    record.extend(losses[5000:], 5000, 5.001)
    ms = record.ms_per_step
    record.compact(max_points=1000)
    block = record.block
    assert block == 11 and len(record.losses) == 910 and record.steps == 10_001
    np.testing.assert_allclose(record.losses[:-1], losses[:-(10_001 % block)].reshape(-1, block).mean(axis=1),
                               rtol=1e-6)
    assert record.losses[-1] == pytest.approx(losses[-(10_001 % block):].mean())
    np.testing.assert_array_equal(record.x[:3], [0, block, 2 * block])
    assert record.ms_per_step == ms == pytest.approx(1.0)
    assert np.isnan(record.wall_seconds()[0]) and record.wall_seconds()[-1] == pytest.approx(5.001)
    with pytest.raises(ValueError, match="compacted"):
        record.extend([1.0], record.steps)


def test_a_short_ended_run_keeps_every_step_and_no_spare_room():
    losses = np.linspace(3.0, 2.0, 3000, dtype=np.float32)
    record = make()
    for first in range(0, 3000, 100):
        record.extend(losses[first:first + 100], first, 0.1)
    record.compact(max_points=8192)
    assert record.block == 1 and record.steps == 3000
    np.testing.assert_array_equal(record.losses, losses)
    assert record._losses.nbytes == losses.nbytes and len(record._step_seconds) == 3000  # grown buffers trimmed
    assert record.ms_per_step == pytest.approx(1.0)
