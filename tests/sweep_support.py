"""Running real sweeps in tests: the environment every Ray process of a test
gets (token authentication with a token of the test's own, usage statistics
off, this checkout first on the path), sweep files, a runner's events
collected until it ends, and a real two-node Ray cluster on this machine.

A test's cluster is ended by its own processes (found by a marker in their
environment, which every process the cluster starts inherits: its daemons,
workers and jobs' drivers; and by the sessions of its `ray start` commands,
where its daemons stay: a daemon that renames itself, as Ray's agents do,
may write over the environment the marker is read from), never by `ray
stop`, which ends every Ray process of the machine, another test's or
another user's session's included."""
from __future__ import annotations

import os
import queue
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from engine.sweep import launch

ROOT = Path(__file__).resolve().parents[1]
SWEEP_TIMEOUT_S = 300
# Python code that hides Ray from the process it runs in, as if it were not installed:
# `import ray` raises ModuleNotFoundError and importlib.util.find_spec("ray") is None
HIDE_RAY = "import sys; sys.modules['ray'] = None"


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


def four_trial_sweep(name: str, **sweep_keys) -> str:
    """The sweep the cluster tests run: four random trials of tiny (6000 steps), one CPU
    each, no early stopping; sweep_keys go into its [sweep] table."""
    extra = "".join(f"{key} = {value!r}\n" for key, value in sweep_keys.items())
    return f"""
[sweep]
name = "{name}"
search = "random"
trials = 4
seed = 1
{extra}
[resources]
cpus_per_trial = 1

[scheduler]
kind = "none"

[run]
preset = "tiny"
steps = 6000

[space]
learning_rate = {{ loguniform = [0.003, 0.02] }}
"""


def write_spec(folder: Path, text: str, name: str = "sweep.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def sweep_cli(env: dict[str, str], *args: str, timeout: float = SWEEP_TIMEOUT_S) -> subprocess.CompletedProcess:
    """`microgpt-gui sweep ARGS` in a process of its own, with env."""
    return subprocess.run([sys.executable, "main.py", "sweep", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def without_ray(command: list[str]) -> list[str]:
    """A `python -m MODULE ARGS` command run with Ray hidden (HIDE_RAY)."""
    python, flag, module, *args = command
    assert flag == "-m", command
    return [python, "-c", f"{HIDE_RAY}; import runpy; runpy.run_module({module!r}, run_name='__main__', "
                          "alter_sys=True)", *args]


class Run:
    """A runner started with launch.runner_command (hide_ray: as where Ray is not
    installed), its events as they come."""

    def __init__(self, folder: Path, env: dict[str, str], spec: Path | None = None, resume: bool = False,
                 address: str | None = None, hide_ray: bool = False):
        command = launch.runner_command(folder, spec, address, resume=resume)
        self.process = launch.SweepProcess(without_ray(command) if hide_ray else command, env=env)
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes_with_env(marker: str) -> list[int]:
    """Every live process (but this one) whose environment holds marker (Linux /proc)."""
    pids = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


CLUSTER_MARKER = "MICROGPT_TEST_CLUSTER"


class Cluster:
    """A real Ray cluster on this machine: a head (one CPU; with job_server, its dashboard and
    job server on 127.0.0.1) and a second node of one CPU, every port chosen free, every
    process with env (the test's token) and a marker of this cluster's own."""

    def __init__(self, env: dict[str, str], job_server: bool = False):
        self.marker = secrets.token_hex(8)
        self.env = {**env, CLUSTER_MARKER: self.marker}
        self.port, self.dashboard_port = free_port(), free_port()
        self.job_server = job_server
        self.sessions: list[int] = []  # its `ray start` commands' sessions

    @property
    def address(self) -> str:
        """The head's GCS address."""
        return f"127.0.0.1:{self.port}"

    @property
    def job_address(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start(self) -> "Cluster":
        ports = lambda *names: [arg for name in names for arg in (f"--{name}", str(free_port()))]  # noqa: E731
        dashboard = (["--include-dashboard=true", "--dashboard-host", "127.0.0.1", "--dashboard-port",
                      str(self.dashboard_port)] if self.job_server else ["--include-dashboard=false"])
        head = ["--head", "--port", str(self.port), "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
                "--disable-usage-stats", *dashboard,
                *ports("ray-client-server-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                       "metrics-export-port", "runtime-env-agent-port")]
        self.sessions.append(ray_start(self.env, *head))
        node = ["--address", self.address, "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
                *ports("dashboard-agent-listen-port", "dashboard-agent-grpc-port", "metrics-export-port",
                       "runtime-env-agent-port")]  # ports free once the head has taken its own
        self.sessions.append(ray_start(self.env, *node))
        return self

    def processes(self) -> list[int]:
        """This cluster's live processes: those with its marker, and those of its `ray start` sessions."""
        pids = set(processes_with_env(f"{CLUSTER_MARKER}={self.marker}"))
        for session in self.sessions:
            pids.update(launch.session_processes(session))
        return sorted(pids - {os.getpid()})

    def stop(self, grace_s: float = 15.0) -> list[int]:
        """End every process of this cluster (SIGTERM, then SIGKILL after grace_s); those left."""
        for signum in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.processes():
                try:
                    os.kill(pid, signum)
                except OSError:
                    pass
            deadline = time.monotonic() + grace_s
            while self.processes() and time.monotonic() < deadline:
                time.sleep(0.5)
        return self.processes()
