"""Time Backend.sample() on the NumPy backend (a measurement, not a test).

    python scripts/sampling_speed.py [--data FILE] \
        --runs s128:200 s256:200 gpt2-small:10 [--train 300] [--checkpoints DIR]

For each preset:count it opens the preset (fresh parameters, or DIR/<preset>.npz
when --checkpoints is given, which --save-checkpoints writes after --train
steps), samples `count` names at temperature 0.5 with seeds 0, 1, 2 and prints
the median wall time, the mean name length and a hash of the names (equal
hashes: equal names, to compare two versions of the engine on one machine).
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
        times, names = [], []
        for seed in range(args.seeds):
            start = time.perf_counter()
            names += backend.sample(int(count), 0.5, seed, prefix=args.prefix)
            times.append(time.perf_counter() - start)
        digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:12]
        mean_len = sum(map(len, names)) / len(names)
        print(f"{name:>10} step {backend.step:>5} {count:>5} names: median {statistics.median(times):8.3f} s "
              f"(runs {', '.join(f'{t:.3f}' for t in times)}), mean length {mean_len:5.1f}, "
              f"names {digest}", flush=True)


if __name__ == "__main__":
    main()
