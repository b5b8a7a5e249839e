"""`microgpt-gui demo` and `microgpt-gui bench`: the headless commands.

Argument parsing and printing only; the work is the engine's (backends,
data) and engine.bench's. Every error a person can fix is one line on
stderr and a non-zero exit status, never a traceback.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from .backends import BackendError, TrainingDiverged, open_backend
from .config import PRESETS, get_preset
from .data import DatasetError, default_dataset_path, load_corpus

EXIT_ERROR = 1  # training or backend failed
EXIT_USAGE = 2  # bad arguments or data (argparse's status too)


def whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def positive_int(text: str) -> int:
    return whole_number(text, 1)


def non_negative_int(text: str) -> int:
    return whole_number(text, 0)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def name_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of names")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="microgpt-gui", description="Train and sample microgpt.")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="train, then print samples (no window)")
    demo.add_argument("--backend", default="numpy", help="engine backend (default numpy)")
    demo.add_argument("--preset", default="tiny", choices=list(PRESETS), help="model size (default tiny)")
    demo.add_argument("--steps", type=positive_int, default=500, help="training steps (default 500)")
    demo.add_argument("--samples", type=positive_int, default=10, help="names to sample (default 10)")
    demo.add_argument("--temperature", type=positive_float, default=0.5, help="sampling temperature (default 0.5)")
    demo.add_argument("--data", type=Path, help="text file, one document per line (default: makemore's names.txt)")
    demo.add_argument("--seed", type=non_negative_int, help="seed for initialisation and sampling (default: the preset's, 42)")
    demo.add_argument("--lr", type=positive_float, help="learning rate (default: the preset's)")
    demo.add_argument("--init-std", type=positive_float, help="initial weight std (default: the preset's)")

    bench = commands.add_parser("bench", help="measure ms/step and memory per backend and preset")
    bench.add_argument("--backends", type=name_list, help="comma-separated (default: every backend, and torch)")
    bench.add_argument("--presets", type=name_list, default=["tiny", "s128", "gpt2-small"],
                       help="comma-separated (default tiny,s128,gpt2-small)")
    bench.add_argument("--steps", type=positive_int, help="measured steps (default: about 2 s worth)")
    bench.add_argument("--warmup", type=non_negative_int, help="warm-up steps (default: about 0.3 s worth)")
    bench.add_argument("--rounds", type=positive_int, default=1,
                       help="measure each configuration this many times, taking turns; report the median run (default 1)")
    bench.add_argument("--json", type=Path, help="also write the results to this JSON file")
    bench.add_argument("--data", type=Path, help="text file to train on (default: makemore's names.txt)")
    return parser


def run_cli(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse has printed usage and the error
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


def fail(exc: BaseException, status: int) -> int:
    message = str(exc) or type(exc).__name__
    if isinstance(exc, MemoryError):
        message = "out of memory: try a smaller preset"
    print(f"error: {message}", file=sys.stderr)
    return status


def download_progress():
    """A progress callback for the default dataset's first download (on stderr)."""
    shown = set()

    def progress(done: int, total: int) -> None:
        if not shown:
            print("downloading the default dataset (makemore's names.txt; once, then cached)",
                  file=sys.stderr)
        mark = 100 * done // total // 25 * 25 if total else done >> 20  # quarters, or MiB
        if mark not in shown:
            shown.add(mark)
            print(f"  {done / 1024:.0f} KiB" + (f" ({mark}%)" if total else ""), file=sys.stderr)

    return progress


def load_data(path: Path | None):
    return load_corpus(path, download_progress())


# demo ----------------------------------------------------------------------

def run_demo(args) -> int:
    preset = get_preset(args.preset).with_steps(args.steps)
    overrides = {k: v for k, v in (("learning_rate", args.lr), ("init_std", args.init_std),
                                   ("seed", args.seed)) if v is not None}
    train = replace(preset.train, **overrides)
    corpus = load_data(args.data)
    model = preset.model
    print(f"num docs: {len(corpus)}")
    print(f"vocab size: {corpus.vocab_size}")
    if note := corpus.truncation_note(model.block_size):
        print(f"truncated: {note}")
    backend = open_backend(args.backend, model, train, corpus)
    try:
        print(f"model: preset {args.preset} (n_embd {model.n_embd}, n_layer {model.n_layer}, "
              f"n_head {model.n_head}, block_size {model.block_size}), {backend.num_params:,} params, "
              f"backend {args.backend}, lr {train.learning_rate:g}, init_std {train.init_std:g}, seed {train.seed}")
        print(f"expected initial loss: ln({corpus.vocab_size}) = {math.log(corpus.vocab_size):.4f}")
        chunk = max(1, args.steps // 10)
        start = time.perf_counter()
        while not backend.finished:
            losses = backend.train(chunk)
            print(f"step {backend.step:{len(str(args.steps))}d} / {args.steps} | loss {losses[-1]:.4f}")
        elapsed = time.perf_counter() - start
        history = backend.loss_history
        tail = history[-min(50, len(history)):]
        print(f"final loss: {history[-1]:.4f} (mean of the last {len(tail)} steps: {np.mean(tail):.4f}; "
              f"{1e3 * elapsed / args.steps:.3f} ms/step)")
        print("--- samples ---")
        for i, name in enumerate(backend.sample(args.samples, args.temperature, train.seed), start=1):
            print(f"sample {i:2d}: {name}")
    finally:
        backend.close()
    return 0


# bench ---------------------------------------------------------------------

def run_benchmark(args, argv: list[str]) -> int:
    from . import bench

    for name in args.presets:  # unknown names fail before anything slow
        get_preset(name)
    backends = args.backends or bench.default_backends()
    bench.availability(backends)
    corpus_path = args.data
    if corpus_path is None:
        corpus_path = default_dataset_path(download_progress())
    load_corpus(corpus_path)  # a bad file fails here, once, with its own message
    info = bench.machine_info(with_torch=bench.TORCH in backends)
    print(f"machine: {info['cpu']}, {info['cores']} cores; Python {info['python']}, "
          f"NumPy {info['numpy']} ({info['numpy_blas']})" + (f", PyTorch {info['torch']}" if info.get("torch") else ""))
    results = bench.run_bench(backends, args.presets, corpus_path, args.steps, args.warmup,
                              args.rounds, report=lambda line: print(line, flush=True))
    if args.json:
        bench.write_json(args.json, results, ["microgpt-gui", *argv], info)
        print(f"wrote {args.json}")
    return EXIT_ERROR if any(r.status == "error" for r in results) else 0
