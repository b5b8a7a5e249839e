"""Time Backend.sample() (a measurement, not a test).

    python scripts/sampling_speed.py [--data FILE] \
        --runs s128:200 s256:200 gpt2-small:10 [--train 300] [--checkpoints DIR] \
        [--backends numpy futhark-c] [--max-lengths block default 12]

For each preset:count it opens the preset (fresh parameters, or DIR/<preset>.npz
when --checkpoints is given, which --save-checkpoints writes after --train
steps), samples `count` names at temperature 0.5 with seeds 0, 1, 2 and prints
the median wall time, the mean name length and a hash of the names (equal
hashes: equal names, to compare two versions of the engine on one machine, or
two backends). --backends runs each on these backends (the NumPy backend's
parameters are copied into the others); --max-lengths samples with each
max_length: `default` (Backend.sample's), `block` (block_size: every name may
run to it, as before max_length existed) or a number.
"""
from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))  # the engine of the checkout this runs from

import engine  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", help="default: the packaged names.txt")
    parser.add_argument("--runs", nargs="+", default=["s128:200", "s256:200", "gpt2-small:10"])
    parser.add_argument("--train", type=int, default=0, help="steps to train before sampling")
    parser.add_argument("--checkpoints", help="folder of <preset>.npz to sample from")
    parser.add_argument("--save-checkpoints", help="folder to save <preset>.npz into after training")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--prefix", default="")
    parser.add_argument("--backends", nargs="+", default=["numpy"])
    parser.add_argument("--max-lengths", nargs="+", default=["default"])
    args = parser.parse_args()
    corpus = engine.load_corpus(args.data)
    for run in args.runs:
        name, count = run.split(":")
        if args.checkpoints:
            backend = engine.load_checkpoint(Path(args.checkpoints) / f"{name}.npz")
        else:
            preset = engine.PRESETS[name]
            backend = engine.open_backend("numpy", preset.model, preset.train, corpus)
            if args.train:
                backend.train(args.train)
            if args.save_checkpoints:
                Path(args.save_checkpoints).mkdir(parents=True, exist_ok=True)
                backend.save(Path(args.save_checkpoints) / f"{name}.npz")
        if args.seeds < 1:
            continue
        for backend_name in args.backends:
            other = backend
            if backend_name != "numpy":
                other = engine.open_backend(backend_name, backend.model, backend.train_config, backend.corpus)
                other.set_state(backend.get_state(), backend.loss_history)
            for max_length in args.max_lengths:
                limit = {"default": None, "block": backend.model.block_size}.get(max_length)
                time_sampling(other, name, int(count), args, limit if max_length in ("default", "block")
                              else int(max_length), max_length)
            if other is not backend:
                other.close()


def time_sampling(backend, name: str, count: int, args, max_length: int | None, label: str) -> None:
    times, names = [], []
    for seed in range(args.seeds):
        start = time.perf_counter()
        names += backend.sample(count, 0.5, seed, prefix=args.prefix, max_length=max_length)
        times.append(time.perf_counter() - start)
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:12]
    mean_len = sum(map(len, names)) / len(names)
    print(f"{name:>10} {backend.name:>17} max_length {label:>7} step {backend.step:>5} {count:>5} names: "
          f"median {statistics.median(times):8.3f} s (runs {', '.join(f'{t:.3f}' for t in times)}), "
          f"mean length {mean_len:6.1f}, longest {max(map(len, names)):5d}, names {digest}", flush=True)


if __name__ == "__main__":
    main()
