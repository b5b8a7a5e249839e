#!/bin/bash
# Two checkouts' kernels side by side: scripts/kernel_compare.sh REF_A REF_B BACKEND PRESET BATCH ROUNDS K STEPS
# Each git ref's engine/ and kernels/ go to a folder of their own; the two take turns,
# ROUNDS times, each run a fresh process timing STEPS steps (scripts/step_time.py).
# With $FUTHARK set, a ref whose kernels/generated/ is out of step with its sources is
# compiled from them; builds go to $MICROGPT_GUI_CACHE_DIR (default the user cache).
set -e
A=$1; B=$2; BACKEND=$3; PRESET=$4; BATCH=$5; ROUNDS=$6; K=$7; STEPS=$8
ROOT=$(git rev-parse --show-toplevel)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
for ref in "$A" "$B"; do
  mkdir -p "$WORK/$ref"
  git -C "$ROOT" archive "$ref" engine kernels | tar -x -C "$WORK/$ref"
done
for _ in $(seq "$ROUNDS"); do
  for ref in "$A" "$B"; do
    echo "$ref $(cd "$WORK/$ref" && PYTHONPATH="$WORK/$ref" python "$ROOT/scripts/step_time.py" \
                   "$BACKEND" "$PRESET" "$BATCH" "$K" "$STEPS")"
  done
done
