"""Sweep files (engine.sweep.spec) and the sweep's events and trial table
(engine.sweep.events): no Ray needed."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from engine.config import get_preset
from engine.sweep import events as ev
from engine.sweep.spec import (EXAMPLES, Search, SweepSpecError, TimeAttr, examples, find_spec_file, parse_spec,
                               read_spec, run_configs, space_size)

NAMES = ("numpy", "futhark-c")

MINIMAL = """
[run]
preset = "tiny"
steps = 1000
[space]
learning_rate = { loguniform = [0.001, 0.1] }
"""


def spec_of(text: str):
    return parse_spec(text, backend_names=NAMES)


def test_the_shipped_examples_read_and_are_package_data():
    names = examples()
    assert "quick" in names and len(names) >= 2
    for name in names:
        assert read_spec(EXAMPLES / f"{name}.toml").name == name
    assert find_spec_file("quick") == EXAMPLES / "quick.toml"
    assert find_spec_file("quick.toml") == EXAMPLES / "quick.toml"
    quick = read_spec(EXAMPLES / "quick.toml")
    assert quick.trials >= 4 and quick.run["preset"] == "tiny" and quick.scheduler.kind == "asha"
    presets = read_spec(EXAMPLES / "presets.toml")  # the scaling study as a sweep
    assert space_size(presets) == 5 and presets.space["preset"].values[0] == "tiny"


def test_a_minimal_file_takes_the_defaults():
    spec = spec_of(MINIMAL)
    assert spec.search == Search.RANDOM and spec.trials == 1 and spec.cpus_per_trial == 1
    assert spec.scheduler.time_attr == TimeAttr.NAMES_SEEN and spec.metric == "heldout_loss"
    # ASHA's horizon: the run's names (1000 steps of tiny's one name), three cuts below it
    assert spec.max_t() == 1000
    assert spec.checkpoint_milestones() == (125.0, 250.0, 500.0)


def test_max_t_takes_the_largest_steps_and_batch_of_the_space():
    spec = spec_of("""
[run]
preset = "learn"
[space]
batch_size = { choice = [8, 64] }
steps = { int = [100, 300] }
[scheduler]
grace = 1000
reduction_factor = 3
""")
    assert spec.max_t() == 300 * 64
    assert spec.checkpoint_milestones() == (1000, 3000, 9000)
    # learn's own steps when the space leaves them out
    assert spec_of('[run]\npreset = "learn"').max_t() == get_preset("learn").train.num_steps * 32


def test_run_configs_put_the_fields_over_the_preset():
    backend, model, train = run_configs({"preset": "learn", "n_embd": 64, "learning_rate": 0.003, "steps": 500,
                                         "backend": "futhark-c", "seed": 7})
    learn = get_preset("learn")
    assert backend == "futhark-c"
    assert (model.n_embd, model.n_layer, model.n_head) == (64, learn.model.n_layer, learn.model.n_head)
    assert (train.learning_rate, train.num_steps, train.seed, train.batch_size) == (0.003, 500, 7, 32)
    assert run_configs({})[0] == "numpy"


def test_a_grid_counts_its_trials():
    spec = spec_of("""
[sweep]
search = "grid"
trials = 2
[space]
n_embd = { grid = [16, 32, 64] }
seed = { choice = [1, 2] }
""")
    assert space_size(spec) == 2 * 3 * 2
    assert space_size(spec_of(MINIMAL)) is None


@pytest.mark.parametrize("text, words", [
    ("[sweep\n", "not valid TOML"),
    ("[sweeps]\nname = 'x'", "unknown table [sweeps]"),
    ("[sweep]\ntrails = 3", "[sweep] has no key 'trails'"),
    ("[sweep]\nsearch = 'bayes'", "[sweep] search must be one of 'grid', 'random', 'tpe'"),
    ("[sweep]\ntrials = 0", "[sweep] trials must be from 1"),
    ("[sweep]\ntrials = 2.5", "[sweep] trials must be a whole number"),
    ("[sweep]\ntime_budget_s = -1", "[sweep] time_budget_s must be positive"),
    ("[sweep]\nname = 'a/b'", "[sweep] name must be a non-empty name without slashes"),
    ("[resources]\ncpus_per_trial = 2\ncpus = 1", "cpus (1) is less than cpus_per_trial (2)"),
    ("[run]\npreset = 'huge'", "[run] preset: unknown preset 'huge'"),
    ("[run]\nbackend = 'torch'", "[run] backend: unknown backend 'torch'; choose from numpy, futhark-c"),
    ("[run]\nn_embd = 16.0", "[run] n_embd must be a whole number"),
    ("[run]\nlearning_rate = 2.0", "[run] learning_rate must be from 1e-06 to 1, got 2"),
    ("[run]\nholdout = 0", "holdout 0: a sweep compares trials by their held-out loss"),
    ("[run]\nn_embd = 24\nn_head = 5", "the first trial would not run: n_embd (24) must be divisible by n_head (5)"),
    ("[space]\nlearning_rate = 0.01", "[space] learning_rate must be one of"),
    ("[space]\nlearning_rate = { normal = [0, 1] }", "unknown kind 'normal'"),
    ("[space]\nlearning_rate = { uniform = [0.1] }", "uniform needs [low, high]"),
    ("[space]\nlearning_rate = { uniform = [0.1, 0.01] }", "uniform needs low < high"),
    ("[space]\nn_embd = { int = [16, 16] }", "int needs low < high"),
    ("[space]\nlearning_rate = { int = [1, 2] }", "learning_rate is not a whole number"),
    ("[space]\npreset = { uniform = [1, 2] }", "preset is a name: use choice or grid"),
    ("[space]\nn_embd = { choice = [16, 16] }", "choice lists a value twice"),
    ("[space]\nn_embd = { choice = [] }", "choice needs a non-empty list"),
    ("[space]\nholdout = { choice = [100, 0] }", "holdout 0"),
    ("[run]\nseed = 1\n[space]\nseed = { choice = [1, 2] }", "seed is in both [run] and [space]"),
    ("[sweep]\nsearch = 'grid'\n[space]\nlearning_rate = { loguniform = [0.001, 0.1] }",
     "grid search needs lists"),
    ("[sweep]\nsearch = 'tpe'\n[space]\nn_embd = { grid = [16, 32] }", "TPE samples its space (use choice)"),
    ("[sweep]\nsearch = 'tpe'", "[space] is empty: TPE needs at least one field"),
    ("[scheduler]\nkind = 'hyperband'", "[scheduler] kind must be 'asha' or 'none'"),
    ("[scheduler]\nreduction_factor = 1", "reduction_factor must be more than 1"),
    ("[scheduler]\ntime_attr = 'train_seconds'", "max_t (seconds) is needed with time_attr = 'train_seconds'"),
    ("[run]\nsteps = 100\n[scheduler]\ngrace = 1000", "grace (1000 names) is past the longest trial (100 names)"),
])
def test_a_bad_file_says_what_and_where(text, words):
    with pytest.raises(SweepSpecError) as error:
        spec_of(text)
    assert words in str(error.value)


def test_train_seconds_take_the_time_budget_as_horizon():
    spec = spec_of("[sweep]\ntime_budget_s = 120\n[scheduler]\ntime_attr = 'train_seconds'\ngrace = 10")
    assert spec.max_t() == 120 and spec.checkpoint_milestones() == (10, 20, 40, 80)


def test_read_spec_names_the_file(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("[run]\npreset = 'nope'\n")
    with pytest.raises(SweepSpecError, match=r"mine\.toml: \[run\] preset: unknown preset"):
        read_spec(path)
    with pytest.raises(SweepSpecError, match=r"missing\.toml: no such file \(the shipped examples: .*quick"):
        read_spec(tmp_path / "missing.toml")
    path.write_text(MINIMAL)
    assert read_spec(path).name == "mine"  # the file's name when [sweep] gives none


# ---- events ---------------------------------------------------------------------------

def test_event_lines_are_json_with_nan_as_null():
    line = ev.to_line({"event": "trial_result", "trial": "t", "heldout_loss": math.inf, "losses": [1.5, math.nan]})
    assert line.endswith("\n") and "\n" not in line[:-1]
    assert json.loads(line) == {"event": "trial_result", "trial": "t", "heldout_loss": None, "losses": [1.5, None]}
    assert ev.parse_line(line)["trial"] == "t"
    for junk in ("", "2026-12-02 INFO something", "{not json", "[1, 2]", '{"no_event": 1}'):
        assert ev.parse_line(junk) is None


def test_block_means_match_numpy():
    rng = np.random.default_rng(0)
    for n in (1, 5, 256, 257, 1000, 4096):
        losses = rng.random(n)
        means, block = ev.block_means(list(losses), max_points=256)
        assert len(means) <= 256 and block == -(-n // 256)
        expected = [losses[i:i + block].mean() for i in range(0, n, block)]
        np.testing.assert_allclose(means, expected, rtol=1e-12)


def trial_events():
    return [
        {"event": "sweep", "name": "s", "dir": "/d"},
        {"event": "trial_started", "trial": "a", "settings": {"learning_rate": 0.01}},
        {"event": "trial_started", "trial": "b", "settings": {"learning_rate": 0.1}},
        {"event": "trial_result", "trial": "a", "step": 100, "num_steps": 300, "names_seen": 100,
         "train_seconds": 1.0, "first_step": 0, "losses": [3.0, 2.5], "block": 50, "heldout": [[100, 2.6]]},
        {"event": "trial_result", "trial": "b", "step": 100, "num_steps": 300, "names_seen": 100,
         "train_seconds": 2.0, "first_step": 0, "losses": [3.1], "block": 100, "heldout": [[100, 2.9]]},
        {"event": "trial_ended", "trial": "b", "status": "stopped early", "checkpoint": "/d/b.npz"},
        # a resumed trial goes on from its checkpoint at step 50: what came after it is replaced
        {"event": "trial_result", "trial": "a", "step": 300, "num_steps": 300, "names_seen": 300,
         "train_seconds": 3.0, "first_step": 50, "losses": [2.4, 2.2], "block": 125,
         "heldout": [[300, 2.3]], "checkpoint": "/d/a.npz"},
        {"event": "trial_ended", "trial": "a", "status": "done"},
        {"event": "sweep_ended", "status": "done", "seconds": 9.0},
    ]


def test_the_table_follows_the_events():
    table = ev.SweepTable()
    changed = [table.apply(event) for event in trial_events()]
    assert [c.trial if c else None for c in changed] == [None, "a", "b", "a", "b", "b", "a", "a", None]
    a, b = table.trials["a"], table.trials["b"]
    assert list(table.trials) == ["a", "b"]
    assert a.status == ev.TrialStatus.DONE and b.status == ev.TrialStatus.STOPPED_EARLY
    assert a.losses == [(50, 3.0), (175, 2.4), (300, 2.2)]
    assert a.heldout == [(300, 2.3)]
    assert (a.best_heldout, a.final_heldout, a.names_per_second) == (2.3, 2.3, 100.0)
    assert a.checkpoint == "/d/a.npz" and b.checkpoint == "/d/b.npz"
    assert table.best() is a and table.status == ev.SweepStatus.DONE
    summary = b.summary()
    assert summary["status"] == "stopped early" and summary["best_heldout"] == 2.9 and summary["steps"] == 100
    assert json.loads(json.dumps(table.summaries(), allow_nan=False))[0]["trial"] == "a"


def test_events_read_back_from_a_file_cut_short(tmp_path):
    path = tmp_path / ev.EVENTS_FILE
    lines = [ev.to_line(e) for e in trial_events()]
    path.write_text("".join(lines) + lines[3][:20])  # the last line cut by a crash
    assert ev.read_events(path) == [json.loads(line) for line in lines]
    ev.write_json_atomic(tmp_path / "r.json", {"x": [1.0, math.nan]})
    assert json.loads((tmp_path / "r.json").read_text()) == {"x": [1.0, None]}
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_cluster_addresses_are_host_and_port():
    from engine.sweep.connect import SweepError, is_loopback, split_address

    assert split_address("127.0.0.1:6379") == ("127.0.0.1", 6379)
    assert split_address("head.example:10001") == ("head.example", 10001)
    assert split_address("[::1]:6379") == ("::1", 6379)
    for bad, words in (("head", "is no Ray address: give http://HEAD:8265 (the head's job server"),
                       ("head:0", "is no Ray address"), ("head:port", "is no Ray address"),
                       ("ray://head:10001", "Ray Client (ray://) addresses are not used; give http://HEAD:8265")):
        with pytest.raises(SweepError, match=re.escape(words)):
            split_address(bad)
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("192.0.2.2") and not is_loopback("head.example")


def test_a_job_server_is_an_http_address_and_each_kind_is_checked():
    from engine.sweep.connect import SweepError, check_address, is_job_address, server_url

    assert is_job_address("http://head:8265") and is_job_address("HTTPS://head") and not is_job_address("head:6379")
    assert server_url("http://head.example:8265/") == ("http://head.example:8265", "head.example", 8265)
    assert server_url("https://ray.example") == ("https://ray.example", "ray.example", 443)
    for good in (None, "", "local", "auto", "127.0.0.1:6379", "http://127.0.0.1:8265"):
        check_address(good)
    for bad, words in (("http://head:8265/jobs", "is no job server address: give http://HEAD:8265"),
                       ("http://:8265", "is no job server address"), ("http://head:99999", "is no job server"),
                       ("ray://head:10001", "Ray Client (ray://)"), ("head", "is no Ray address")):
        with pytest.raises(SweepError, match=re.escape(words)):
            check_address(bad)
