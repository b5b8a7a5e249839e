"""One real launch of `microgpt-gui` the way a desktop runs it: Qt's xcb platform
on an X server (Xvfb), a few training steps, exit status 0."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def xvfb_display():
    """Start Xvfb on a free display (it reports the number through -displayfd)."""
    if shutil.which("Xvfb") is None:
        pytest.skip("Xvfb is not installed (Debian: apt-get install xvfb)")
    read_fd, write_fd = os.pipe()
    server = subprocess.Popen(["Xvfb", "-displayfd", str(write_fd), "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                              pass_fds=(write_fd,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        number = pipe.readline().strip()
    if not number:
        server.kill()
        pytest.skip(f"Xvfb did not start: {server.communicate()[1].decode(errors='replace')[-500:]}")
    yield f":{number}"
    server.terminate()
    server.wait(timeout=10)


def test_microgpt_gui_launches_trains_and_exits_under_xcb(xvfb_display, names_path, tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="xcb", DISPLAY=xvfb_display,
               MICROGPT_GUI_SETTINGS=str(tmp_path / "settings.ini"))
    env.pop("WAYLAND_DISPLAY", None)
    result = subprocess.run(
        [sys.executable, "main.py", "--data", str(names_path), "--autorun-steps", "20", "--quit-when-done"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "run ended at step 20 on the xcb platform" in result.stdout
    assert (tmp_path / "settings.ini").is_file()  # the window closed normally and saved its settings


def test_autorun_with_a_missing_dataset_exits_with_status_1(tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", MICROGPT_GUI_SETTINGS=str(tmp_path / "settings.ini"))
    missing = tmp_path / "missing.txt"
    result = subprocess.run(
        [sys.executable, "main.py", "--data", str(missing), "--autorun-steps", "5", "--quit-when-done"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert f"dataset file not found: {missing}" in result.stderr
