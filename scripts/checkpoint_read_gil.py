"""How long a checkpoint read in a background thread keeps the GUI thread from
the GIL (the window reads a checkpoint so: gui/file_actions.py).

    python scripts/checkpoint_read_gil.py [--presets s128,s256] [--reads 8] [--root DIR]

The GUI thread takes the GIL once per call from Qt into Python, hundreds of
times for one event; while another thread runs Python (or a C call that
keeps the GIL), each taking waits. Here the main thread stands in for it:
bursts of --takings takings of the GIL (time.sleep(0) lets go of it and
takes it back), one after the other, while a thread reads a checkpoint, and
as many with nothing else running (idle). For each preset it prints the
reader's CPU time and wall time and the bursts' times: an event that takes
the GIL that often is late by about the difference. The switch interval is
the window's (0.5 ms, gui/sessions.py).

--root DIR measures the engine of another checkout (before/after a change;
alternate runs on a shared machine). The checkpoints (NumPy, names.txt, two
steps) are made in a temporary folder, or read from --folder if there.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_checkpoints(folder: Path, presets: list[str]) -> dict[str, Path]:
    from engine import get_preset, load_corpus, open_backend
    from engine.data.corpus import DEFAULT_DATASET_PATH

    corpus = load_corpus(DEFAULT_DATASET_PATH)
    paths = {}
    for name in presets:
        path = folder / f"{name}.npz"
        if not path.exists():
            preset = get_preset(name)
            backend = open_backend("numpy", preset.model, preset.train, corpus)
            backend.train(2)
            backend.save(path)
            backend.close()
        paths[name] = path
    return paths


def burst(takings: int) -> float:
    t0 = time.perf_counter()
    for _ in range(takings):
        time.sleep(0)
    return 1e3 * (time.perf_counter() - t0)


def measure(path: Path, reads: int, takings: int) -> dict:
    from engine.training.checkpoint import read_checkpoint

    read_checkpoint(path)  # warm: the file in the page cache, the imports done
    cpu, wall, busy, idle = [], [], [], []
    for _ in range(reads):
        done = threading.Event()

        def reader():
            c0, w0 = time.thread_time(), time.perf_counter()
            read_checkpoint(path)
            cpu.append(1e3 * (time.thread_time() - c0))
            wall.append(1e3 * (time.perf_counter() - w0))
            done.set()

        thread = threading.Thread(target=reader, name="read-checkpoint")
        thread.start()
        while not done.is_set():
            busy.append(burst(takings))
        thread.join()
        for _ in range(3):
            idle.append(burst(takings))
        time.sleep(0.05)
    return {"cpu": cpu, "wall": wall, "busy": busy, "idle": idle}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="s128,s256")
    parser.add_argument("--reads", type=int, default=8)
    parser.add_argument("--takings", type=int, default=200, help="GIL takings per burst")
    parser.add_argument("--root", default=str(ROOT), help="the checkout whose engine is measured")
    parser.add_argument("--folder", help="where the checkpoints are made and kept")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(args.root).resolve()))
    import engine

    sys.setswitchinterval(0.0005)  # as the window's (gui/sessions.py)
    folder = Path(args.folder) if args.folder else Path(tempfile.mkdtemp(prefix="microgpt-ckread-"))
    folder.mkdir(parents=True, exist_ok=True)
    paths = make_checkpoints(folder, args.presets.split(","))
    print(f"engine {Path(engine.__file__).parent}; switch interval "
          f"{1e3 * sys.getswitchinterval():g} ms; load {os.getloadavg()[0]:.1f}")
    for name, path in paths.items():
        r = measure(path, args.reads, args.takings)
        print(f"{name:6} ({path.stat().st_size / 2**20:.0f} MiB): reader CPU "
              f"{statistics.median(r['cpu']):.0f} ms (max {max(r['cpu']):.0f}), wall "
              f"{statistics.median(r['wall']):.0f} ms; {args.takings} takings beside it: median "
              f"{statistics.median(r['busy']):.1f} ms, max {max(r['busy']):.1f} ms; idle: median "
              f"{statistics.median(r['idle']):.1f} ms, max {max(r['idle']):.1f} ms")
    if not args.folder:
        for path in paths.values():
            path.unlink()
        folder.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
