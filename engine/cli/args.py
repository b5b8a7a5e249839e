"""The command line's grammar: the window's options and the parsers of
`microgpt-gui demo` and `microgpt-gui bench`, with argument types whose errors
read as one line after the option's name ("--steps must be at least 1, got 0").
engine.cli.commands checks and runs what these parse; nothing here imports Qt.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import math
import re
from pathlib import Path

from ..bench import to_loss as bench_loss
from ..bench import timing as bench_timing
from ..config import DEFAULT_PRESET, FIELD_LIMITS, PRESETS, get_preset, limit_problem
from ..sweep.spec import examples as sweep_examples

EXIT_ERROR = 1  # cannot run here (backend, display), or training failed
EXIT_USAGE = 2  # bad arguments or data (argparse's status too)


def package_version() -> str:
    try:
        return importlib.metadata.version("microgpt-gui")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout that is not installed
        from .. import __version__

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


def setting(key: str):
    """The argument type of a flag that sets engine.config.FIELD_LIMITS[key]: the
    engine's limits, checked as the flag is parsed ("--lr must be at most 1, got 10")."""
    whole = isinstance(FIELD_LIMITS[key][0], int)

    def parse(text: str):
        try:
            value = int(text) if whole else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be a {'whole number' if whole else 'number'}, got {text!r}") from None
        if problem := limit_problem(key, value):
            raise argparse.ArgumentTypeError(problem)
        return value

    parse.__name__ = key.partition(".")[2]  # argparse names the type in some messages
    return parse


batch_size = setting("train.batch_size")


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


def preset_steps() -> str:
    """Each preset's steps, grouped: "learn: 4,000; tiny, s32, ...: 1,000"."""
    groups: dict[int, list[str]] = {}
    for name, preset in PRESETS.items():
        groups.setdefault(preset.train.num_steps, []).append(name)
    return "; ".join(f"{', '.join(names)}: {steps:,}" for steps, names in groups.items())


# the window's options --------------------------------------------------------

HEADLESS_HELP = """\
without a window:
  microgpt-gui demo   train, then print samples in the terminal (microgpt-gui demo --help)
  microgpt-gui bench  measure ms/step, sampling and memory per backend and preset
                      (microgpt-gui bench --help)
  microgpt-gui sweep  a hyperparameter sweep on Ray Tune, here or on a cluster
                      (microgpt-gui sweep --help)

Exit status: 0 done; 1 cannot run here (no display, a backend that cannot
run) or, with --quit-when-done, the run failed; 2 bad arguments."""


def window_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="microgpt-gui", usage="%(prog)s [options]\n       %(prog)s demo [...]\n       %(prog)s bench [...]\n"
              "       %(prog)s sweep [...]",
        description="Train and sample microgpt in a window.", epilog=HEADLESS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.add_argument("--data", metavar="FILE", help="text file, one document per line "
                        "(default: the last one used, else makemore's names.txt, shipped with microgpt-gui)")
    parser.add_argument("--preset", type=preset_name, help=f"model preset to select at start ({', '.join(PRESETS)})")
    parser.add_argument("--backend", help="backend to select at start; auto: the fastest here for the preset "
                        "and batch size (default: the last one used)")
    parser.add_argument("--autorun-steps", type=setting("train.num_steps"), metavar="N",
                        help="start training N steps as soon as the dataset is ready (automation, demos)")
    parser.add_argument("--quit-when-done", action="store_true",
                        help="with --autorun-steps: quit when the run ends (exit status 1 on an error)")
    return parser

# demo and bench --------------------------------------------------------------

def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="microgpt-gui", description="Train and sample microgpt without a window.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="train, then print samples (no window)")
    demo.add_argument("--backend", default="auto",
                      help="engine backend, or auto: the fastest here for the preset and batch size, from "
                           "measured speeds (default auto; a Futhark backend not built yet builds in the "
                           "background while this run trains on one that is, numpy at worst)")
    demo.add_argument("--preset", type=preset_name, default=DEFAULT_PRESET,
                      help=f"model size: {', '.join(PRESETS)} (default {DEFAULT_PRESET})")
    demo.add_argument("--steps", type=setting("train.num_steps"),
                      help=f"training steps (default: the preset's; {preset_steps()})")
    demo.add_argument("--samples", type=positive_int, default=10, help="names to sample (default 10)")
    demo.add_argument("--temperature", type=positive_float, default=0.5, help="sampling temperature (default 0.5)")
    demo.add_argument("--prefix", default="", help="sampled names start with this text (default: none)")
    demo.add_argument("--max-length", type=positive_int, metavar="N",
                      help="sampled names stop at N characters, prefix included (default: the longest "
                           "document plus 5, at most the preset's block_size)")
    demo.add_argument("--data", type=Path, help="text file, one document per line (default: makemore's names.txt)")
    demo.add_argument("--seed", type=setting("train.seed"), help="seed for initialisation and sampling (default: the preset's, 42)")
    demo.add_argument("--lr", type=setting("train.learning_rate"), help="learning rate (default: the preset's)")
    demo.add_argument("--init-std", type=setting("train.init_std"), help="initial weight std (default: the preset's)")
    demo.add_argument("--warmup-steps", type=setting("train.warmup_steps"), metavar="N",
                      help="raise the learning rate linearly over the first N steps "
                           "(default: the preset's, 0 but for gpt2-small)")
    demo.add_argument("--batch", type=batch_size, help="documents per step (default: the preset's; tiny: 1)")
    demo.add_argument("--holdout", type=setting("train.holdout"), help="documents held out for the held-out loss "
                      "(default: min(1000, 10%% of the documents); 0: none)")

    default = bench_timing.Budget()
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
                           help=f"warm-up steps (default: at least 3 and {bench_timing.WARMUP_S:g} s)")
    bench_cmd.add_argument("--sample-names", type=non_negative_int, default=default.sample_names, metavar="N",
                           help=f"time one sample call of N names after the steps (default {default.sample_names}; 0: none)")
    bench_cmd.add_argument("--rounds", type=positive_int, default=1,
                           help="measure each configuration this many times, taking turns; report the median run (default 1)")
    bench_cmd.add_argument("--json", type=Path, help="also write the results to this JSON file")
    bench_cmd.add_argument("--data", type=Path, help="text file to train on (default: makemore's names.txt)")
    bench_cmd.add_argument("--batch", type=batch_list, metavar="B[,B...]",
                           help="documents per step, comma-separated (default: each preset's own, 1 but "
                                "for learn's 32); adds names/s to each row")
    bench_cmd.add_argument("--to-loss", type=positive_float, metavar="X",
                           help="instead of timing steps: train each (backend, preset, batch) until the "
                                "held-out loss is at most X, and report the training seconds")
    bench_cmd.add_argument("--time-limit", type=positive_float,
                           metavar="S", help="with --to-loss: stop after S seconds of training "
                                             f"(default {bench_loss.DEFAULT_TIME_LIMIT_S:g})")
    bench_cmd.add_argument("--run-steps", type=setting("train.num_steps"), metavar="N",
                           help="with --to-loss: the run's steps, over which the learning rate decays "
                                "(default: the preset's)")

    sweep = commands.add_parser(
        "sweep", help="a hyperparameter sweep on Ray Tune (local, or a cluster by --address)",
        description="Run the trials of a sweep file (a search space over the run's fields, a search, ASHA "
                    "early stopping, a budget) on Ray Tune: a local Ray by default, a cluster with --address. "
                    "Prints a line as each trial starts and ends, and a table at the end. Ctrl-C stops the "
                    "sweep; --resume DIR continues it. "
                    "Needs Ray: pip install 'microgpt-gui[sweep]'.")
    sweep.add_argument("spec", nargs="?", type=Path, metavar="SWEEP.toml",
                       help="the sweep file, or a shipped example's name: "
                       f"{', '.join(sweep_examples())} (not needed with --resume)")
    sweep.add_argument("--address", metavar="ADDR",
                       help="a Ray cluster: http://HEAD:8265, its head's job server (the sweep runs there as a "
                            "Ray job; nodes need only microgpt-gui installed), or HOST:PORT, its head's GCS "
                            "(the sweep's driver runs here and joins the cluster: on a node of it), or 'auto' "
                            "on a node of the cluster (default: a local Ray on this machine's CPUs; with "
                            "--resume, where the sweep ran)")
    sweep.add_argument("--resume", type=Path, metavar="DIR", help="continue the stopped sweep in DIR; "
                       "finished trials are kept, unfinished ones go on from their last checkpoint")
    sweep.add_argument("--dir", type=Path, metavar="DIR",
                       help="the new sweep's folder: events, results, checkpoints (default: "
                            "sweeps/NAME-DATE-TIME in microgpt-gui's data folder)")
    sweep.add_argument("--json", type=Path, metavar="FILE",
                       help="also write the results: one record per trial (settings, status, best and final "
                            "held-out loss, steps, names/s)")
    return parser
