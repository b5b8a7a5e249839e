"""Launching `microgpt-gui` the way a desktop runs it: a real launch on Qt's xcb
platform on an X server (Xvfb), and what a launch that cannot work says first
(bad options, a backend that cannot run here, no display, Qt missing)."""
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import engine
import main
from cli_support import run_main
from engine.cli import commands as cli
from engine.cli import args as cli_args
from engine.backends import probe_backend

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
        [sys.executable, "main.py", "--data", str(names_path), "--autorun-steps", "20", "--quit-when-done",
         "--backend", "numpy"],  # not auto: no Futhark build started in the background
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


# before any window: checked without Qt, without a display ----------------------

@pytest.mark.parametrize("args, status, first_words", [
    (["--preset", "nope"], 2, "error: --preset: unknown preset 'nope'; choose from learn, tiny, s32,"),
    (["--backend", "nope"], 2, "error: unknown backend 'nope'; choose from numpy, cupy, futhark-c,"),
    (["--autorun-steps", "0"], 2, "error: --autorun-steps must be at least 1, got 0"),
    (["--autorun-steps"], 2, "error: --autorun-steps: expected one argument"),
    (["--quit-when-done"], 2, "error: --quit-when-done needs --autorun-steps N"),
    (["--bogus"], 2, "error: unrecognized arguments: --bogus"),
    # it exists but cannot run here (no CUDA driver on these machines): status 1 and the reason
    (["--backend", "futhark-cuda"], 1, "error: backend futhark-cuda cannot run here: "),
])
def test_a_launch_with_a_bad_option_is_one_line_before_any_window(args, status, first_words, tmp_path, names_path):
    """Even where a window could open (offscreen), the launch stops first: with
    --quit-when-done the window used to train on the defaults and exit 0."""
    if "futhark-cuda" in args and probe_backend("futhark-cuda")[0]:
        pytest.skip("futhark-cuda can run on this machine")
    result = run_main(["--data", str(names_path), *args], tmp_path, QT_QPA_PLATFORM="offscreen")
    assert result.returncode == status, result.stderr[-2000:]
    assert result.stderr.startswith(first_words) and result.stderr.count("\n") == 1
    assert result.stdout == "" and not (tmp_path / "settings.ini").exists()  # no window was made


def test_an_unknown_preset_used_to_train_on_the_defaults(tmp_path, names_path):
    result = run_main(["--data", str(names_path), "--preset", "nope", "--autorun-steps", "3", "--quit-when-done"],
                      tmp_path, QT_QPA_PLATFORM="offscreen")
    assert result.returncode == 2 and "run ended" not in result.stdout


@pytest.mark.parametrize("platform", [None, "xcb"])
def test_no_display_says_so_before_qt_aborts(platform, tmp_path):
    extra = {} if platform is None else {"QT_QPA_PLATFORM": platform}
    result = run_main(["--data", str(tmp_path / "names.txt")], tmp_path, **extra)  # no DISPLAY, no WAYLAND_DISPLAY
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"error: {cli.NO_DISPLAY}\n"
    assert "xcb" not in result.stderr


@pytest.mark.parametrize("environ, platform, expected", [
    ({}, "linux", False),
    ({"QT_QPA_PLATFORM": "xcb"}, "linux", False),
    ({"QT_QPA_PLATFORM": "wayland;xcb"}, "linux", False),
    ({"DISPLAY": ":0"}, "linux", True),
    ({"WAYLAND_DISPLAY": "wayland-0"}, "linux", True),
    ({"QT_QPA_PLATFORM": "offscreen"}, "linux", True),
    ({"QT_QPA_PLATFORM": "vnc:size=800x600"}, "freebsd14", True),
    ({}, "freebsd14", False),
    ({}, "darwin", True),
    ({}, "win32", True),
])
def test_has_display(environ, platform, expected):
    assert cli.has_display(environ, platform) is expected


def test_help_names_the_headless_commands_and_version_is_the_packages(tmp_path):
    helped = run_main(["--help"], tmp_path)
    assert helped.returncode == 0 and helped.stderr == ""
    assert "microgpt-gui demo" in helped.stdout and "microgpt-gui bench" in helped.stdout
    assert "--autorun-steps" in helped.stdout and "--version" in helped.stdout

    version = run_main(["--version"], tmp_path)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert (version.returncode, version.stdout, version.stderr) == (0, f"microgpt-gui {project['version']}\n", "")


def test_version_falls_back_to_the_engines_without_package_metadata(monkeypatch):
    import importlib.metadata

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert cli_args.package_version() == engine.__version__


def test_qt_that_cannot_load_is_one_line(tmp_path, monkeypatch, capsys, names_path):
    """A minimal Linux without Qt's system libraries: ImportError (libEGL.so.1 ...) at import."""
    monkeypatch.setitem(sys.modules, "gui.app", None)  # importing it raises ImportError
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    assert main.main(["--data", str(names_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: Qt cannot load: ") and err.count("\n") == 1 and "System libraries for Qt" in err
