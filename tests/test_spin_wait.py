"""engine/futhark/spin_wait.h, the spin-then-block wait compiled into the multicore
programs: a waiting thread misses no wake-up whatever its spin budget, spins while
its budget lasts, and then sleeps (an idle program burns no CPU). A small C program
of a producer and a consumer on one condition variable, compiled with the header as
the multicore builds include it; the futhark-multicore backend itself is checked
idle after training."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from engine.futhark import cc

COMPILER = cc.find_c_compiler()
needs_cc = pytest.mark.skipif(COMPILER is None or COMPILER.family not in ("clang", "gcc") or os.name == "nt",
                              reason="the header is included by clang and gcc builds (-include)")

# "many N": N items produced one at a time (now and then after a short pause), each
# taken by the consumer; "idle MS": nothing for MS milliseconds, then the end. Prints
# the items taken and the consumer thread's CPU seconds.
PROGRAM = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static long pending = 0, taken = 0;
static int done = 0;

static void *consumer(void *out) {
  pthread_mutex_lock(&mutex);
  for (;;) {
    while (pending == 0 && !done) pthread_cond_wait(&cond, &mutex);
    if (pending == 0) break;
    pending--;
    taken++;
  }
  pthread_mutex_unlock(&mutex);
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  *(double *)out = t.tv_sec + t.tv_nsec * 1e-9;
  return NULL;
}

int main(int argc, char **argv) {
  long n = atol(argv[2]);
  double cpu = 0;
  pthread_t thread;
  pthread_create(&thread, NULL, consumer, &cpu);
  if (strcmp(argv[1], "many") == 0) {
    for (long i = 0; i < n; i++) {
      pthread_mutex_lock(&mutex);
      pending++;
      pthread_cond_broadcast(&cond);
      pthread_mutex_unlock(&mutex);
      if (i % 97 == 0) usleep(i % 300);
    }
  } else {
    usleep(n * 1000);
  }
  pthread_mutex_lock(&mutex);
  done = 1;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&mutex);
  pthread_join(thread, NULL);
  printf("%ld %.6f\n", taken, cpu);
  return 0;
}
"""


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    folder = tmp_path_factory.mktemp("spin_wait")
    (folder / "waits.c").write_text(PROGRAM)
    subprocess.run([COMPILER.path, "-O2", "-pthread", "-include", str(cc.SPIN_WAIT_HEADER), "waits.c", "-o", "waits"],
                   cwd=folder, check=True, capture_output=True, timeout=120)
    return folder / "waits"


def run(program, mode: str, n: int, spin_us: int | None) -> tuple[int, float]:
    env = {k: v for k, v in os.environ.items() if k != cc.SPIN_VARIABLE}
    if spin_us is not None:
        env[cc.SPIN_VARIABLE] = str(spin_us)
    out = subprocess.run([str(program), mode, str(n)], env=env, capture_output=True, text=True, timeout=60,
                         check=True).stdout.split()
    return int(out[0]), float(out[1])


@needs_cc
@pytest.mark.parametrize("spin_us", [0, 50, None, 1_000_000])
def test_no_wake_up_is_missed_at_any_spin_budget(program, spin_us):
    # with a budget of a second the consumer never sleeps; with 0 it always does
    assert run(program, "many", 20_000, spin_us)[0] == 20_000


@needs_cc
def test_a_waiting_thread_spins_while_its_budget_lasts_then_sleeps(program):
    # half a second with nothing to do: by default (200 us) the consumer spins once, then sleeps
    taken, cpu = run(program, "idle", 500, None)
    assert taken == 0 and cpu < 0.05
    assert run(program, "idle", 500, 0)[1] < 0.05
    # a budget of a second: it spins all the while (most of the half second, on a loaded machine less)
    assert run(program, "idle", 500, 1_000_000)[1] > 0.1


@needs_cc
@pytest.mark.futhark
def test_futhark_multicore_burns_no_cpu_once_its_step_is_done(futhark_cpu_builds):
    from dataclasses import replace

    from engine import open_backend
    from engine.config import get_preset
    from engine.data.corpus import load_corpus

    preset = get_preset("s64")  # at 16 documents a step, enough work for every core
    backend = open_backend("futhark-multicore", preset.model, replace(preset.train, batch_size=16), load_corpus(None))
    assert backend.runtime_target() == "multicore" or backend.threads() == 1
    backend.train(3)  # the workers ran the step's parallel loops
    before = time.process_time()
    time.sleep(0.5)
    assert time.process_time() - before < 0.05  # no worker left spinning
