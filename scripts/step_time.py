"""Mean ms per training step of one backend over a fixed sequence of steps:
`python scripts/step_time.py BACKEND PRESET BATCH K STEPS` (after one warm-up
call of K steps, one timed call of STEPS steps; the same steps, so the same
documents and padding, on every run). scripts/kernel_compare.sh runs it for
two checkouts taking turns."""
import sys
import time

from engine.backends import open_backend
from engine.bench.timing import with_batch
from engine.config import get_preset
from engine.data.corpus import load_corpus

name, preset_name, batch, k, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
preset = with_batch(get_preset(preset_name).with_steps(100_000), batch)
backend = open_backend(name, preset.model, preset.train, load_corpus(None))
backend.train(k)
start = time.perf_counter()
backend.train(steps)
ms = (time.perf_counter() - start) / steps * 1e3
print(f"{name} {preset_name} B={batch}: {ms:.4g} ms/step mean over {steps} steps ({1e3 * batch / ms:,.0f} names/s)")
