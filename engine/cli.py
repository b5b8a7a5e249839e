"""The command line: the window's options, `microgpt-gui demo` and `microgpt-gui bench`.

Parsing, checking and printing only; the work is the engine's (backends,
data) and engine.bench's, and the window is gui.app's (main.py hands it the
checked options, so nothing here imports Qt). Every error a person can fix
is one line on stderr and a non-zero exit status: 2 for bad arguments or
data, 1 for what cannot run here or failed; never a usage dump or a traceback.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import math
import os
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from . import bench, bench_loss, bench_report
from .backends import BackendError, TrainingDiverged, open_backend, probe_backend
from .config import MAX_BATCH_SIZE, MAX_NUM_STEPS, PRESETS, get_preset
from .batches import resolve_holdout
from .data import DatasetError, default_dataset_path, load_corpus
from .futhark import build as futhark_build
from .cli_checks import BENCH_FLAGS, DEMO_FLAGS, check_output_file, demo_configs, with_flags
from .learning import HoldoutSchedule, evaluate_if_due
from .sampling import check_max_length, check_prefix_length, check_sample_args
from .health import loss_warning

EXIT_ERROR = 1  # cannot run here (backend, display), or training failed
EXIT_USAGE = 2  # bad arguments or data (argparse's status too)
COMMANDS = ("demo", "bench")
MAX_STEPS_PER_CALL = 100_000  # demo's train(k) calls: at most this many steps (400 KB of losses)
NO_DISPLAY = "no display: run it on a desktop, or use `microgpt-gui demo` / `bench` headless"


def package_version() -> str:
    try:
        return importlib.metadata.version("microgpt-gui")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that is not installed
        from . import __version__

        return __version__


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line, `error: --steps must be at least 1, got 0`,
    with status 2 (argparse prints the usage first)."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"error: {one_line(message)}\n")


def one_line(message: str) -> str:
    """argparse's "argument -s/--steps: must be ..." as "--steps must be ..."."""
    match = re.fullmatch(r"argument (\S+): (.*)", message, re.DOTALL)
    if match:
        name, detail = match.groups()
        name = name.split("/")[-1]
        message = f"{name} {detail}" if detail.startswith("must ") else f"{name}: {detail}"
    return " ".join(message.split())


# argument types: their messages follow the option's name ("--steps must be ...")

def whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    return whole_number(text, 1)


def non_negative_int(text: str) -> int:
    return whole_number(text, 0)


def step_count(text: str) -> int:
    """A non-negative number of steps, at most TrainConfig's cap."""
    value = whole_number(text, 0)
    if value > MAX_NUM_STEPS:
        raise argparse.ArgumentTypeError(f"must be at most 10^12, got {value:,}")
    return value


def number(text: str, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise argparse.ArgumentTypeError(f"must be a {'positive' if positive else 'non-negative'} "
                                         f"number, got {text}")
    return value


def positive_float(text: str) -> float:
    return number(text, positive=True)


def non_negative_float(text: str) -> float:
    return number(text, positive=False)


def name_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("must be a comma-separated list of names")
    return names


def batch_size(text: str) -> int:
    value = positive_int(text)
    if value > MAX_BATCH_SIZE:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_BATCH_SIZE:,}, got {value:,}")
    return value


def batch_list(text: str) -> list[int]:
    return [batch_size(name) for name in name_list(text)]


def preset_name(text: str) -> str:
    try:
        get_preset(text)
    except ValueError as exc:  # "unknown preset 'x'; choose from ..."
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def preset_list(text: str) -> list[str]:
    return [preset_name(name) for name in name_list(text)]


# the window's options --------------------------------------------------------

HEADLESS_HELP = """\
without a window:
  microgpt-gui demo   train, then print samples in the terminal (microgpt-gui demo --help)
  microgpt-gui bench  measure ms/step, sampling and memory per backend and preset
                      (microgpt-gui bench --help)

Exit status: 0 done; 1 cannot run here (no display, a backend that cannot
run) or, with --quit-when-done, the run failed; 2 bad arguments."""


def window_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="microgpt-gui", usage="%(prog)s [options]\n       %(prog)s demo [...]\n       %(prog)s bench [...]",
        description="Train and sample microgpt in a window.", epilog=HEADLESS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.add_argument("--data", metavar="FILE", help="text file, one document per line "
                        "(default: the last one used, else makemore's names.txt, shipped with microgpt-gui)")
    parser.add_argument("--preset", type=preset_name, help=f"model preset to select at start ({', '.join(PRESETS)})")
    parser.add_argument("--backend", help="backend to select at start (default: the last one used)")
    parser.add_argument("--autorun-steps", type=positive_int, metavar="N",
                        help="start training N steps as soon as the dataset is ready (automation, demos)")
    parser.add_argument("--quit-when-done", action="store_true",
                        help="with --autorun-steps: quit when the run ends (exit status 1 on an error)")
    return parser


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
    """ValueError for a name that is no backend, BackendError for one that cannot run here."""
    available, reason = probe_backend(name)
    if not available:
        raise BackendError(cannot_run(name, reason))


def cannot_run(backend: str, reason: str) -> str:
    return f"backend {backend} cannot run here: {reason}"


# demo and bench ---------------------------------------------------------------

def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="microgpt-gui", description="Train and sample microgpt without a window.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="train, then print samples (no window)")
    demo.add_argument("--backend", default="numpy", help="engine backend (default numpy)")
    demo.add_argument("--preset", type=preset_name, default="tiny", help=f"model size: {', '.join(PRESETS)} (default tiny)")
    demo.add_argument("--steps", type=positive_int, default=500, help="training steps (default 500)")
    demo.add_argument("--samples", type=positive_int, default=10, help="names to sample (default 10)")
    demo.add_argument("--temperature", type=positive_float, default=0.5, help="sampling temperature (default 0.5)")
    demo.add_argument("--prefix", default="", help="sampled names start with this text (default: none)")
    demo.add_argument("--max-length", type=positive_int, metavar="N",
                      help="sampled names stop at N characters, prefix included (default: the longest "
                           "document plus 5, at most the preset's block_size)")
    demo.add_argument("--data", type=Path, help="text file, one document per line (default: makemore's names.txt)")
    demo.add_argument("--seed", type=non_negative_int, help="seed for initialisation and sampling (default: the preset's, 42)")
    demo.add_argument("--lr", type=positive_float, help="learning rate (default: the preset's)")
    demo.add_argument("--init-std", type=positive_float, help="initial weight std (default: the preset's)")
    demo.add_argument("--warmup-steps", type=step_count, metavar="N",
                      help="raise the learning rate linearly over the first N steps "
                           "(default: the preset's, 0 but for gpt2-small)")
    demo.add_argument("--batch", type=batch_size, help="documents per step (default: the preset's; tiny: 1)")
    demo.add_argument("--holdout", type=non_negative_int, help="documents held out for the held-out loss "
                      "(default: min(1000, 10%% of the documents); 0: none)")

    default = bench.Budget()
    bench_cmd = commands.add_parser(
        "bench", help="measure ms/step, sampling time and memory per backend and preset",
        description="Each (backend, preset) runs in a fresh process: start-up and warm-up (not timed), "
                    "then training steps timed for at least --steps steps and at least --seconds seconds, "
                    "whichever takes longer, then one timed sample call. Start-up, warm-up and "
                    "sampling add to a row's time: under a second at tiny, tens of seconds at gpt2-small.")
    bench_cmd.add_argument("--backends", type=name_list, help="comma-separated (default: every backend, and torch)")
    bench_cmd.add_argument("--presets", type=preset_list,
                           help="comma-separated (default tiny,s128,gpt2-small; with --to-loss: learn)")
    bench_cmd.add_argument("--steps", type=positive_int, default=default.steps,
                           help=f"measure at least this many steps (default {default.steps})")
    bench_cmd.add_argument("--seconds", type=non_negative_float, default=default.seconds,
                           help=f"...and at least this many seconds (default {default.seconds:g}; 0: steps only)")
    bench_cmd.add_argument("--warmup", type=non_negative_int,
                           help=f"warm-up steps (default: at least 3 and {bench.WARMUP_S:g} s)")
    bench_cmd.add_argument("--sample-names", type=non_negative_int, default=default.sample_names, metavar="N",
                           help=f"time one sample call of N names after the steps (default {default.sample_names}; 0: none)")
    bench_cmd.add_argument("--rounds", type=positive_int, default=1,
                           help="measure each configuration this many times, taking turns; report the median run (default 1)")
    bench_cmd.add_argument("--json", type=Path, help="also write the results to this JSON file")
    bench_cmd.add_argument("--data", type=Path, help="text file to train on (default: makemore's names.txt)")
    bench_cmd.add_argument("--batch", type=batch_list, default=[1], metavar="B[,B...]",
                           help="documents per step, comma-separated (default 1); adds names/s to each row")
    bench_cmd.add_argument("--to-loss", type=positive_float, metavar="X",
                           help="instead of timing steps: train each (backend, preset, batch) until the "
                                "held-out loss is at most X, and report the training seconds")
    bench_cmd.add_argument("--time-limit", type=positive_float,
                           metavar="S", help="with --to-loss: stop after S seconds of training "
                                             f"(default {bench_loss.DEFAULT_TIME_LIMIT_S:g})")
    bench_cmd.add_argument("--run-steps", type=positive_int, metavar="N",
                           help="with --to-loss: the run's steps, over which the learning rate decays "
                                "(default: the preset's)")
    return parser


def run_cli(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # help, or a one-line error
        return int(exc.code or 0)
    try:
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
        raise ValueError(f"--{exc}" if holdout is not None else str(exc)) from None  # "--holdout 5 leaves..."


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
    try:
        with builds_announced():
            backend = open_backend(args.backend, model, train, corpus)
    except ValueError as exc:  # the initial weights (--init-std)
        raise with_flags(exc, DEMO_FLAGS) from None
    try:
        print(f"model: preset {args.preset} (n_embd {model.n_embd}, n_layer {model.n_layer}, "
              f"n_head {model.n_head}, block_size {model.block_size}), {backend.num_params:,} params, "
              f"backend {args.backend}, lr {train.learning_rate:g}{warmup_note(train)}, "
              f"init_std {train.init_std:g}, seed {train.seed}")
        docs = "document" if train.batch_size == 1 else "documents"
        print(f"batch: {train.batch_size} {docs} per step; held out: {backend.holdout:,} documents, "
              f"training on {backend.split.n_train:,}")
        print(f"expected initial loss: ln({corpus.vocab_size}) = {math.log(corpus.vocab_size):.4f}")
        report_every = max(1, args.steps // 10)
        warned = False
        schedule = HoldoutSchedule()
        elapsed = 0.0
        while not backend.finished:
            mark = min(args.steps, (backend.step // report_every + 1) * report_every)
            # bounded calls: one call's losses come back as one array
            start = time.perf_counter()
            losses = backend.train(min(mark - backend.step, MAX_STEPS_PER_CALL))
            took = time.perf_counter() - start
            elapsed += took
            schedule.trained(took)
            if backend.step < mark:
                continue
            heldout = evaluate_if_due(backend, schedule, backend.finished)
            print(f"step {backend.step:{len(str(args.steps))}d} / {args.steps} | loss {losses[-1]:.4f}"
                  + (f" | held-out {heldout:.4f}" if heldout is not None else "")
                  + f" | epoch {backend.epochs:.2f}", flush=True)
            if not warned and (warning := loss_warning(backend.loss_history, corpus.vocab_size)):
                print(f"warning: {warning}", file=sys.stderr, flush=True)  # once, as soon as it shows
                warned = True
        history = backend.loss_history
        tail = history[-min(50, len(history)):]
        print(f"final loss: {history[-1]:.4f} (mean of the last {len(tail)} steps: {np.mean(tail):.4f}; "
              f"{1e3 * elapsed / args.steps:.3f} ms/step, {backend.names_seen / elapsed:,.0f} names/s)")
        print(final_heldout_line(backend, schedule))
        print("--- samples ---")
        names = backend.sample(args.samples, args.temperature, train.seed, prefix=args.prefix,
                               max_length=args.max_length)
        for i, name in enumerate(names, start=1):
            print(f"sample {i:2d}: {name}")
    finally:
        backend.close()
    return 0


def final_heldout_line(backend, schedule: HoldoutSchedule) -> str:
    if backend.holdout == 0:
        return "held-out loss: none (no documents held out: --holdout 0 or a dataset under 10 documents)"
    history = backend.heldout_history
    if not history or history[-1].step != backend.step:
        evaluate_if_due(backend, schedule, backend.finished)
        history = backend.heldout_history
    best = min(history, key=lambda p: p.loss)
    return (f"held-out loss: {history[-1].loss:.4f} over {backend.holdout:,} documents (best {best.loss:.4f} "
            f"at step {best.step}; {backend.epochs:.2f} epochs, {backend.names_seen:,} names seen; "
            f"evaluation took {schedule.eval_seconds:.2f} s in {schedule.evaluations} passes)")


# bench ---------------------------------------------------------------------

def build_futhark_first(backends: list[str]) -> None:
    """Build the Futhark libraries here, announced, before the rows' processes need them
    (a row's start-up is not timed, but it would be silent for tens of seconds)."""
    for name in backends:
        target = name.removeprefix("futhark-")
        if name.startswith("futhark-") and target in futhark_build.TARGETS:
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
    load_corpus(corpus_path)  # a bad file fails here, once, with its own message
    build_futhark_first([name for name, (available, _) in status.items() if available])
    info = bench_report.machine_info(with_torch=bench.TORCH in backends)
    print(f"machine: {info['cpu']}, {info['cores']} cores; Python {info['python']}, "
          f"NumPy {info['numpy']} ({info['numpy_blas']})" + (f", PyTorch {info['torch']}" if info.get("torch") else ""))
    budget = bench.Budget(args.steps, args.seconds, args.warmup, args.sample_names)
    goal = None
    presets = args.presets or (["learn"] if args.to_loss is not None else ["tiny", "s128", "gpt2-small"])
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
    return EXIT_ERROR if any(r.status == "error" for r in results) else 0
