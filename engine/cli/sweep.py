"""`microgpt-gui sweep SWEEP.toml [--address ADDR] [--resume DIR] [--dir DIR] [--json FILE]`:
run a sweep (engine.sweep) in a child process, print a line when each trial
starts and ends, and a table of the trials at the end.

The sweep file is checked here before anything starts; the runner's events
(JSON lines) are read from its stdout. Ctrl-C stops the sweep (Tune saves its
state: `--resume DIR` continues it); a second Ctrl-C ends it at once.
"""
from __future__ import annotations

import json
import math
import queue
import signal
import sys
from pathlib import Path

from ..sweep import launch
from ..sweep.connect import RAY_MISSING, SweepError, check_address
from ..sweep.events import SPEC_FILE, SweepTable, TrialRecord, TrialStatus
from ..sweep.job import is_job_address, read_job_file
from ..sweep.runner import EXIT_DONE, EXIT_STOPPED, EXIT_USAGE
from ..sweep.spec import SweepSpec, find_spec_file, read_spec, space_size
from .args import EXIT_ERROR
from .checks import check_output_file

EXIT_INTERRUPTED = 130
TABLE_ROWS = 50  # the final table shows the best this many trials


def run_sweep(args) -> int:
    if args.json:
        check_output_file(args.json, "--json")
    spec, folder = sweep_to_run(args)
    if not launch.ray_installed():
        print(f"error: {RAY_MISSING}", file=sys.stderr)
        return EXIT_ERROR
    job = read_job_file(folder) if args.resume else None  # a job sweep resumes where it ran
    print(describe(spec, args.address or (job or {}).get("address"), folder, bool(args.resume)), flush=True)
    command = launch.runner_command(folder, None if args.resume else args.spec.resolve(), args.address,
                                    resume=bool(args.resume))
    process = launch.SweepProcess(command)
    table, code = follow(process, spec)
    if args.json:
        args.json.write_text(json.dumps(table.summaries(), indent=1, allow_nan=False) + "\n", encoding="utf-8")
    if table.trials:
        print(final_table(table, spec))
    if code == EXIT_USAGE:
        print(f"error: {table.message or 'the sweep could not start'}", file=sys.stderr)
        return EXIT_USAGE
    if table.message and table.status.value == "failed":
        print(f"error: {table.message}", file=sys.stderr)
        return EXIT_ERROR
    if code not in (EXIT_DONE, EXIT_STOPPED) and code != -signal.SIGINT:
        print(f"error: the sweep's runner ended with status {code}", file=sys.stderr)
        print("\n".join(list(process.stderr_tail)[-5:]), file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(f"wrote {args.json}")
    print(f"results: {folder} (continue a stopped sweep with --resume {folder})")
    if code == EXIT_STOPPED or code == -signal.SIGINT:
        return EXIT_INTERRUPTED
    trials = list(table.trials.values())
    if trials and all(t.status == TrialStatus.FAILED for t in trials):
        print(f"error: every trial failed: {trials[0].message}", file=sys.stderr)
        return EXIT_ERROR
    return 0


def sweep_to_run(args) -> tuple[SweepSpec, Path]:
    """The sweep file (read and checked: ValueError with what is wrong) and the folder."""
    try:
        check_address(args.address)
    except SweepError as exc:
        raise ValueError(str(exc)) from None
    if args.resume is not None:
        folder = args.resume.resolve()
        saved = folder / SPEC_FILE
        if not saved.is_file():
            raise ValueError(f"--resume {args.resume}: no sweep there (it has no {SPEC_FILE})")
        spec = read_spec(saved)
        if args.spec is not None and args.spec.read_bytes() != saved.read_bytes():
            raise ValueError(f"{args.spec} differs from the sweep in {folder} ({SPEC_FILE}): a resumed sweep "
                             "keeps its own file (leave SWEEP.toml out)")
        if args.dir is not None:
            raise ValueError("--dir goes with a new sweep; --resume DIR continues the one in DIR")
        return spec, folder
    if args.spec is None:
        raise ValueError("give a sweep file (SWEEP.toml), or --resume DIR")
    args.spec = find_spec_file(args.spec)
    spec = read_spec(args.spec)
    folder = (args.dir or launch.default_sweep_dir(spec.name)).resolve()
    if folder.exists() and any(folder.iterdir()):
        raise ValueError(f"--dir {folder} is not empty: a sweep needs a folder of its own "
                         f"(or --resume {folder} to continue the one there)")
    return spec, folder


def describe(spec: SweepSpec, address: str | None, folder: Path, resumed: bool) -> str:
    trials = space_size(spec) or spec.trials
    s = spec.scheduler
    stopping = (f"ASHA on the held-out loss by {s.time_attr.value.replace('_', ' ')}" if s.kind == "asha"
                else "no early stopping")
    if is_job_address(address):
        where = f"as a Ray job on the cluster at {address}"
    else:
        where = f"on the Ray cluster at {address}" if address and address != "local" else "on a local Ray"
    budget = f", at most {spec.time_budget_s:g} s" if spec.time_budget_s else ""
    verb = "resuming sweep" if resumed else "sweep"
    return (f"{verb} {spec.name}: {trials} trials ({spec.search.value} search, {stopping}{budget}), "
            f"{spec.cpus_per_trial} CPU each, {where}\nresults: {folder}")


def follow(process: launch.SweepProcess, spec: SweepSpec) -> tuple[SweepTable, int]:
    """Print the runner's events as they come; Ctrl-C stops the sweep, a second one ends it."""
    table = SweepTable()
    interrupts = 0
    while True:
        try:
            event = process.events.get(timeout=0.5)
        except queue.Empty:
            continue
        except KeyboardInterrupt:
            interrupts += 1
            if interrupts == 1:
                print("stopping the sweep (Ctrl-C again to end it at once)...", file=sys.stderr, flush=True)
                process.stop()
            else:
                launch.end_session(process.process.pid)
            continue
        if event is None:
            break
        record = table.apply(event)
        line = event_line(event, record, spec)
        if line:
            print(line, flush=True)
    try:
        return table, process.wait()
    except KeyboardInterrupt:
        launch.end_session(process.process.pid)
        return table, process.wait()


def event_line(event: dict, record: TrialRecord | None, spec: SweepSpec) -> str:
    kind = event["event"]
    if kind == "job":
        return f"submitted Ray job {event.get('job')} to {event.get('address')}"
    if kind == "sweep":
        nodes = event.get("nodes", 1)
        where = event.get("address")
        if event.get("job"):
            where += f", job {event['job']}, its folder there: {event.get('cluster_dir')}"
        return f"Ray: {event.get('cpus')} CPUs on {nodes} node{'s' if nodes != 1 else ''} ({where})"
    if kind == "trial_started" and record is not None:
        return f"trial {record.trial} started: {settings_text(record.settings, spec)}"
    if kind == "trial_ended" and record is not None:
        text = f"trial {record.trial} {record.status.value} at step {record.step:,}/{record.num_steps:,}"
        if math.isfinite(record.best_heldout):
            text += f": held-out {fmt(record.final_heldout)} (best {fmt(record.best_heldout)})"
        if math.isfinite(record.names_per_second):
            text += f", {record.names_per_second:,.0f} names/s"
        if record.message:
            text += f" ({record.message})"
        return text
    if kind == "sweep_ended":
        return f"sweep {event.get('status')} in {event.get('seconds') or 0:.0f} s"
    return ""


def settings_text(settings: dict, spec: SweepSpec) -> str:
    keys = list(spec.space) or list(settings)
    return ", ".join(f"{key} {value_text(settings.get(key))}" for key in keys)


def value_text(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def fmt(value: float) -> str:
    return f"{value:.4f}" if math.isfinite(value) else "-"


def final_table(table: SweepTable, spec: SweepSpec) -> str:
    """The trials by best held-out loss (failed and unscored ones last)."""
    keys = list(spec.space)
    trials = sorted(table.trials.values(), key=lambda t: (not math.isfinite(t.best_heldout), t.best_heldout))
    header = ["trial", "status", "best", "final", "steps", "names/s", *keys]
    rows = [[t.trial, t.status.value, fmt(t.best_heldout), fmt(t.final_heldout), f"{t.step:,}",
             f"{t.names_per_second:,.0f}" if math.isfinite(t.names_per_second) else "-",
             *(value_text(t.settings.get(k)) for k in keys)] for t in trials[:TABLE_ROWS]]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["held-out loss of each trial (best first):",
             "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    if len(trials) > TABLE_ROWS:
        lines.append(f"... and {len(trials) - TABLE_ROWS} more (--json FILE has them all)")
    best = table.best()
    if best is not None:
        lines.append(f"best: trial {best.trial}, held-out {fmt(best.best_heldout)}: "
                     f"{settings_text(best.settings, spec)}")
        if best.checkpoint:
            there = " (on the cluster)" if table.info.get("job") else ""
            lines.append(f"its checkpoint{there}: {best.checkpoint}")
    return "\n".join(lines)

