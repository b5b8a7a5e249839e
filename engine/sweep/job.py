"""A sweep submitted to a Ray cluster as a Ray job, through the head's job
server (`--address http://HEAD:8265`: the dashboard's port).

The runner here (python -m engine.sweep, a child of the window or the command
line, as for a local sweep) then runs nothing of Ray itself: it submits the
same runner as the job's entrypoint, `python -m engine.sweep --job ...`, which
needs only microgpt-gui installed on the cluster. The sweep file, and the
dataset when the sweep names one, go with the job as its runtime_env
working_dir: a temporary folder of those files alone. It then follows the
job's log, where the runner on the cluster writes its events, and relays each
event as it comes: on its stdout (the same events as a local sweep's, for the
window and the command line) and into the local folder's events.jsonl and
results.json. The local folder's job.json says where the sweep runs (the
address, the job, its folder on the cluster), so --resume submits it there
again.

Stop: Ray's stop_job, which sends the runner SIGTERM; that stops Tune as
Ctrl-C does, and RAY_JOB_STOP_WAIT_TIME_S in the job's environment gives it
time to save its state before Ray would kill it. Stop one trial: a small job,
`python -m engine.sweep.job stop-trial`, appends the command to the sweep's
commands.jsonl on the cluster, which the runner follows (jobs without
resources of their own run on the head node, so both see the same folder).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.util
import json
import secrets
import shlex
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from .connect import RAY_MISSING, SweepError, check_reachable, first_line, is_job_address, server_url
from .events import SPEC_FILE, write_json_atomic

JOB_FILE = "job.json"            # in the local folder: where the sweep runs as a job
JOB_SWEEPS = "sweep-jobs"        # on the cluster: job sweeps' folders, in the data folder there
COMMANDS_FILE = "commands.jsonl"  # in the folder on the cluster: stop commands for the runner there
DATASET_FOLDER = "dataset"       # in the job's working_dir: the sweep's dataset, when it names one
STOP_WAIT_S = 60                 # after Stop, the job's runner has this long to save Tune's state
RECONNECT_S = 30.0               # a lost job server is tried again for this long
POLL_S = 0.2                     # stop commands are carried out within this
LOG_LINES = 40                   # the job's last lines that are no event, for a message when it fails
JOB_CLIENT_MISSING = ("submitting a sweep as a Ray job needs Ray's job client (ray[default]): "
                      "pip install 'microgpt-gui[sweep]' (or pip install 'ray[default]')")
OLD_PACKAGE_HINT = ("the cluster's microgpt-gui is older than this one (its sweep runner does not run as a "
                    "job): install this version on every node")
NO_PACKAGE_HINT = ("microgpt-gui is not installed on the cluster's head: every node needs "
                   "pip install 'microgpt-gui[sweep]' (the Python that runs `ray start`)")


def read_job_file(folder: Path) -> dict | None:
    try:
        info = json.loads((folder / JOB_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and info.get("address") and info.get("cluster_dir") else None


def runs_as_job(address: str | None, folder: Path, resume: bool) -> bool:
    """This runner submits the sweep as a job: an http(s) address, or a job sweep's folder
    (job.json) resumed."""
    return is_job_address(address) or resume and (folder / JOB_FILE).exists()


def job_entrypoint(cluster_dir: str, spec_name: str | None, dataset: str | None) -> str:
    """The job's command on the cluster: this same runner, with --job (spec_name None: resume)."""
    command = ["python", "-m", "engine.sweep", "--job", "--dir", cluster_dir]
    command += ["--resume"] if spec_name is None else ["--spec", spec_name]
    if dataset:
        command += ["--dataset", dataset]
    return shlex.join(command)


def stop_trial_entrypoint(cluster_dir: str, trial: str) -> str:
    return shlex.join(["python", "-m", "engine.sweep.job", "stop-trial", "--dir", cluster_dir, trial])


# ---- the job server ---------------------------------------------------------------------

def job_server_error(url: str, exc: BaseException) -> str:
    """One line for what the job server (or the way to it) said."""
    text = str(exc)
    if type(exc).__name__ == "AuthenticationError" or "Authentication" in text:
        asked = "asks for a token" if "Authentication required" in text else "refused this sweep's token"
        return (f"the Ray job server at {url} {asked}: give the app the cluster's token (RAY_AUTH_TOKEN, "
                "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token; `ray get-auth-token` on the head prints it) and "
                "RAY_AUTH_MODE=token")
    if isinstance(exc, ConnectionError) or "ConnectionError" in type(exc).__name__:
        return f"cannot reach the Ray job server at {url}: {first_line(exc)}"
    return f"the Ray job server at {url} failed: {first_line(exc)}"


class JobClient:
    """Ray's JobSubmissionClient for one job server, with its errors as SweepError."""

    def __init__(self, address: str):
        self.url, host, port = server_url(address)
        check_reachable(host, port, f"the Ray job server at {self.url}", "Start the cluster's head with its job "
                        "server (`ray start --head --dashboard-host 0.0.0.0`; it listens on port 8265)")
        if importlib.util.find_spec("ray") is None:
            raise SweepError(RAY_MISSING)
        if importlib.util.find_spec("aiohttp") is None:
            raise SweepError(JOB_CLIENT_MISSING)
        from ray.job_submission import JobSubmissionClient

        try:
            self.client = JobSubmissionClient(self.url)
        except Exception as exc:
            raise SweepError(job_server_error(self.url, exc)) from None

    def call(self, method: str, *args, **kwargs):
        try:
            return getattr(self.client, method)(*args, **kwargs)
        except Exception as exc:
            raise SweepError(job_server_error(self.url, exc)) from None

    async def tail(self, job_id: str):
        async for chunk in self.client.tail_job_logs(job_id):
            yield chunk


# ---- submitting and following -----------------------------------------------------------

def submit_and_follow(args, folder: Path, sink) -> int:
    """The sweep as a Ray job: submit it, relay its events until it ends; the exit status
    a local runner would have."""
    from . import runner
    from .runner import EXIT_FAILED, EXIT_STOPPED, EXIT_USAGE
    from .spec import SweepSpecError, read_spec

    end = sink.end
    job = read_job_file(folder) if args.resume else None
    if args.resume and (folder / JOB_FILE).exists() and job is None:
        return end("failed", EXIT_USAGE, f"{folder / JOB_FILE} cannot be read: it says where the sweep ran")
    if args.resume and job is None:
        return end("failed", EXIT_USAGE, f"{folder} did not run as a Ray job (it has no {JOB_FILE}): Tune's "
                                         "state is on this machine; resume it without an http:// address")
    address = args.address or job["address"]
    if job is not None and not is_job_address(address):
        return end("failed", EXIT_USAGE, f"{folder} ran as a Ray job on {job['address']} (its folder there: "
                                         f"{job['cluster_dir']}): resume it there (no --address, or "
                                         f"--address {job['address']})")
    spec_path = folder / SPEC_FILE if args.resume else args.spec
    try:
        spec = read_spec(spec_path)
    except SweepSpecError as exc:
        return end("failed", EXIT_USAGE, str(exc))
    if not args.resume:
        (folder / SPEC_FILE).write_text(spec.source, encoding="utf-8")
    dataset = Path(spec.dataset).expanduser().resolve() if spec.dataset else None
    if dataset is not None:
        from ..data.corpus import load_corpus

        try:
            load_corpus(dataset)  # the same checks as a local sweep's, before anything is sent
        except ValueError as exc:
            return end("failed", EXIT_USAGE, f"the dataset: {exc}")
    sink.run_fields = dict(spec.run)

    runner.COMMANDS.listen(stdin=args.commands)  # no Tune here: a stop is carried out by JobRelay
    try:
        client = JobClient(address)
    except SweepError as exc:
        return end("failed", EXIT_FAILED, str(exc))
    if runner.COMMANDS.stop_all.is_set():
        return end("stopped", EXIT_STOPPED)

    token = secrets.token_hex(4)
    job_id = f"microgpt-sweep-{spec.name}-{token}"
    # a new sweep's folder there: named after this one, and never one an earlier sweep wrote
    cluster_dir = job["cluster_dir"] if job is not None else f"{folder.name}-{token}"
    with tempfile.TemporaryDirectory(prefix="microgpt-sweep-job-") as upload:
        spec_name = None
        if not args.resume:
            spec_name = f"{spec.name}.toml"  # the runner there names the sweep after its file, as here
            Path(upload, spec_name).write_text(spec.source, encoding="utf-8")
        dataset_name = None
        if dataset is not None:
            Path(upload, DATASET_FOLDER).mkdir()
            dataset_name = f"{DATASET_FOLDER}/{dataset.name}"
            shutil.copyfile(dataset, Path(upload, dataset_name))
        try:
            client.call("submit_job", entrypoint=job_entrypoint(cluster_dir, spec_name, dataset_name),
                        submission_id=job_id, metadata={"microgpt-gui": "sweep", "sweep": spec.name},
                        runtime_env={"working_dir": upload,
                                     "env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": str(STOP_WAIT_S)}})
        except SweepError as exc:
            return end("failed", EXIT_FAILED, str(exc).replace("failed:", "did not take the sweep's job:", 1))
    write_json_atomic(folder / JOB_FILE, {"address": client.url, "job": job_id, "cluster_dir": cluster_dir})
    sink.emit({"event": "job", "address": client.url, "job": job_id, "resumed": bool(args.resume)})

    relay = JobRelay(client, job_id, folder, sink, cluster_dir, bool(args.resume))
    status = relay.run()
    if relay.ended is not None:  # the runner there said how the sweep ended
        return {"done": 0, "stopped": EXIT_STOPPED}.get(relay.ended, EXIT_FAILED)
    if relay.lost:
        return end("failed", EXIT_FAILED, relay.lost)
    if status == "STOPPED":
        return end("stopped", EXIT_STOPPED)
    return end("failed", EXIT_FAILED, relay.failure_message(status))


class JobRelay:
    """Follows a submitted job's log: relays its events, carries out stop commands."""

    def __init__(self, client: JobClient, job_id: str, folder: Path, sink, cluster_dir: str, resumed: bool):
        self.client, self.job_id, self.folder, self.sink = client, job_id, folder, sink
        self.cluster_dir, self.resumed = cluster_dir, resumed
        self.seen_sweep = False      # the runner's "sweep" event has come: events before it are a replay
        self.ended: str | None = None  # the status of the runner's sweep_ended
        self.lost = ""               # why the job server could not be followed to the end
        self.log_tail: collections.deque = collections.deque(maxlen=LOG_LINES)
        self._done = threading.Event()

    def run(self) -> str:
        """Follow the job until it ends; its final status (a JobStatus's name), or "" if unknown."""
        watcher = threading.Thread(target=self._carry_out_commands, name="job-commands", daemon=True)
        watcher.start()
        try:
            self._follow()
        finally:
            self._done.set()
        try:
            return str(self.client.call("get_job_status", self.job_id).value)
        except Exception:
            return ""

    # the log -------------------------------------------------------------------
    def _follow(self) -> None:
        handled = 0       # complete lines of the log handled: a new stream starts at its beginning
        lost_since = None
        while True:
            count, rest = 0, ""
            try:
                async def tail():
                    nonlocal count, rest, handled
                    async for chunk in self.client.tail(self.job_id):
                        *lines, rest = (rest + chunk).split("\n")
                        for line in lines:
                            count += 1
                            if count > handled:
                                handled = count
                                self._line(line)

                asyncio.run(tail())
                if not self._job_ended():  # the stream closed early (the head's job agent restarted)
                    raise RuntimeError("the job's log stream closed before the job ended")
            except Exception as exc:
                if lost_since is None or count > 0:
                    lost_since = time.monotonic()
                if time.monotonic() - lost_since > RECONNECT_S:
                    self.lost = (f"lost the Ray job server at {self.client.url}: {first_line(exc)}. The sweep's "
                                 f"job {self.job_id} may still run there (`ray job stop {self.job_id}` ends it); "
                                 f"--resume {self.folder} continues the sweep")
                    return
                print(f"the job's log stream broke ({first_line(exc)}); following it again", file=sys.stderr,
                      flush=True)
                time.sleep(1.0)
                continue
            if rest and count + 1 > handled:  # the log's last line, without its newline
                self._line(rest)
            return

    def _job_ended(self) -> bool:
        status = self.client.call("get_job_status", self.job_id)
        return bool(status.is_terminal())

    def _line(self, line: str) -> None:
        from .events import parse_line

        event = parse_line(line)
        if event is None:
            if line.strip():
                self.log_tail.append(line.rstrip())
                print(line.rstrip(), file=sys.stderr, flush=True)
            return
        kind = event["event"]
        if kind == "sweep":
            self.seen_sweep = True
            self.cluster_dir = event.get("dir") or self.cluster_dir
            event.update(address=self.client.url, job=self.job_id, cluster_dir=self.cluster_dir,
                         dir=str(self.folder))
            write_json_atomic(self.folder / JOB_FILE, {"address": self.client.url, "job": self.job_id,
                                                       "cluster_dir": self.cluster_dir})
        elif kind == "sweep_ended":
            self.ended = event.get("status", "failed")
        replayed = self.resumed and not self.seen_sweep and kind.startswith("trial")
        self.sink.emit(event, to_file=not replayed)  # a resumed sweep's past: in events.jsonl already

    def failure_message(self, status: str) -> str:
        text = ""
        try:
            info = self.client.call("get_job_info", self.job_id)
            text = (info.message or "").strip().splitlines()[0] if info.message else ""
        except Exception:
            pass
        if any("No module named 'engine'" in line or "No module named engine" in line for line in self.log_tail):
            return f"the sweep's job {self.job_id} failed: {NO_PACKAGE_HINT}"
        if any("python -m engine.sweep: error: unrecognized arguments" in line for line in self.log_tail):
            return f"the sweep's job {self.job_id} failed: {OLD_PACKAGE_HINT}"
        last = self.log_tail[-1] if self.log_tail else ""
        reason = "; ".join(x for x in (text, last) if x) or f"it ended {status.lower() or 'without a result'}"
        return f"the sweep's job {self.job_id} failed: {reason}"

    # stop commands ----------------------------------------------------------------
    def _carry_out_commands(self) -> None:
        from .runner import COMMANDS

        stopped_job = False
        sent: set[str] = set()
        while not self._done.wait(POLL_S):
            if COMMANDS.stop_all.is_set() and not stopped_job:
                try:
                    self.client.call("stop_job", self.job_id)
                    stopped_job = True
                except SweepError as exc:
                    print(f"cannot stop the job yet: {exc}", file=sys.stderr, flush=True)
            for trial in sorted(COMMANDS.stop_trials - sent):
                if stopped_job:
                    break
                sent.add(trial)
                try:
                    self.client.call("submit_job", entrypoint=stop_trial_entrypoint(self.cluster_dir, trial),
                                     submission_id=f"{self.job_id}-stop-{trial}-{secrets.token_hex(2)}",
                                     metadata={"microgpt-gui": "stop trial", "sweep job": self.job_id})
                except SweepError as exc:
                    print(f"cannot stop trial {trial}: {exc}", file=sys.stderr, flush=True)


# ---- on the cluster: a stop command for the runner there ---------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.sweep.job",
                                     description="On a cluster: ask the sweep running there as a job to stop "
                                                 "one trial (the app submits this as a small job of its own).")
    commands = parser.add_subparsers(dest="command", required=True)
    stop = commands.add_parser("stop-trial")
    stop.add_argument("--dir", type=Path, required=True, help="the sweep's folder on the cluster")
    stop.add_argument("trial")
    args = parser.parse_args(argv)
    from .runner import sweep_folder

    folder = sweep_folder(args.dir, in_job=True)
    if not folder.is_dir():
        print(f"no sweep folder {folder} on this node", file=sys.stderr)
        return 1
    with open(folder / COMMANDS_FILE, "a", encoding="utf-8") as commands_file:
        commands_file.write(json.dumps({"stop": args.trial}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
