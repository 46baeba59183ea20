// SPDX-License-Identifier: MIT
//
// pool.cpp — the persistent worker pool behind parallel_items (pool.h).
//
// One pool per extension (each ISA's extension is its own module with hidden symbols). Workers
// are started on first need, up to the largest thread count asked for, and never stopped; an
// idle worker spins for ~2 ms (the next kernel usually follows within microseconds; after the
// first 50 us it yields its core at every check) and then sleeps on a futex
// (std::atomic::wait), costing nothing.
//
// One job at a time. The protocol, with every atomic sequentially consistent:
//   caller:  fill job_, open_ = true, bump the wanted workers' `seq` (waking sleepers);
//            run items itself; open_ = false; wait until active_ == 0; return.
//   worker:  on a new seq: active_ += 1; if open_ (and it is one of the job's workers) run
//            items; active_ -= 1 (waking the caller at 0).
// A worker increments active_ before it reads open_, and the caller clears open_ before it
// reads active_, so either the worker sees the job closed and touches nothing, or the caller
// waits for it. job_ is written only while open_ is false and active_ is 0, so a worker that
// entered sees one consistent job. A worker woken late for a job that already finished finds
// open_ false, or the next job (which it joins only if its index is below that job's thread
// count: per-thread scratch is sized by it).
//
// Idle work (install_idle_work) follows the same pattern with its own pair: a worker increments
// idle_active_ before it reads idle_fn_, and remove_idle_work clears idle_fn_ before it waits for
// idle_active_ to reach 0, so no thread is inside an idle function once it is removed. A worker
// runs idle work only between jobs (never while it counts in active_), so a caller never waits
// for it; a worker inside an idle unit when a job starts joins that job when the unit ends. A
// caller whose items are all taken runs idle units (as worker 0) while it waits for the workers
// still inside its job, so it returns up to one unit after they finish.

#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "simd.h"

namespace repops_cpu {
namespace {

int64_t os_tid() { return (int64_t)syscall(SYS_gettid); }

inline void cpu_relax() {
#if REPOPS_X86
    _mm_pause();
#endif
}

// ------------------------------------------------------------------ the engagement probe
std::atomic<uint64_t> g_epoch{1};
std::mutex g_probe_mutex;
std::set<int64_t>* g_probe = new std::set<int64_t>;  // leaked: workers may outlive static destructors
thread_local uint64_t t_recorded = 0;
thread_local int64_t t_tid = 0;

void note_engaged() {
    const uint64_t epoch = g_epoch.load(std::memory_order_relaxed);
    if (t_recorded == epoch) return;  // one lock per thread per probe epoch
    if (t_tid == 0) t_tid = os_tid();
    std::lock_guard<std::mutex> lock(g_probe_mutex);
    t_recorded = epoch;
    g_probe->insert(t_tid);
}

// ------------------------------------------------------------------ the pool
thread_local bool t_in_items = false;  // this thread is running an item: nested calls run inline

// How long an idle worker (and a caller waiting for the last items) spins before sleeping.
// VERDE_REPOPS_SPIN_US overrides it (0: sleep at once, e.g. on a machine with more threads than
// cores, where a spinning worker takes time from a working one). A sleeping thread comes back
// slowly on a VM: on the 2-vCPU machine of 2026-12-05 a 1024^3 GEMM at 2 threads, called back to
// back, took 7.7-8.6 ms (medians of 200 calls) with a 50 us spin, against 7.2-7.4 with 1-5 ms:
// its worker, done first at a call's end, slept before the next call came (~1.4 futex sleeps a
// call) and woke late into it. torch's OpenMP workers spin for milliseconds too.
int64_t spin_ns() {
    static const int64_t ns = [] {
        const char* s = std::getenv("VERDE_REPOPS_SPIN_US");
        return s ? (int64_t)std::atoll(s) * 1000 : (int64_t)2000000;
    }();
    return ns;
}

// The first part of a spin only pauses; after it the spinning thread yields its core at every
// check, so a runnable thread that needs the core (another worker, another process: more threads
// than cores) gets it at once, while a core with nothing else to run stays awake.
constexpr int64_t PAUSE_ONLY_NS = 50000;

// Spins until v != old or the spin budget is spent; true if it changed.
template <class T>
bool spin_while_equal(const std::atomic<T>& v, T old) {
    const int64_t budget = spin_ns();
    if (budget <= 0) return v.load() != old;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 1;; i++) {
        if (v.load() != old) return true;
        cpu_relax();
        if ((i & 63) == 0) {
            const int64_t spent =
                std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
            if (spent > budget) return v.load() != old;
            if (spent > PAUSE_ONLY_NS) sched_yield();
        }
    }
}

std::atomic<int64_t> g_sleeps{0};  // pool_sleeps()

struct alignas(64) Slot {
    std::atomic<uint32_t> seq{0};  // bumped by a caller to wake this worker
};

// The spread check (set_spread_check): every thread of a job runs at least one item.
std::atomic<bool> g_spread{false};

struct Job {
    ItemFn fn = nullptr;
    void* ctx = nullptr;
    int64_t n_items = 0, threads = 1;
    std::atomic<int64_t> next{0};
    std::mutex error_mutex;
    std::exception_ptr error;
    // Spread check only: item w is reserved for worker w < threads (taken once, even by a worker
    // that joins twice), and the caller waits until the workers have run theirs.
    bool spread = false;
    std::vector<std::atomic<uint8_t>> taken;
    std::atomic<int32_t> reserved_done{0};
};

// Claims and runs items of `job` until none is left; an exception stops this thread's share and
// is kept for the caller (the remaining items are still claimed, and skipped, so the job ends).
void run_share(Job& job, int64_t worker) {
    FpEnvGuard env;
    const bool outer = t_in_items;
    t_in_items = true;
    bool ran = false;
    auto run_one = [&](int64_t i) {
        try {
            job.fn(job.ctx, i, worker);
        } catch (...) {
            std::lock_guard<std::mutex> lock(job.error_mutex);
            if (!job.error) job.error = std::current_exception();
            job.next.store(job.n_items);
        }
        ran = true;
    };
    if (job.spread && worker < job.threads && job.taken[worker].exchange(1) == 0) {
        run_one(worker);
        if (worker > 0 && job.reserved_done.fetch_add(1) + 2 == job.threads) job.reserved_done.notify_one();
    }
    for (int64_t i = job.next.fetch_add(1); i < job.n_items; i = job.next.fetch_add(1)) run_one(i);
    t_in_items = outer;
    if (ran) note_engaged();
}

// Workers a pool can have (slots are a fixed array: wake_idle_workers reads them while another
// thread's job may be starting workers).
constexpr int64_t MAX_WORKERS = 1024;

class Pool {
  public:
    void run(int64_t n_items, int64_t threads, ItemFn fn, void* ctx) {
        std::unique_lock<std::mutex> dispatch(dispatch_, std::try_to_lock);
        if (!dispatch.owns_lock()) {  // another thread's job holds the pool: run alone
            run_inline(n_items, fn, ctx);
            return;
        }
        threads = std::min<int64_t>(threads, MAX_WORKERS);
        grow(threads - 1);
        job_.fn = fn;
        job_.ctx = ctx;
        job_.n_items = n_items;
        job_.threads = threads;
        job_.error = nullptr;
        job_.spread = g_spread.load();
        if (job_.spread) {
            if ((int64_t)job_.taken.size() < threads) job_.taken = std::vector<std::atomic<uint8_t>>(threads);
            for (int64_t w = 0; w < threads; w++) job_.taken[w].store(0);
            job_.reserved_done.store(0);
        }
        job_.next.store(job_.spread ? threads : 0);
        open_.store(true);
        wake(threads);
        run_share(job_, 0);
        if (job_.spread) {
            for (int32_t d = job_.reserved_done.load(); d + 1 < threads; d = job_.reserved_done.load())
                job_.reserved_done.wait(d);
        }
        open_.store(false);
        // Wait for the workers still inside (their items are in progress, or they are leaving),
        // running units of idle work meanwhile: this thread would only wait, and the idle work
        // has to be done by some thread before the step ends.
        while (active_.load() != 0 && run_idle(0)) {
        }
        wait_for_zero(active_);
        if (job_.error) std::rethrow_exception(job_.error);
    }

    int64_t size() {
        std::lock_guard<std::mutex> lock(dispatch_);
        return n_slots_.load() - 1;
    }

    bool install_idle(IdleFn fn, void* ctx, int64_t threads) {
        if (t_in_items) return false;  // inside another job's item: it holds dispatch_
        std::lock_guard<std::mutex> lock(idle_mutex_);
        if (idle_fn_.load() != nullptr) return false;
        {
            // the workers must exist: under the spread check the installer waits for them
            std::lock_guard<std::mutex> dispatch(dispatch_);
            grow(threads - 1);
        }
        idle_ctx_ = ctx;
        idle_threads_ = threads;
        idle_fn_.store(fn);
        return true;
    }

    void wake_idle() { wake(std::min<int64_t>(idle_threads_.load(), n_slots_.load())); }

    void prewake(int64_t threads) { wake(std::min<int64_t>(threads, n_slots_.load())); }

    void remove_idle() {
        std::lock_guard<std::mutex> lock(idle_mutex_);
        idle_fn_.store(nullptr);
        wait_for_zero(idle_active_);
        idle_threads_.store(0);
    }

    static void run_inline(int64_t n_items, ItemFn fn, void* ctx) {
        Job job;
        job.fn = fn;
        job.ctx = ctx;
        job.n_items = n_items;
        run_share(job, 0);
        if (job.error) std::rethrow_exception(job.error);
    }

  private:
    std::mutex dispatch_;
    std::unique_ptr<Slot> slots_[MAX_WORKERS];  // [0] unused: worker 0 is the caller
    std::atomic<int64_t> n_slots_{1};           // slots_[1, n_slots_) hold started workers
    Job job_;
    std::atomic<bool> open_{false};
    std::atomic<int32_t> active_{0};
    // Idle work (install_idle): idle_ctx_ is written before idle_fn_ is set, under idle_mutex_,
    // which remove_idle holds until no worker is inside the function.
    // On their own cache lines: the job's open_ / active_ are written on every call.
    std::mutex idle_mutex_;
    alignas(64) std::atomic<IdleFn> idle_fn_{nullptr};
    void* idle_ctx_ = nullptr;
    std::atomic<int64_t> idle_threads_{0};
    alignas(64) std::atomic<int32_t> idle_active_{0};

    void grow(int64_t n_workers) {
        n_workers = std::min<int64_t>(n_workers, MAX_WORKERS - 1);
        while (n_slots_.load() <= n_workers) {
            const int64_t w = n_slots_.load();
            slots_[w].reset(new Slot);
            Slot* s = slots_[w].get();
            n_slots_.store(w + 1);
            // Detached: the pool is never destroyed (see pool()), so its workers sleep until exit.
            std::thread([this, s, w] { worker_main(s, w); }).detach();
        }
    }

    // Wakes workers 1 .. n-1 (started ones): a new job, or new idle work.
    void wake(int64_t n) {
        for (int64_t w = 1; w < n; w++) {
            Slot& s = *slots_[w];
            s.seq.fetch_add(1);
            s.seq.notify_one();
        }
    }

    // Returns once count is 0 (spinning a while, then sleeping on it).
    static void wait_for_zero(std::atomic<int32_t>& count) {
        int32_t a = count.load();
        if (a != 0 && spin_while_equal(count, a)) a = count.load();
        while (a != 0) {
            count.wait(a);
            a = count.load();
        }
    }

    // One unit of idle work if there is any for worker w; true if it ran one.
    bool run_idle(int64_t w) {
        // Nothing installed (every plain step): return without writing a line another thread
        // reads. Seeing an idle function here only leads to the protocol's own read below.
        if (idle_fn_.load(std::memory_order_relaxed) == nullptr) return false;
        idle_active_.fetch_add(1);
        bool ran = false;
        const IdleFn fn = idle_fn_.load();
        if (fn != nullptr && w < idle_threads_.load()) ran = fn(idle_ctx_, w);
        if (idle_active_.fetch_sub(1) == 1) idle_active_.notify_all();
        if (ran) note_engaged();
        return ran;
    }

    void worker_main(Slot* s, int64_t w) {
        const std::string name = "repops-w" + std::to_string(w);
        pthread_setname_np(pthread_self(), name.c_str());
        // A fresh slot's seq is 0; reading it here instead would lose a job whose caller bumped
        // it before this thread first ran (the caller then waits in vain under the spread check).
        uint32_t seen = 0;
        for (;;) {
            while (s->seq.load() == seen && run_idle(w)) {
            }
            if (!spin_while_equal(s->seq, seen))
                while (s->seq.load() == seen) {
                    g_sleeps.fetch_add(1, std::memory_order_relaxed);
                    s->seq.wait(seen);
                }
            seen = s->seq.load();
            active_.fetch_add(1);
            if (open_.load() && w < job_.threads) run_share(job_, w);
            if (active_.fetch_sub(1) == 1) active_.notify_one();
        }
    }
};

// The process's pool: created on first use, never destroyed (its detached workers may still be
// asleep in it at exit). A forked child inherits no threads: it starts a fresh pool.
std::atomic<Pool*> g_pool{nullptr};
std::once_flag g_atfork_once;

Pool& pool() {
    Pool* p = g_pool.load();
    if (p != nullptr) return *p;
    std::call_once(g_atfork_once, [] { pthread_atfork(nullptr, nullptr, [] { g_pool.store(nullptr); }); });
    Pool* fresh = new Pool;
    if (!g_pool.compare_exchange_strong(p, fresh)) {
        delete fresh;
        return *p;
    }
    return *fresh;
}

}  // namespace

void run_items(int64_t n_items, int64_t threads, ItemFn fn, void* ctx) {
    if (n_items <= 0) return;
    threads = std::max<int64_t>(1, std::min(threads, n_items));
    if (threads == 1 || t_in_items) {
        Pool::run_inline(n_items, fn, ctx);
        return;
    }
    pool().run(n_items, threads, fn, ctx);
}

void set_spread_check(bool on) { g_spread.store(on); }

bool spread_check_on() { return g_spread.load(); }

void probe_reset() {
    std::lock_guard<std::mutex> lock(g_probe_mutex);
    g_probe->clear();
    g_epoch.fetch_add(1);
}

std::vector<int64_t> probe_threads() {
    std::lock_guard<std::mutex> lock(g_probe_mutex);
    return std::vector<int64_t>(g_probe->begin(), g_probe->end());
}

int64_t pool_size() { return pool().size(); }

int64_t pool_sleeps() { return g_sleeps.load(); }

bool install_idle_work(IdleFn fn, void* ctx, int64_t threads) { return pool().install_idle(fn, ctx, threads); }

void wake_idle_workers() { pool().wake_idle(); }

void remove_idle_work() { pool().remove_idle(); }

void prewake_workers(int64_t threads) {
    if (!t_in_items) pool().prewake(threads);
}

}  // namespace repops_cpu
