"""The soak (scripts/soak.py) as a test: a seeded sequence of a few hundred
user actions on the window, with SlowBackend making opening and sampling slow,
run in its own process so that an abort shows as a signal, not a lost test run.
MICROGPT_SOAK_SEED and MICROGPT_SOAK_ACTIONS change the seed and the length."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_soak_no_stall_no_abort_every_thread_finished(names_path, tmp_path):
    seed = int(os.environ.get("MICROGPT_SOAK_SEED", "1"))
    actions = int(os.environ.get("MICROGPT_SOAK_ACTIONS", "250"))
    report_path = tmp_path / "soak.json"
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    env["TMPDIR"] = str(tmp_path)  # the soak's temporary folder, seen to go
    result = subprocess.run(
        [sys.executable, "scripts/soak.py", "--seed", str(seed), "--actions", str(actions), "--max-stall-ms", "100",
         "--data", str(names_path), "--json", str(report_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert not list(tmp_path.glob("microgpt-soak-*")), "the soak left its temporary folder"
    assert result.returncode in (0, 1), f"the soak died (status {result.returncode}): {result.stderr[-3000:]}"
    report = json.loads(report_path.read_text())
    assert report["exceptions"] == []
    assert report["qt_warnings"] == {}
    assert report["gave_up"] == []
    assert report["stalls_over_limit"] == [], (report["stall_fields"], report["stalls_over_limit"])
    assert report["threads_running_at_end"] == 0 and report["windows_still_open"] == 0
    assert report["actions"] == actions
    # it did what it is for: slow openings and samples, interrupted by Reset, close and load
    calls, counts = report["slow_backend_calls"], report["action_counts"]
    assert calls["open"] >= 5 and calls["sample_started"] >= 3
    for scenario in ("reset while opening big", "load while opening big", "reset while sampling",
                     "close and reopen", "load checkpoint", "save checkpoint", "export", "F5"):
        assert counts.get(scenario, 0) >= 1, scenario
    assert result.returncode == 0, result.stdout[-3000:]
