#!/usr/bin/env bash
# Verify the cupy backend on a machine with an NVIDIA GPU, and measure it.
#
#   bash scripts/gpu_check.sh            # outputs in ./gpu-check-out
#   OUT=/some/dir bash scripts/gpu_check.sh
#
# Steps: record the GPU, driver, CuPy and date; install what is missing (only
# if it does not import already: CuPy through the project's `cuda` extra,
# pytest); run tests/test_cupy_backend.py and tests/test_cupy_gpu.py (the GPU ones need the device);
# run `main.py bench --backends numpy,cupy --presets tiny,s128,gpt2-small`
# (a built-in timing loop stands in if this checkout has no bench command);
# write everything to $OUT and print a summary. Exit status: 0 only if the
# tests and the benchmark both succeeded.
#
# Environment: PYTHON (default python3), OUT (default gpu-check-out),
# BACKENDS (default numpy,cupy), PRESETS (default tiny,s128,gpt2-small).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-gpu-check-out}
BACKENDS=${BACKENDS:-numpy,cupy}
PRESETS=${PRESETS:-tiny,s128,gpt2-small}
mkdir -p "$OUT"
export QT_QPA_PLATFORM=offscreen
status=0

log() { printf '\n== %s\n' "$*" | tee -a "$OUT/summary.txt"; }
: > "$OUT/summary.txt"

log "machine"
{
  echo "date (UTC): $(date -u '+%Y-%m-%d %H:%M:%S')"
  echo "host: $(uname -srm)"
  echo "python: $($PY -c 'import sys; print(sys.version.split()[0])')"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
} | tee -a "$OUT/summary.txt"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.csv" | tee -a "$OUT/summary.txt"
else
  echo "nvidia-smi not found: is the NVIDIA driver installed?" | tee -a "$OUT/summary.txt"
fi

log "dependencies"
if ! $PY -c 'import numpy' 2>/dev/null; then
  $PY -m pip install 'numpy>=1.26'
fi
if $PY -c 'import cupy' 2>/dev/null; then
  echo "CuPy already imports; not reinstalling it" | tee -a "$OUT/summary.txt"
else
  echo "CuPy does not import: installing the project's cuda extra" | tee -a "$OUT/summary.txt"
  $PY -m pip install -e '.[cuda]'
fi
if ! $PY -c 'import pytest' 2>/dev/null; then
  $PY -m pip install 'pytest>=8' || echo "could not install pytest: the tests will not run" | tee -a "$OUT/summary.txt"
fi
$PY - <<'EOF' 2>&1 | tee -a "$OUT/summary.txt" || status=1
import cupy
print("cupy", cupy.__version__, "| CUDA runtime", cupy.cuda.runtime.runtimeGetVersion(),
      "| driver", cupy.cuda.runtime.driverGetVersion())
from engine.backends.cupy_backend import probe
print("probe:", probe())
EOF

log "dataset"
# makemore's names.txt as the package ships it (checked by its sha256)
names=$($PY -c 'from engine.data.corpus import default_dataset_path; print(default_dataset_path())' 2>>"$OUT/dataset.err" || true)
if [ -z "$names" ] || [ ! -f "$names" ]; then
  echo "the packaged names.txt cannot be used (see $OUT/dataset.err): reinstall" | tee -a "$OUT/summary.txt"
  names=""
else
  echo "names.txt: $names" | tee -a "$OUT/summary.txt"
fi

log "tests: python -m pytest -q -rs tests/test_cupy_backend.py tests/test_cupy_gpu.py"
if $PY -c 'import pytest' 2>/dev/null; then
  set +e
  timeout 600 $PY -m pytest -q -rs -p no:cacheprovider -p no:pytestqt tests/test_cupy_backend.py tests/test_cupy_gpu.py \
    --junitxml="$OUT/tests.xml" 2>&1 | tee "$OUT/tests.txt"
  rc=${PIPESTATUS[0]}
  set -e
  tail -n 1 "$OUT/tests.txt" >> "$OUT/summary.txt"
  gpu_skipped=$(grep -c 'needs CuPy and a CUDA device' "$OUT/tests.txt" || true)
  if [ "$gpu_skipped" != 0 ]; then
    echo "WARNING: the gpu tests were skipped (see $OUT/tests.txt): nothing was verified on a GPU" | tee -a "$OUT/summary.txt"
    status=1
  fi
  [ "$rc" = 0 ] || { echo "tests FAILED (exit $rc)" | tee -a "$OUT/summary.txt"; status=1; }
else
  echo "pytest is not available: tests not run" | tee -a "$OUT/summary.txt"; status=1
fi

log "benchmark: backends $BACKENDS, presets $PRESETS"
set +e
if $PY main.py bench --help >"$OUT/bench-help.txt" 2>&1; then
  data_arg=()
  if [ -n "$names" ] && grep -q -- '--data' "$OUT/bench-help.txt"; then data_arg=(--data "$names"); fi
  echo "command: $PY main.py bench --backends $BACKENDS --presets $PRESETS ${data_arg[*]} --json $OUT/bench.json" | tee -a "$OUT/summary.txt"
  timeout 900 $PY main.py bench --backends "$BACKENDS" --presets "$PRESETS" ${data_arg[@]+"${data_arg[@]}"} \
    --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt"
  rc=${PIPESTATUS[0]}
else
  echo "this checkout has no 'main.py bench' (see $OUT/bench-help.txt): using the built-in timing loop" | tee -a "$OUT/summary.txt"
  timeout 900 $PY - "$BACKENDS" "$PRESETS" "$names" "$OUT/bench.json" <<'EOF' 2>&1 | tee "$OUT/bench.txt"
import json, statistics, sys, time
from engine import PRESETS, BackendError, Corpus, open_backend

backends, presets, names, out = sys.argv[1].split(","), sys.argv[2].split(","), sys.argv[3], sys.argv[4]
if not names:
    sys.exit("names.txt is needed for the benchmark: the packaged copy cannot be used")
corpus = Corpus.from_file(names)
rows, failed = [], False
print(f"{'backend':8} {'preset':11} {'params':>12} {'ms/step':>10} {'steps/s':>9} {'steps':>6}")
for preset_name in presets:
    for backend_name in backends:
        preset = PRESETS[preset_name].with_steps(1_000_000)
        try:
            backend = open_backend(backend_name, preset.model, preset.train, corpus)
            backend.train(3)  # warm-up: kernel compilation, caches
        except BackendError as exc:
            print(f"{backend_name:8} {preset_name:11} failed: {exc}", flush=True)
            rows.append(dict(backend=backend_name, preset=preset_name, error=str(exc)))
            failed = True
            continue
        k = 1 if backend_name == "numpy" and preset_name == "gpt2-small" else 10
        per_step, steps, start = [], 0, time.perf_counter()
        while time.perf_counter() - start < 5.0 and steps < 2000:
            t0 = time.perf_counter()
            backend.train(k)  # returns the chunk's losses: the GPU has finished them
            per_step.append((time.perf_counter() - t0) / k)
            steps += k
        ms = statistics.median(per_step) * 1e3
        row = dict(backend=backend_name, preset=preset_name, params=backend.num_params,
                   ms_per_step=ms, steps_per_s=1e3 / ms, steps=steps)
        rows.append(row)
        print(f"{backend_name:8} {preset_name:11} {backend.num_params:12,d} {ms:10.3f} {1e3 / ms:9.1f} {steps:6d}", flush=True)
        backend.close()
json.dump(rows, open(out, "w"), indent=1)
sys.exit(1 if failed else 0)
EOF
  rc=${PIPESTATUS[0]}
fi
set -e
[ "$rc" = 0 ] || { echo "benchmark FAILED (exit $rc)" | tee -a "$OUT/summary.txt"; status=1; }

printf '\n==== gpu_check summary\n'
cat "$OUT/summary.txt"
echo
echo "benchmark table:"
cat "$OUT/bench.txt" 2>/dev/null || true
echo
echo "outputs in $OUT/ (summary.txt, gpu.csv, tests.txt, tests.xml, bench.txt, bench.json); exit $status"
exit "$status"
