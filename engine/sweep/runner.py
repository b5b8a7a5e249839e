"""The sweep's driver, in a child process of its own (never the window's
process or a thread of it: Ray's processes are tied to the thread that starts
them):

    python -m engine.sweep --spec SWEEP.toml --dir DIR [--address ADDR] [--commands]
    python -m engine.sweep --resume --dir DIR [--address ADDR] [--commands]

It starts an embedded local Ray (address "local", this machine's CPUs or the
spec's, no dashboard, usage statistics off) or joins a cluster by its GCS
address (HOST:PORT: this process is the driver), runs Tune's Tuner with
engine.sweep.trial.run_trial, and writes one JSON
line per event (engine.sweep.events) to its stdout, which is nothing else's:
whatever Ray or a library prints goes to stderr. The same lines are appended
to DIR/events.jsonl as they come, and DIR/results.json (the table of trials)
is rewritten after each trial ends, so nothing finished is lost when the
sweep or the machine stops. DIR/tune is Tune's own experiment folder
(checkpoints, the state --resume restores).

With --commands it reads JSON lines on stdin: {"stop": "all"} stops the
sweep (resumable: Tune keeps its unfinished trials), {"stop": TRIAL_ID} stops
one trial for good; end of input (the parent has gone) stops the sweep.
SIGTERM stops it as {"stop": "all"} does. The runner
makes itself a session leader, so a parent can end it and every process it
started (Ray's included) by the session (engine.sweep.launch).

With a job server's address (http://HEAD:8265) it runs nothing of Ray here:
it submits this same runner to the cluster as a Ray job and relays the job's
events (engine.sweep.job). There, the runner runs with --job: it joins the
cluster the job runs on, its folder is on the cluster (a relative --dir is
under the data folder's sweep-jobs there), and it takes stop commands from
DIR/commands.jsonl as well (a job has no stdin).

Exit status: 0 done, 1 failed (the message is the last "error" event),
2 a sweep file or dataset that cannot be used, 3 stopped.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from .connect import RAY_MISSING, SweepError, connect, first_line
from .events import EVENTS_FILE, RESULTS_FILE, SPEC_FILE, SweepTable, to_line, write_json_atomic
from .spec import Search, SweepSpec, SweepSpecError, read_spec, space_size

EXIT_DONE, EXIT_FAILED, EXIT_USAGE, EXIT_STOPPED = 0, 1, 2, 3
TUNE_FOLDER = "tune"

# ---- events out ------------------------------------------------------------------------

class EventSink:
    """Writes each event to the events stream and DIR/events.jsonl, keeps the table of
    trials, and rewrites DIR/results.json when a trial or the sweep ends."""

    def __init__(self, stream, folder: Path):
        self.stream, self.folder = stream, folder
        self.started = time.monotonic()
        self.table = SweepTable()
        self.run_fields: dict = {}
        self.stream_open = True
        self._lock = threading.Lock()
        self._file = open(folder / EVENTS_FILE, "a", encoding="utf-8")

    def emit(self, event: dict, to_file: bool = True) -> None:
        event.setdefault("time", round(time.monotonic() - self.started, 3))  # seconds since the runner began
        line = to_line(event)
        with self._lock:
            self.table.apply(json.loads(line))
            if to_file:
                self._file.write(line)
                self._file.flush()
            self._write_stream(line)
            if event["event"] in ("trial_ended", "sweep_ended"):
                self.write_results()

    def _write_stream(self, line: str) -> None:
        if not self.stream_open:
            return
        try:
            self.stream.write(line)
            self.stream.flush()
        except (BrokenPipeError, OSError, ValueError):  # the parent has gone: the sweep ends
            self.stream_open = False
            COMMANDS.request_stop()

    def replay(self) -> None:
        """A resumed sweep: the events so far, to the stream only (they are in the file)."""
        from .events import read_events

        path = self.folder / EVENTS_FILE
        for event in read_events(path) if path.exists() else ():
            if event["event"] in ("sweep", "sweep_ended", "error"):
                continue
            with self._lock:
                self.table.apply(event)
                self._write_stream(to_line(event))

    def write_results(self) -> None:
        write_json_atomic(self.folder / RESULTS_FILE, {"sweep": self.table.info, "status": self.table.status.value,
                                                        "message": self.table.message,
                                                        "trials": self.table.summaries()})

    def error(self, message: str) -> None:
        self.emit({"event": "error", "message": message})

    def end(self, status: str, code: int, message: str = "") -> int:
        """The sweep ends: its message as an error event, then sweep_ended; code, the exit status."""
        if message:
            self.error(message)
        self.emit({"event": "sweep_ended", "status": status, "message": message,
                   "seconds": time.monotonic() - self.started})
        return code

    def close(self) -> None:
        self._file.close()


SINK: EventSink | None = None  # this process's; Tune's callbacks (engine.sweep.tune_hooks) find it here


class LineStream:
    """Writes each line with one write(2) call: where stdout and stderr are one file (a Ray
    job's log), another process's output can then come between two events, never inside one."""

    def __init__(self, fd: int):
        self.fd = fd

    def write(self, line: str) -> None:
        data = line.encode("utf-8")
        while data:
            data = data[os.write(self.fd, data):]

    def flush(self) -> None:
        pass


def events_stream() -> LineStream:
    """The events' own stream: the original stdout, which from now on only they use
    (file descriptor 1 becomes a copy of stderr, for Ray's and any library's output)."""
    sys.stdout.flush()
    stream = LineStream(os.dup(1))
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return stream


# ---- commands in -----------------------------------------------------------------------

class Commands:
    """Stop requests. Stopping the sweep interrupts Tune as its own SIGUSR1 handler does
    (Ctrl-C's way): Tune saves the experiment with its unfinished trials as they are, so
    --resume continues them (a Stopper's stop_all would end them for good)."""

    def __init__(self) -> None:
        self.stop_all = threading.Event()
        self.stop_trials: set[str] = set()
        self.cut: set[str] = set()  # trials ASHA stopped before they finished

    def request_stop(self) -> None:
        if self.stop_all.is_set():
            return
        self.stop_all.set()
        if hasattr(signal, "SIGUSR1"):
            os.kill(os.getpid(), signal.SIGUSR1)  # Tune's handler while it runs; ours (a no-op) else

    def handle(self, line: str) -> None:
        """One command line: {"stop": "all"} or {"stop": TRIAL}."""
        try:
            command = json.loads(line)
        except ValueError:
            return
        target = command.get("stop") if isinstance(command, dict) else None
        if target == "all":
            self.request_stop()
        elif isinstance(target, str):
            self.stop_trials.add(target)

    def listen(self, stdin: bool) -> None:
        """SIGTERM stops the sweep; with stdin, commands are read there as well."""
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop())
        if hasattr(signal, "SIGUSR1"):  # request_stop's signal to Tune: before Tune runs, stop_all says it all
            signal.signal(signal.SIGUSR1, lambda *_: None)
        if stdin:
            threading.Thread(target=self.read, args=(sys.stdin,), name="commands", daemon=True).start()

    def read(self, lines) -> None:
        for line in lines:
            self.handle(line)
        self.request_stop()  # end of input: the parent has gone

    def follow_file(self, path: Path, every_s: float = 0.5) -> None:
        """Commands appended to path (a job's: engine.sweep.job writes them), until the sweep stops."""
        offset = 0
        while not self.stop_all.wait(every_s):
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                continue
            complete = data.rfind(b"\n") + 1
            offset += complete
            for line in data[:complete].decode("utf-8", errors="replace").splitlines():
                self.handle(line)


COMMANDS = Commands()


def make_tuner(spec: SweepSpec, folder: Path, base, resume: bool):
    from ray import tune

    from ray.tune.logger import JsonLoggerCallback

    from . import space
    from .trial import run_trial

    from .tune_hooks import CommandStopper, EventCallback

    space.CUT_LISTENER[:] = [COMMANDS.cut.add]
    trainable = tune.with_resources(tune.with_parameters(run_trial, base=base), {"cpu": spec.cpus_per_trial})
    tune_path = folder / TUNE_FOLDER
    if resume and tune.Tuner.can_restore(str(tune_path)):
        return tune.Tuner.restore(str(tune_path), trainable, resume_unfinished=True, resume_errored=False,
                                  restart_errored=False)
    run_config = tune.RunConfig(
        name=TUNE_FOLDER, storage_path=str(folder), verbose=0, callbacks=[EventCallback(), JsonLoggerCallback()], stop=CommandStopper(),
        failure_config=tune.FailureConfig(max_failures=0, fail_fast=False),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=1))
    tune_config = tune.TuneConfig(metric=spec.metric, mode="min", num_samples=spec.trials,
                                  search_alg=space.search_algorithm(spec), scheduler=space.scheduler(spec),
                                  time_budget_s=spec.time_budget_s,
                                  max_concurrent_trials=spec.max_concurrent if spec.search == Search.TPE else None,
                                  reuse_actors=False)
    return tune.Tuner(trainable, param_space=space.param_space(spec), tune_config=tune_config,
                      run_config=run_config)


def trial_base(spec: SweepSpec):
    from ..data.corpus import load_corpus
    from .trial import TrialBase

    corpus = load_corpus(spec.dataset)
    return TrialBase(run=dict(spec.run), docs=tuple(corpus.docs), chars=tuple(corpus.chars),
                     cpus=spec.cpus_per_trial, report_every_s=spec.report_every_s,
                     checkpoint_every_s=spec.checkpoint_every_s, milestones=spec.checkpoint_milestones(),
                     time_attr=spec.scheduler.time_attr.value)


# ---- the process -----------------------------------------------------------------------

def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m engine.sweep")
    parser.add_argument("--spec", type=Path, help="the sweep file (not with --resume)")
    parser.add_argument("--dir", type=Path, required=True, help="the sweep's folder")
    parser.add_argument("--resume", action="store_true", help="resume the sweep in --dir")
    parser.add_argument("--address", help="a Ray cluster's address: http://HEAD:8265 submits the sweep as a "
                        "Ray job, HOST:PORT joins its GCS from here (default: a local Ray; on --resume, where "
                        "the sweep ran)")
    parser.add_argument("--commands", action="store_true", help="read stop commands on stdin")
    parser.add_argument("--job", action="store_true", help="run as a Ray job on a cluster (engine.sweep.job "
                        "submits it so): join that cluster, a relative --dir is under its data folder")
    parser.add_argument("--dataset", type=Path, help="the dataset file, in place of the sweep's (a job's copy)")
    args = parser.parse_args(argv)
    if (args.spec is None) == (not args.resume):
        parser.error("give --spec FILE, or --resume")
    return args


def sweep_folder(path: Path, in_job: bool) -> Path:
    """The folder --dir names; in a job, a relative one is under sweep-jobs in this machine's
    data folder (MICROGPT_GUI_DATA_DIR moves it, e.g. onto storage every node mounts)."""
    if in_job and not path.is_absolute():
        from ..data.corpus import user_data_dir
        from .job import JOB_SWEEPS

        path = user_data_dir() / JOB_SWEEPS / path
    return path.expanduser().resolve()


def become_session_leader() -> None:
    if hasattr(os, "setsid") and os.getsid(0) != os.getpid():
        try:
            os.setsid()
        except OSError:
            pass


def main(argv=None) -> int:
    global SINK
    args = parse_args(argv)
    if not args.job:  # a job's runner stays in its supervisor's process group: Stop reaches it there
        become_session_leader()
    stream = events_stream()
    folder = sweep_folder(args.dir, args.job)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        stream.write(to_line({"event": "error", "message": f"cannot create {folder}: {exc.strerror or exc}"}))
        stream.write(to_line({"event": "sweep_ended", "status": "failed", "seconds": 0}))
        return EXIT_USAGE
    SINK = sink = EventSink(stream, folder)
    try:
        from .job import runs_as_job, submit_and_follow

        if not args.job and runs_as_job(args.address, folder, args.resume):
            return submit_and_follow(args, folder, sink)
        return run(args, folder, sink)
    finally:
        sink.close()


def run(args, folder: Path, sink: EventSink) -> int:
    end = sink.end
    spec_path = folder / SPEC_FILE if args.resume else args.spec
    try:
        spec = read_spec(spec_path)
    except SweepSpecError as exc:
        return end("failed", EXIT_USAGE, str(exc))
    if args.dataset is not None:
        spec = dataclasses.replace(spec, dataset=str(args.dataset.resolve()))
    if args.resume:
        sink.replay()
    elif args.job and (folder / TUNE_FOLDER).exists():
        return end("failed", EXIT_USAGE, f"{folder} holds a sweep already: a new sweep needs a folder of its own")
    else:
        (folder / SPEC_FILE).write_text(spec.source, encoding="utf-8")
    try:
        base = trial_base(spec)
    except ValueError as exc:  # DatasetError
        return end("failed", EXIT_USAGE, f"the dataset: {exc}")
    sink.run_fields = dict(spec.run)
    if args.job:  # out of the job's working_dir (its files are read): Ray may delete it while the job runs
        os.chdir(folder)

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    # Tune's CSV and TensorBoard logs: not wanted (events.jsonl and each trial's result.json are kept)
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    try:
        import ray
    except ImportError:
        return end("failed", EXIT_FAILED, RAY_MISSING)

    COMMANDS.listen(stdin=args.commands)
    if args.job:
        from .job import COMMANDS_FILE

        commands = folder / COMMANDS_FILE
        commands.write_text("", encoding="utf-8")  # a resumed sweep's old commands are done with
        threading.Thread(target=COMMANDS.follow_file, args=(commands,), name="commands", daemon=True).start()
    try:
        address = connect(args.address, spec.cpus, in_job=args.job)
    except SweepError as exc:
        return end("failed", EXIT_FAILED, str(exc))
    except Exception as exc:
        return end("failed", EXIT_FAILED, f"Ray failed to start: {first_line(exc)}")
    # ray.init put Ray's own SIGTERM handler (a stack trace, then death) in place of ours: a
    # job's Stop is a SIGTERM, and it should stop Tune as Ctrl-C does
    signal.signal(signal.SIGTERM, lambda *_: COMMANDS.request_stop())
    try:
        resources = ray.cluster_resources()
        nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
        cpus = int(resources.get("CPU", 0))
        sink.emit({"event": "sweep", "name": spec.name, "dir": str(folder), "address": address, "cpus": cpus,
                   "nodes": nodes, "search": spec.search.value, "trials": space_size(spec) or spec.trials,
                   "cpus_per_trial": spec.cpus_per_trial, "time_budget_s": spec.time_budget_s,
                   "resumed": bool(args.resume)})
        if cpus < spec.cpus_per_trial:
            return end("failed", EXIT_FAILED, f"the Ray cluster has {cpus} CPUs: a trial needs "
                                              f"{spec.cpus_per_trial} ([resources] cpus_per_trial)")
        if not COMMANDS.stop_all.is_set():
            make_tuner(spec, folder, base, args.resume).fit()
    except Exception as exc:
        traceback.print_exc()  # on stderr (a job's log): the whole story behind the one line
        return end("failed", EXIT_FAILED, f"the sweep failed: {first_line(exc)}")
    finally:
        ray.shutdown()
    if COMMANDS.stop_all.is_set():
        return end("stopped", EXIT_STOPPED)
    return end("done", EXIT_DONE)

