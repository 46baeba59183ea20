// SPDX-License-Identifier: MIT
//
// pool.h — the one threading mechanism of the RepOps CPU kernels: a persistent pool of worker
// threads (pool.cpp) and `parallel_items`, which every kernel family uses.
//
//   parallel_items(n_items, threads, [&](int64_t item, int64_t worker) { ... });
//
// runs the callback once for every item in [0, n_items) on up to `threads` OS threads: the
// calling thread (worker 0) and threads - 1 pool workers (worker 1, 2, ...). An item is a unit of
// OUTPUT (a block of output elements, a tile, a node): all of one element's arithmetic is inside
// one item, so which thread runs an item, and how many threads there are, never changes a bit.
// `worker` (< threads) indexes per-thread scratch. Items are claimed from a shared counter, so
// a thread the OS runs late does not hold up the others, and the call returns as soon as every
// item is done (a worker that wakes after that takes nothing).
//
// Rules for a kernel:
//   * choose items of enough work that claiming one (one atomic increment) is noise, and enough
//     items that `threads` threads get several each (load balance on a busy machine);
//   * ask `threads_for` how many threads the work is worth: waking a worker costs a few
//     microseconds, so small calls stay on the calling thread;
//   * never split one output element's k range across items (the bits would depend on it).
// Calls from inside an item (a node of the whole-step plan running its kernel on one thread)
// and calls while another thread holds the pool run on the calling thread alone: no deadlock,
// same bits. Every thread clears FTZ/DAZ and sets round-to-nearest while it runs items
// (FpEnvGuard, simd.h).
#pragma once

#include <cstdint>
#include <type_traits>
#include <vector>

namespace repops_cpu {

using ItemFn = void (*)(void* ctx, int64_t item, int64_t worker);

// The type-erased form of parallel_items (pool.cpp). Exceptions thrown by an item are re-thrown
// on the calling thread after every running item has finished.
void run_items(int64_t n_items, int64_t threads, ItemFn fn, void* ctx);

template <class F>
inline void parallel_items(int64_t n_items, int64_t threads, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run_items(
        n_items, threads,
        [](void* ctx, int64_t item, int64_t worker) { (*static_cast<Fn*>(ctx))(item, worker); },
        const_cast<void*>(static_cast<const void*>(&fn)));
}

// How many of `threads` threads a call of `work` operations in `n_items` items is worth: every
// thread should get at least `min_work_per_thread` (each kernel family states its own unit and
// minimum: a few microseconds of its work), and at least one item.
inline int64_t threads_for(int64_t threads, int64_t n_items, double work, double min_work_per_thread) {
    const double by_work = work / min_work_per_thread;
    int64_t t = threads < n_items ? threads : n_items;
    if (by_work < (double)t) t = (int64_t)by_work;
    return t < 1 ? 1 : t;
}

// The engagement probe: the distinct OS thread ids (Linux tids) that executed at least one item
// since the last reset, in any kernel of this extension. Tests use it to prove that a
// multi-threaded call really ran on several threads.
void probe_reset();
std::vector<int64_t> probe_threads();

// The spread check, for tests: while on, every thread of a call runs at least one item (item w is
// reserved for worker w, and the call waits for late workers to run theirs), so a test at N
// threads knows that N threads worked, whatever the OS scheduler does on a busy machine. The
// items and their code are the same as without it; only who claims which item first differs.
void set_spread_check(bool on);

// Pool workers started so far (they live until the process exits).
int64_t pool_size();

// How many times a pool worker has gone to sleep (futex) for want of a job, over the process:
// tests use it to see that a worker stays awake between calls that follow each other closely.
int64_t pool_sleeps();

// Idle work: while installed, a pool worker w (1 <= w < threads) with no items to run calls
// fn(ctx, w) before it spins or sleeps, again and again while fn returns true; so does the
// calling thread of a parallel_items call (as fn(ctx, 0)) while it waits for workers to finish
// their items. fn runs one small unit of work (tens of microseconds: a worker that is in it
// joins the next parallel_items call only after it, a caller returns only after it) and
// returns false when it has none. The whole-step plan hashes finished outputs
// this way while later nodes run (step_plan.cpp, IdleHashing). Idle work never runs items of a
// parallel_items call and never changes a bit of one. install_idle_work returns false (and
// installs nothing) while another thread's idle work is installed; it starts the workers it
// needs. wake_idle_workers wakes sleeping workers to look for new idle work;
// remove_idle_work returns once no thread is inside fn any more.
// Called from inside an item (all work there runs inline), install_idle_work installs nothing.
// A worker that ran an idle unit counts as engaged (probe_threads). Under the spread check
// (set_spread_check) idle work should leave some of its units to the workers (spread_check_on),
// so a test at N threads knows that a worker did some of it.
using IdleFn = bool (*)(void* ctx, int64_t worker);
bool install_idle_work(IdleFn fn, void* ctx, int64_t threads);
bool spread_check_on();
void wake_idle_workers();
void remove_idle_work();

// Wakes the pool's workers 1 .. threads-1 that exist, with no job for them: a sleeping worker
// takes tens of microseconds to wake on a VM, so a caller that will need it soon (the
// whole-step plan, a level before one that runs on several threads) wakes it ahead, and it is
// spinning when the job comes (it spins a while, then sleeps again). Changes no bit.
void prewake_workers(int64_t threads);

}  // namespace repops_cpu
