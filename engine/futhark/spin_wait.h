/* A spin-then-block wait for Futhark's multicore scheduler.

   engine/futhark/build.py compiles the multicore programs' generated C with
   `-include spin_wait.h`, which turns that C's pthread_cond_wait and
   pthread_cond_broadcast into the two functions below; nothing else in the
   generated code changes.

   Why: the scheduler's worker threads sleep on a condition variable as soon as
   a parallel loop ends (the Futhark 0.25.34 runtime never spins), and waking a
   thread whose virtual CPU has gone idle took about 20 us on the machines we
   measured, more than many of a training step's ~100 parallel loops take
   (docs/performance.md, "The workers' wait: spinning before sleeping"). Here a waiting worker
   first spins for up to MICROGPT_FUTHARK_SPIN_US microseconds (default 200; 0:
   the runtime's own wait), watching a counter that every broadcast bumps, and
   only then sleeps, so the next loop of a step finds it awake while a step
   that has ended costs one short spin. The spin yields the CPU between
   looks (sched_yield): where more threads than cores want to run (two
   trainings at once), a spinning worker hands its core to them rather than
   keeping them waiting (without the yield, two s64 trainings at once took
   1.3-1.6 times as long a step as with no spin; with it, 0.91).

   Sound because the runtime calls pthread_cond_wait only in loops that test
   their condition again (`while (queue empty) wait`), and POSIX allows a wait
   to return without a signal: a spin returns as such a spurious wake-up, with
   the mutex held again. A spin watches every broadcast, so a broadcast meant
   for another queue ends it early, and the caller's loop starts another spin
   within the same budget (a call within 5 us of the last one's return counts
   as the same wait). */
#ifndef MICROGPT_SPIN_WAIT_H
#define MICROGPT_SPIN_WAIT_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* the generated C asks for it before its first system header */
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#define MICROGPT_SPIN_DEFAULT_US 200
#define MICROGPT_SAME_WAIT_NS 5000

static _Atomic unsigned long microgpt_broadcasts;

static inline int microgpt_cond_broadcast(pthread_cond_t *cond) {
  atomic_fetch_add_explicit(&microgpt_broadcasts, 1, memory_order_release);
  return pthread_cond_broadcast(cond);
}

static inline long long microgpt_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* MICROGPT_FUTHARK_SPIN_US in ns, read once per process */
static inline long long microgpt_spin_budget_ns(void) {
  static _Atomic long long budget = -1;
  long long ns = atomic_load_explicit(&budget, memory_order_relaxed);
  if (ns < 0) {
    const char *text = getenv("MICROGPT_FUTHARK_SPIN_US");
    long long us = text != NULL && *text != '\0' ? atoll(text) : MICROGPT_SPIN_DEFAULT_US;
    ns = us > 0 ? us * 1000LL : 0;
    atomic_store_explicit(&budget, ns, memory_order_relaxed);
  }
  return ns;
}

static inline void microgpt_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static _Thread_local long long microgpt_wait_started, microgpt_last_return;

static inline int microgpt_cond_wait(pthread_cond_t *cond, pthread_mutex_t *mutex) {
  long long budget = microgpt_spin_budget_ns(), now = microgpt_now_ns();
  if (now - microgpt_last_return > MICROGPT_SAME_WAIT_NS) {
    microgpt_wait_started = now; /* a new wait, not the caller's loop testing again */
  }
  if (now - microgpt_wait_started < budget) {
    unsigned long seen = atomic_load_explicit(&microgpt_broadcasts, memory_order_acquire);
    pthread_mutex_unlock(mutex);
    while (atomic_load_explicit(&microgpt_broadcasts, memory_order_acquire) == seen &&
           microgpt_now_ns() - microgpt_wait_started < budget) {
      for (int i = 0; i < 32 && atomic_load_explicit(&microgpt_broadcasts, memory_order_relaxed) == seen; i++) {
        microgpt_cpu_relax();
      }
      sched_yield(); /* a thread waiting for this CPU runs first (more threads than cores) */
    }
    pthread_mutex_lock(mutex);
    microgpt_last_return = microgpt_now_ns();
    return 0; /* a spurious wake-up: the caller tests its condition again */
  }
  int result = pthread_cond_wait(cond, mutex);
  microgpt_last_return = microgpt_now_ns();
  return result;
}

#define pthread_cond_wait microgpt_cond_wait
#define pthread_cond_broadcast microgpt_cond_broadcast

#endif
