"""Running real sweeps in tests: the environment every Ray process of a test
gets (token authentication with a token of the test's own, usage statistics
off, this checkout first on the path), sweep files, and a runner's events
collected until it ends."""
from __future__ import annotations

import os
import queue
import secrets
import subprocess
import sys
import time
from pathlib import Path

from engine.sweep import launch

SWEEP_TIMEOUT_S = 300


def ray_environment(folder: Path, **extra: str) -> dict[str, str]:
    """The same Ray settings for every process of a test: token authentication with a
    fresh token in `folder` (never the user's ~/.ray/auth_token), no usage statistics."""
    token = folder / "ray_token"
    if not token.exists():
        token.write_text(secrets.token_hex(32))
    env = launch.runner_environment()
    env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0",
                "HOME": str(folder), "XDG_DATA_HOME": str(folder / "data")})
    env.pop("RAY_AUTH_TOKEN", None)
    env.update(extra)
    return env


def write_spec(folder: Path, text: str, name: str = "sweep.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


class Run:
    """A runner started with launch.runner_command, its events as they come."""

    def __init__(self, folder: Path, env: dict[str, str], spec: Path | None = None, resume: bool = False,
                 address: str | None = None):
        self.process = launch.SweepProcess(launch.runner_command(folder, spec, address, resume=resume), env=env)
        self.events: list[dict] = []
        self.code: int | None = None

    def next_event(self, timeout: float = SWEEP_TIMEOUT_S) -> dict | None:
        event = self.process.events.get(timeout=timeout)
        if event is not None:
            self.events.append(event)
        return event

    def until(self, condition, timeout: float = SWEEP_TIMEOUT_S) -> dict:
        """Events until one meets condition(event); that event."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no such event in {timeout:g} s; got {[e['event'] for e in self.events]}")
            try:
                event = self.next_event(left)
            except queue.Empty:
                continue
            if event is None:
                raise AssertionError(f"the runner ended first; stderr: {list(self.process.stderr_tail)[-5:]}")
            if condition(event):
                return event

    def finish(self, timeout: float = SWEEP_TIMEOUT_S) -> int:
        deadline = time.monotonic() + timeout
        while True:
            try:
                event = self.next_event(max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                if time.monotonic() > deadline:
                    self.process.end(grace_s=5)
                    raise TimeoutError(f"the sweep took over {timeout:g} s")
                continue
            if event is None:
                break
        self.code = self.process.wait()
        return self.code

    def of(self, kind: str, trial: str | None = None) -> list[dict]:
        return [e for e in self.events if e["event"] == kind and (trial is None or e.get("trial") == trial)]


def ray_start(env: dict[str, str], *args: str) -> int:
    """`ray start ARGS` in a session of its own (the processes it leaves belong to it); its pid
    (the session's id)."""
    ray = Path(os.path.dirname(os.path.realpath(sys.executable))) / "ray"
    command = [str(ray) if ray.exists() else "ray", "start", *args]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    out, _ = process.communicate(timeout=120)
    if process.returncode != 0:
        raise RuntimeError(f"ray start {' '.join(args)} failed:\n{out[-2000:]}")
    return process.pid
