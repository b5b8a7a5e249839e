"""The command line: the window's options checked before Qt starts, and
`microgpt-gui demo` and `microgpt-gui bench` run (`microgpt-gui sweep`: engine.cli.sweep).

Checking and printing only; the parsers are engine.cli.args's, the work is the
engine's (backends, data) and engine.bench.measure's, and the window is gui.app's
(main.py hands it the checked options, so nothing here imports Qt). Every error
a person can fix is one line on stderr and a non-zero exit status: 2 for bad
arguments or data, 1 for what cannot run here or failed; never a usage dump or
a traceback.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from contextlib import contextmanager

import numpy as np

from ..bench import measure as bench
from ..bench import to_loss as bench_loss
from ..bench import report as bench_report
from ..bench import timing as bench_timing
from ..backends import BackendError, TrainingDiverged, open_backend, probe_backend
from ..backends import prebuild
from ..backends import speeds as backend_speeds
from ..backends.choice import AUTO, resolve_auto
from ..config import get_preset
from ..data.split import resolve_holdout
from .args import EXIT_ERROR, EXIT_USAGE, build_parser, window_parser
from .checks import BENCH_FLAGS, DEMO_FLAGS, check_output_file, demo_configs, with_flags
from ..data.corpus import DatasetError, default_dataset_path, load_corpus
from ..futhark import build as futhark_build
from ..training.health import loss_warning
from ..training import protocol as rs
from ..training.loop import LoopSettings, TrainingLoop
from ..training.protocol import RunSpec
from ..training.run_model import Phase
from ..model.sampling import check_max_length, check_prefix_length, check_sample_args

COMMANDS = ("demo", "bench", "sweep")
MAX_STEPS_PER_CALL = 100_000  # demo's train(k) calls: at most this many steps (400 KB of losses)
NO_DISPLAY = "no display: run it on a desktop, or use `microgpt-gui demo` / `bench` headless"


# the window ------------------------------------------------------------------

def has_display(environ=None, platform: str | None = None) -> bool:
    """False where Qt would abort for want of a display (it exits with a misleading
    message about xcb libraries): Linux or BSD with neither DISPLAY nor
    WAYLAND_DISPLAY, and QT_QPA_PLATFORM unset or naming only xcb/wayland."""
    environ = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    if platform in ("darwin", "win32", "cygwin") or environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY"):
        return True
    # "offscreen", "vnc:size=800x600", "wayland;xcb": plugin names before ":", tried in turn
    requested = [name.split(":")[0].strip() for name in environ.get("QT_QPA_PLATFORM", "").split(";")]
    return any(name and not name.startswith(("xcb", "wayland")) for name in requested)


def window_args(argv: list[str], environ=None) -> tuple[argparse.Namespace | None, int]:
    """The window's options, checked before Qt starts: (args, 0) to open the
    window, or (None, exit status) once help, the version or the one-line
    reason it cannot open has been printed."""
    parser = window_parser()
    try:
        args = parser.parse_args(argv)
        if args.quit_when_done and not args.autorun_steps:
            parser.error("--quit-when-done needs --autorun-steps N")
    except SystemExit as exc:  # help, version, or a one-line error
        return None, int(exc.code or 0)
    try:
        if args.backend:
            check_backend(args.backend)
    except ValueError as exc:
        return None, fail(exc, EXIT_USAGE)
    except BackendError as exc:
        return None, fail(exc, EXIT_ERROR)
    if not has_display(environ):
        print(f"error: {NO_DISPLAY}", file=sys.stderr)
        return None, EXIT_ERROR
    return args, 0


def check_backend(name: str) -> None:
    """ValueError for a name that is no backend, BackendError for one that cannot run here;
    "auto" (the fastest backend here, engine.backends.choice) always runs."""
    if name == AUTO:
        return
    try:
        available, reason = probe_backend(name)
    except ValueError as exc:  # "unknown backend 'x'; choose from numpy, ..."
        raise ValueError(f"{exc}, or {AUTO} (the fastest here)") from None
    if not available:
        raise BackendError(cannot_run(name, reason))


def cannot_run(backend: str, reason: str) -> str:
    return f"backend {backend} cannot run here: {reason}"


# demo and bench ----------------------------------------------------------------

def run_cli(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # help, or a one-line error
        return int(exc.code or 0)
    try:
        if args.command == "sweep":
            from .sweep import run_sweep  # imports nothing of Ray: the runner does, in its own process

            return run_sweep(args)
        return run_demo(args) if args.command == "demo" else run_benchmark(args, argv)
    except (ValueError, DatasetError) as exc:
        return fail(exc, EXIT_USAGE)
    except (BackendError, TrainingDiverged, MemoryError, OSError) as exc:
        return fail(exc, EXIT_ERROR)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


@contextmanager
def builds_announced():
    """Print a line when a Futhark library starts building (tens of seconds on
    first use, silent otherwise) and its time when done."""
    remove = futhark_build.add_build_listener(lambda event: print(event.message(), flush=True))
    try:
        yield
    finally:
        remove()


def fail(exc: BaseException, status: int) -> int:
    message = str(exc) or type(exc).__name__
    if isinstance(exc, MemoryError):
        message = "out of memory: try a smaller preset"
    print(f"error: {message}", file=sys.stderr)
    return status


# demo ----------------------------------------------------------------------

def check_prefix(prefix: str, corpus, block_size: int) -> None:
    """The checks Backend.sample makes, before training instead of after it."""
    try:
        corpus.encode(prefix)
    except ValueError as exc:  # "character 'Z' is not in the vocabulary"
        raise ValueError(f"--prefix {prefix!r}: {exc} of this dataset") from None
    check_prefix_length(prefix, block_size, "--prefix")


def warmup_note(train) -> str:
    return f" (warm-up {train.warmup_steps:,} steps)" if train.warmup_steps else ""


def check_holdout(holdout: int | None, corpus) -> None:
    """The holdout check the backend makes, naming the option."""
    try:
        resolve_holdout(holdout, len(corpus))
    except ValueError as exc:
        # "--holdout 5 leaves..." when the user typed it; the default's message as it is
        raise (with_flags(exc, DEMO_FLAGS) if holdout is not None else exc) from None


def run_demo(args) -> int:
    check_backend(args.backend)  # before the dataset: a wrong name fails at once
    model, train = demo_configs(args)
    corpus = load_corpus(args.data)
    check_holdout(args.holdout, corpus)
    check_prefix(args.prefix, corpus, model.block_size)
    if args.max_length is not None:
        check_max_length(args.max_length, model.block_size, len(args.prefix), "--max-length")
    print(f"num docs: {len(corpus)}")
    print(f"vocab size: {corpus.vocab_size}")
    if note := corpus.truncation_note(model.block_size):
        print(f"truncated: {note}")
    backend = args.backend
    if backend == AUTO:
        start = resolve_auto(model, train, corpus.vocab_size)
        for line in start.lines():
            print(line, flush=True)
        backend = start.backend
    report = DemoReport(args, train.num_steps, corpus.vocab_size)
    # the first report line has a held-out loss, as demo always printed
    settings = LoopSettings(end_when_finished=True, chunk_steps=report.next_chunk, delay_first_evaluation=False,
                            opener=open_demo_backend)
    loop = report.loop = TrainingLoop(RunSpec(backend, corpus, model, train), report, settings)
    with builds_announced():
        loop.run()
    if report.error is not None:
        if report.failed_to_open and isinstance(report.error, ValueError):  # the initial weights (--init-std)
            raise with_flags(report.error, DEMO_FLAGS) from None
        raise report.error
    return 0


def open_demo_backend(spec: RunSpec):
    """The training loop's opener for demo: a fresh backend (this module's open_backend)."""
    return open_backend(spec.backend, spec.model, spec.train, spec.corpus)


class DemoReport:
    """demo's printing, from the training loop's events (called in the loop's thread,
    which is the main thread: the loop runs in run_demo). Chunks end at the report
    steps (a tenth of the run), so each line has the loss, and the held-out loss
    when the loop evaluated it there; at the end the summary lines and the samples."""

    def __init__(self, args, steps: int, vocab_size: int):
        self.args, self.steps, self.vocab_size = args, steps, vocab_size
        self.loop: TrainingLoop | None = None
        self.info = None  # the run's RunInfo, once open
        self.report_every = max(1, steps // 10)
        self.pending: tuple[int, float] | None = None  # a report step's (step, loss), printed once its evaluation is known
        self.heldout: list = []  # every held-out point
        self.warned = False
        self.error: BaseException | None = None
        self.failed_to_open = False

    def next_chunk(self, loop) -> int:
        """Up to the next report step, in bounded calls (one call's losses come back as one array)."""
        mark = min(self.steps, (loop.step // self.report_every + 1) * self.report_every)
        return min(mark - loop.step, MAX_STEPS_PER_CALL)

    def __call__(self, event) -> None:
        if isinstance(event, rs.Heldout):
            self.heldout.extend(event.points)
            if self.pending is not None and event.points[-1].step == self.pending[0]:
                self._print_step(event.points[-1].loss)
            return
        if self.pending is not None:  # no evaluation at that step
            self._print_step(None)
        if isinstance(event, rs.Opened):
            self._opened(event.info)
        elif isinstance(event, rs.Losses) and len(event.losses):
            step = event.first_step + len(event.losses)
            if step % self.report_every == 0 or step == self.steps:
                self.pending = (step, float(event.losses[-1]))
        elif isinstance(event, rs.PhaseChanged) and event.phase == Phase.DONE and self.loop.step == self.steps:
            self._finished()
        elif isinstance(event, rs.Samples):
            for i, name in enumerate(event.names, start=1):
                print(f"sample {i:2d}: {name}")
        elif isinstance(event, rs.Status) and self.info is not None:  # e.g. the held-out loss cannot be evaluated
            print(f"warning: {event.text}", file=sys.stderr, flush=True)
        elif isinstance(event, rs.Error) and self.error is None:
            self.error = event.exception or RuntimeError(event.message)
            self.failed_to_open = self.loop.phase == Phase.FAILED

    def epochs(self, step: int) -> float:
        return step * self.info.train.batch_size / self.info.train_docs

    def _opened(self, info) -> None:
        self.info = info
        train, model, args = info.train, info.model, self.args
        print(f"model: preset {args.preset} (n_embd {model.n_embd}, n_layer {model.n_layer}, "
              f"n_head {model.n_head}, block_size {model.block_size}), {info.num_params:,} params, "
              f"backend {info.backend}, lr {train.learning_rate:g}{warmup_note(train)}, "
              f"init_std {train.init_std:g}, seed {train.seed}")
        docs = "document" if train.batch_size == 1 else "documents"
        print(f"batch: {train.batch_size} {docs} per step; held out: {info.holdout:,} documents, "
              f"training on {info.train_docs:,}")
        print(f"expected initial loss: ln({info.vocab_size}) = {math.log(info.vocab_size):.4f}")

    def _print_step(self, heldout: float | None) -> None:
        (step, loss), self.pending = self.pending, None
        print(f"step {step:{len(str(self.steps))}d} / {self.steps} | loss {loss:.4f}"
              + (f" | held-out {heldout:.4f}" if heldout is not None else "")
              + f" | epoch {self.epochs(step):.2f}", flush=True)
        if not self.warned and (warning := loss_warning(self.loop.loss_history(), self.vocab_size)):
            print(f"warning: {warning}", file=sys.stderr, flush=True)  # once, as soon as it shows
            self.warned = True

    def _finished(self) -> None:
        args, loop = self.args, self.loop
        history, elapsed = loop.loss_history(), loop.train_seconds
        names_seen = self.steps * self.info.train.batch_size
        tail = history[-min(50, len(history)):]
        print(f"final loss: {history[-1]:.4f} (mean of the last {len(tail)} steps: {np.mean(tail):.4f}; "
              f"{1e3 * elapsed / self.steps:.3f} ms/step, {names_seen / elapsed:,.0f} names/s)")
        print(self._heldout_line(names_seen))
        print("--- samples ---")
        loop.send(rs.Sample(args.samples, args.temperature, self.info.train.seed, prefix=args.prefix,
                            max_length=args.max_length))

    def _heldout_line(self, names_seen: int) -> str:
        if self.info.holdout == 0:
            return "held-out loss: none (no documents held out: --holdout 0 or a dataset under 10 documents)"
        if not self.heldout:
            return "held-out loss: none (the evaluation failed: see the warning)"
        last, best = self.heldout[-1], min(self.heldout, key=lambda p: p.loss)
        schedule = self.loop.holdout_schedule
        return (f"held-out loss: {last.loss:.4f} over {self.info.holdout:,} documents (best {best.loss:.4f} "
                f"at step {best.step}; {self.epochs(self.steps):.2f} epochs, {names_seen:,} names seen; "
                f"evaluation took {schedule.eval_seconds:.2f} s in {schedule.evaluations} passes)")


# bench ---------------------------------------------------------------------

def record_speeds(results, command: list[str]) -> None:
    """Keep the measured ms/step in the user's data folder, where the automatic
    backend choice (--backend auto) prefers them to the shipped table; a folder
    that cannot be written loses the record, not the run."""
    try:
        count = backend_speeds.record_bench(results, command)
    except OSError as exc:
        print(f"warning: could not record the measurements for --backend {AUTO}: {exc}", file=sys.stderr)
        return
    if count:
        print(f"recorded {count} measurement{'s' if count != 1 else ''} in {backend_speeds.records_path()} "
              f"(--backend {AUTO} chooses by them)")

def build_futhark_first(backends: list[str], presets: list[str], batches: list[int] | None,
                        vocab_size: int) -> None:
    """Build the Futhark libraries the rows will open (prebuild.library_targets: per batch
    size and thread count) here, announced, before the rows' processes need them
    (a row's start-up is not timed, but it would be silent for tens of seconds)."""
    needed = []
    for name in backends:
        for preset_name in presets:
            preset = get_preset(preset_name)
            for size in batches or [preset.train.batch_size]:
                config = bench_timing.with_batch(preset, size)
                for target in prebuild.library_targets(name, config.model, config.train, vocab_size):
                    if target not in needed:
                        needed.append(target)
    for target in needed:
        try:
            with builds_announced():
                futhark_build.build(target)
        except BackendError:
            pass  # its row says why


def run_benchmark(args, argv: list[str]) -> int:
    if args.json:
        check_output_file(args.json, "--json")
    if args.sample_names:
        try:
            check_sample_args(args.sample_names, 0.5, 0)
        except ValueError as exc:
            raise with_flags(exc, BENCH_FLAGS) from None
    backends = args.backends or bench.default_backends()
    status = bench.availability(backends)  # unknown names fail before anything slow
    if all(not available for available, _ in status.values()):
        for name, (_, reason) in status.items():
            print(f"error: {cannot_run(name, reason)}", file=sys.stderr)
        return EXIT_ERROR
    corpus_path = args.data
    if corpus_path is None:
        corpus_path = default_dataset_path()
    corpus = load_corpus(corpus_path)  # a bad file fails here, once, with its own message
    budget = bench.Budget(args.steps, args.seconds, args.warmup, args.sample_names)
    goal = None
    presets = args.presets or (["learn"] if args.to_loss is not None else ["tiny", "s128", "gpt2-small"])
    build_futhark_first([name for name, (available, _) in status.items() if available], presets, args.batch,
                        corpus.vocab_size)
    info = bench_report.machine_info(with_torch=bench.TORCH in backends)
    print(f"machine: {info['cpu']} ({info['cpu_kind']}), {info['cores']} cores; Python {info['python']}, "
          f"NumPy {info['numpy']} ({info['numpy_blas']})" + (f", PyTorch {info['torch']}" if info.get("torch") else ""))
    if args.to_loss is not None:
        goal = bench_loss.ToLoss(args.to_loss, args.time_limit or bench_loss.DEFAULT_TIME_LIMIT_S, args.run_steps)
        print(bench_report.to_loss_legend(goal.target, goal.time_limit))
        header, row_text = bench_report.to_loss_header, bench_report.to_loss_row
    else:
        for flag, value in (("--run-steps", args.run_steps), ("--time-limit", args.time_limit)):
            if value is not None:
                raise ValueError(f"{flag} goes with --to-loss X")
        print(bench_report.legend(budget))
        header, row_text = bench_report.table_header, bench_report.table_row
    print(header(), flush=True)
    results = bench.run_bench(backends, presets, corpus_path, budget, args.rounds,
                              on_row=lambda row: print(row_text(row), flush=True), batches=args.batch,
                              to_loss=goal)
    if note := bench_report.busy_note(results):
        print(note)
    if args.json:
        bench_report.write_json(args.json, results, ["microgpt-gui", *argv], info)
        print(f"wrote {args.json}")
    if goal is None:
        record_speeds(results, ["microgpt-gui", *argv])
    return EXIT_ERROR if any(r.status == "error" for r in results) else 0
