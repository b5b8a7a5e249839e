"""A sweep on a real two-node Ray cluster on this machine, reached by its GCS
address (the sweep's driver runs here): `ray start --head` and a second `ray
start --address`, one CPU each, every address on 127.0.0.1, token
authentication with the test's own token for every process. The command
line's sweep runs its trials on both nodes; a driver with another token is
refused with a message; ending the cluster's processes leaves none of either
node (sweep_support.Cluster: never `ray stop`, which would end every Ray
process of the machine)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="sweeps need Ray: pip install -e '.[test]'")

from sweep_support import Cluster, four_trial_sweep, ray_environment, sweep_cli, write_spec  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]

CLUSTER_SWEEP = four_trial_sweep("cluster")


def test_a_sweep_runs_on_a_two_node_cluster_by_address(tmp_path):
    env = ray_environment(tmp_path)
    cluster = Cluster(env)
    address = cluster.address
    try:
        cluster.start()
        spec = write_spec(tmp_path, CLUSTER_SWEEP)
        out = tmp_path / "results.json"
        done = sweep_cli(env, str(spec), "--address", address, "--dir", str(tmp_path / "sweep"), "--json", str(out))
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"Ray: 2 CPUs on 2 nodes ({address})" in done.stdout
        records = json.loads(out.read_text())
        assert len(records) == 4 and {r["status"] for r in records} == {"done"}
        assert {r["steps"] for r in records} == {6000}
        assert len({r["node"] for r in records}) == 2  # trials ran on both nodes
        assert all(Path(r["checkpoint"]).is_file() for r in records)
        assert "held-out loss of each trial (best first):" in done.stdout

        # the same cluster with another token: refused, in one line
        (tmp_path / "other").mkdir()
        wrong = ray_environment(tmp_path / "other")
        refused = sweep_cli(wrong, str(spec), "--address", address, "--dir", str(tmp_path / "refused"), timeout=120)
        assert refused.returncode == 1
        assert f"error: the Ray cluster at {address} refused this sweep's token" in refused.stderr
    finally:
        left = cluster.stop()
    assert left == []
