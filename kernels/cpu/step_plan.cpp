// SPDX-License-Identifier: MIT
//
// step_plan.cpp — StepPlan: all nodes of one training step in one call (built once per graph by
// verde_chain/repops/backends/cpu/step.py, StepKernel). Every node output lives in one arena
// tensor per run (recycled.h), at offsets fixed when the plan is built; node inputs are
// (source, offset, numel) references, the source a graph.structure.SourceKind (generated
// RP_SOURCE_*): this step's arena (outputs of earlier nodes), the previous step's arena (state
// tensors) or the batch. Each node runs the same kernel as the per-node path (GEMM, fold,
// binary, scatter, compiled map, or the interpreter), so the bits are the same; what disappears
// is the per-node Python, pybind and allocation overhead, which dominated nodes of a few
// thousand elements. Every address a node can touch is checked when it is added.
//
// Memory (docs/training.md, "The step's memory"): the plan's arena addresses [0, arena_numel)
// are the returned arena (the outputs the caller keeps: the state and what it asked for);
// addresses [arena_numel, arena_numel + work_numel) are the WORK region, the step's other
// outputs, whose slots the layout shares by liveness (backends/native.py ArenaLayout). The work
// region lives in the scratch buffer after the window ring, so it is reused from run to run and
// never returned. A committed run (hash_outputs, then run(..., roots)) hashes every node output
// before any later node overwrites its slot: before a level that writes over an output not yet
// hashed, every pending output is hashed (the keccak tree's items, on the run's
// threads through the kernels' persistent pool: hash_nodes), and the rest at the end. At two or
// more threads, pool workers hash finished outputs in their idle time while later levels run,
// and those points only drain what is left (IdleHashing).
//
// Threads: the nodes are grouped into levels when they are added (a node's level is one more
// than that of the last earlier node it must follow: it reads that node's output, or writes
// where that node reads or writes); the nodes of one level are independent. A level whose
// nodes are each at most a thread's share of its work runs them all side by side, one thread
// each (a node is an item of parallel_items; the kernel it calls runs on that thread alone);
// any other level runs its big nodes one after another, each on all threads (its kernel splits
// its output), then its small nodes side by side (run_level). "Big" is the kernels' own rule: a
// node whose work is worth two threads by its family's minimum (kernels.h). Nodes never share an
// output element, so the bits are those of running the nodes in order on one thread.
//
// Floating nodes: in a plain run at two or more threads, a small node that could run many levels
// later than its own (an optimizer update: ready once the backward has made its gradient,
// needed by nothing in the step) leaves its level and is run by a pool worker with nothing else
// to do, on that thread alone, as soon as what it depends on is done; the calling thread runs
// whatever a worker has not taken at the node's deadline, the first level with a node that
// must follow it (FloatingRun). On the tiny Llama at 2 threads, where the Adam updates are half
// the step and the backward's small nodes leave a thread idle, a plain step took 0.83-0.96 of its
// time with every node in its level (paired in one process, docs/benchmarks.md); on resnet18,
// the tiny transformer and the digits CNN 0.98-1.00. A committed run keeps every node in its
// level (its hashing runs in the idle time instead).

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels.h"
#include "pool.h"
#include "recycled.h"
#include "tensors.h"
#include "window_plan.h"

namespace repops_cpu {
namespace {

enum NodeKind : int64_t { NK_PROGRAM = 0, NK_DOT = 1, NK_FOLD = 2, NK_BINARY = 3, NK_JIT = 4, NK_SCATTER = 5, NK_ROWDOT = 6 };
// The window nodes (window_plan.h): windowed GEMM, gather into scratch, permuting copy (+ epilogue),
// max-pool backward.
enum WindowNodeKind : int64_t { NK_WGEMM = 16, NK_GATHER = 17, NK_PERMUTE = 18, NK_POOLBACK = 19 };
// A buffer of the plan alone, after the SourceKind buffers: scratch for the window nodes'
// intermediates (a gathered operand, a GEMM result before its permutation), one per run (recycled.h).
constexpr int64_t RP_SCRATCH = RP_SOURCE_BATCH + 1;
// The in-plan hashing's unit (hash_nodes): a leaf is 128 elements (keccak_tree.c LEAF_ELEMS,
// ~0.3 us of one core's hashing here); a pool thread is woken for at least HASH_MIN_LEAVES
// leaves (~20 us, several wake-ups' worth).
constexpr size_t HASH_MIN_LEAVES = 64;

// The keccak tree's work taken apart (keccak_tree.c keccak_roots_api_t: roots_begin, roots_items,
// roots_threads, roots_run_item, roots_end, LEAF_ELEMS), reached through one address
// (hash_outputs): the plan runs the items itself, at its hash points on its pool (pool_roots)
// and in the pool's idle time (IdleHashing).
struct RootsApi {
    void* (*begin)(const uint32_t* const*, const size_t*, size_t, uint8_t*, int, size_t, int, int*);
    int64_t (*items)(const void*);
    int (*threads)(const void*);
    void (*run_item)(void*, int64_t);
    int (*end)(void*);
    size_t leaf_elems;
};

// Roots of n >= 1 tensors into out[32 i] on up to `threads` threads of the kernels' persistent
// pool (the hash points, hash_nodes; and pool_tensor_roots for tests of it on any sizes):
// every worker that ran an item is recorded in `workers` (bit w: worker w; the hash_workers
// probe). The tree sizes its items for the threads (each given HASH_MIN_LEAVES leaves at least)
// and says how many of them are worth waking.
void pool_roots(const RootsApi* api, const uint32_t* const* elems, const size_t* numels, size_t n, uint8_t* out,
                int64_t threads, std::atomic<uint64_t>& workers) {
    int rc = 0;
    void* work = api->begin(elems, numels, n, out, (int)threads, HASH_MIN_LEAVES, 0, &rc);
    TORCH_CHECK(work != nullptr, "roots_begin failed (", rc, ")");
    const int64_t n_items = api->items(work);
    const int64_t t = std::max<int64_t>(1, std::min<int64_t>(api->threads(work), n_items));
    try {
        parallel_items(n_items, t, [&](int64_t i, int64_t worker) {
            api->run_item(work, i);
            workers.fetch_or(uint64_t(1) << (worker & 63), std::memory_order_relaxed);
        });
    } catch (...) {
        api->end(work);  // frees the work; its roots are never read
        throw;
    }
    rc = api->end(work);
    TORCH_CHECK(rc == 0, "roots_end failed (", rc, ")");
}

// Idle hashing's items hold at most 2^IDLE_ITEM_LOG leaves (~60 us of one core's hashing here:
// a pool worker inside one joins the next parallel call up to that much late), and a batch is
// handed out once it holds IDLE_BATCH_LEAVES leaves (its roots_begin and fold cost a few
// microseconds). resnet18's committed step at 2 threads, items of 2^4 / 2^6 / 2^8 / 2^10 /
// 2^12 leaves against hashing at the hash points only, in one process each: 1.06-1.08x /
// 0.94-0.98x / 0.88-0.93x (0.92-0.95x in a second run) / 0.93-0.94x / 0.90-0.99x of its time
// (smaller items: more folding, less overlap; larger: later joins).
constexpr int IDLE_ITEM_LOG = 8;
constexpr size_t IDLE_BATCH_LEAVES = 256;

// Floating nodes (StepPlan::FloatingRun): a node floats in a plain run at two or more threads
// when it could run at least FLOAT_MIN_SLACK levels later than its own level (its slack: an
// optimizer update, whose results nothing in the step reads, floats from the backward node
// that made its gradient to the end) and is worth at most FLOAT_MAX_WORTH threads (a few
// hundred microseconds of one core: a pool worker inside one joins the next parallel call up
// to that much late, and the calling thread waits for it at its deadline).
constexpr int64_t FLOAT_MIN_SLACK = 8;
constexpr double FLOAT_MAX_WORTH = 32.0;

// Hashing in the pool's idle time, for one committed run at two or more threads (StepPlan::run).
// The outputs of finished levels are handed out in batches (add, publish: one roots_begin call
// each, cut into small items); threads with no items of their own take them (pool.h idle
// work) while the following levels run: a pool worker while the calling thread runs a node too
// small to split, either thread when it has finished its share of a level or of a kernel's
// items and waits for the other. Before a level that overwrites outputs not yet
// hashed, drain() makes sure of those: it runs the remaining items of the batches up to the last
// that holds one of them on the calling thread, beside the woken workers, and waits until those
// batches are folded (later batches stay for idle time); at the end, of all. The thread that
// finishes a batch's last item folds it (roots_end) and writes its roots. An output is read
// only between the end of the level that wrote it and the drain before the level that
// overwrites it, and a root depends only on its tensor's elements, so who hashes what, and
// when, never changes a bit. Under the pool's spread check each batch's first item is left to a
// worker (the drain waits for it), so a test knows that a worker hashed.
class IdleHashing {
  public:
    // n_rows: the run's root rows (each output is added once, so at most that many batches).
    IdleHashing(const RootsApi* api, size_t n_rows, uint8_t* roots, int64_t threads, std::atomic<uint64_t>& workers)
        : api_(api), roots_(roots), threads_(threads), workers_(workers),
          batches_(new std::unique_ptr<Batch>[n_rows + 1]), capacity_(n_rows + 1), batch_of_(n_rows, -1),
          spread_(spread_check_on()) {
        installed_ = install_idle_work(&IdleHashing::idle_fn, this, threads);
    }
    ~IdleHashing() {
        if (installed_) remove_idle_work();
        // A run that threw: fold (and so free) what was handed out; its roots are never read.
        for (size_t b = 0; b < published_.load(); b++)
            if (batches_[b]->work) api_->end(batches_[b]->work);
    }
    IdleHashing(const IdleHashing&) = delete;
    IdleHashing& operator=(const IdleHashing&) = delete;

    bool installed() const { return installed_; }

    // Output `numel` elements at `elems`, its root to row `row` of the run's roots: hashed
    // with the next batch handed out.
    void add(const uint32_t* elems, size_t numel, int64_t row) {
        batch_of_[row] = (int64_t)published_.load();  // the index the pending batch will get
        pending_.elems.push_back(elems);
        pending_.numels.push_back(numel);
        pending_.rows.push_back(row);
        pending_leaves_ += (numel + api_->leaf_elems - 1) / api_->leaf_elems;
        if (pending_leaves_ >= IDLE_BATCH_LEAVES) publish();
    }

    // Makes sure the outputs of root rows `rows` (all: nullptr) are hashed: hands out what they
    // are pending in, runs on this thread (beside the woken workers) what nobody has taken of
    // the batches up to the last that holds one of them, and waits until those are folded;
    // later batches stay for idle time. Returns the wall seconds it took.
    double drain(const std::vector<int64_t>* rows = nullptr) {
        const auto t0 = std::chrono::steady_clock::now();
        int64_t need = (int64_t)published_.load() + 1;  // batches [0, need) must be folded
        if (rows) {
            need = 0;
            for (int64_t r : *rows) {
                TORCH_CHECK(batch_of_[r] >= 0, "idle hashing: output row ", r, " overwritten before it was made");
                need = std::max(need, batch_of_[r] + 1);
            }
        }
        if (need > (int64_t)published_.load()) publish();  // one of them is pending
        need = std::min(need, (int64_t)published_.load());
        draining_.store(true);
        wake_idle_workers();
        while (run_one(0, (size_t)need)) {
        }
        for (int64_t b = 0; b < need; b++)
            for (bool e = batches_[b]->ended.load(); !e; e = batches_[b]->ended.load()) batches_[b]->ended.wait(false);
        draining_.store(false);
        const int rc = rc_.load();
        TORCH_CHECK(rc == 0, "roots_end failed (", rc, ")");
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }

    // Items run while levels ran (not in a drain: by a worker, or by a caller of parallel_items
    // waiting for one), and all items.
    int64_t items_overlapped() const { return overlapped_.load(); }
    int64_t items_total() const { return total_; }

  private:
    struct Batch {
        std::vector<const uint32_t*> elems;
        std::vector<size_t> numels;
        std::vector<int64_t> rows;
        std::vector<uint8_t> out;  // roots_end writes here; the last item's thread copies to rows
        void* work = nullptr;
        int64_t n_items = 0;
        std::atomic<int64_t> next{0}, done{0};
        std::atomic<bool> ended{false};  // folded, roots written
        // Spread check: item 0 is left to a pool worker (next starts at 1), which takes it once.
        bool reserved = false;
        std::atomic<bool> reserved_taken{false};
    };

    const RootsApi* api_;
    uint8_t* roots_;
    int64_t threads_;
    std::atomic<uint64_t>& workers_;
    std::unique_ptr<std::unique_ptr<Batch>[]> batches_;
    size_t capacity_;
    bool installed_ = false;
    Batch pending_;
    size_t pending_leaves_ = 0;
    std::vector<int64_t> batch_of_;  // per root row: the batch its output was added to (-1: not yet)
    // batches_[0, published_) are handed out; [first_open_, ...) may have unclaimed items.
    std::atomic<size_t> published_{0}, first_open_{0};
    std::atomic<bool> draining_{false};
    std::atomic<int64_t> overlapped_{0};
    std::atomic<int> rc_{0};
    int64_t total_ = 0;
    const bool spread_;  // the pool's spread check was on when the run began (Batch::reserved)

    static bool idle_fn(void* ctx, int64_t worker) { return static_cast<IdleHashing*>(ctx)->run_one(worker); }

    void publish() {
        if (pending_.elems.empty()) return;
        const size_t b = published_.load();
        TORCH_CHECK(b < capacity_, "idle hashing: more batches than outputs");
        auto batch = std::make_unique<Batch>();
        batch->elems.swap(pending_.elems);
        batch->numels.swap(pending_.numels);
        batch->rows.swap(pending_.rows);
        pending_leaves_ = 0;
        batch->out.resize(32 * batch->elems.size());
        int rc = 0;
        batch->work = api_->begin(batch->elems.data(), batch->numels.data(), batch->elems.size(), batch->out.data(),
                                  (int)threads_, HASH_MIN_LEAVES, IDLE_ITEM_LOG, &rc);
        TORCH_CHECK(batch->work != nullptr, "roots_begin failed (", rc, ")");
        batch->n_items = api_->items(batch->work);
        batch->reserved = spread_;
        batch->next.store(spread_ ? 1 : 0);
        total_ += batch->n_items;
        batches_[b] = std::move(batch);
        published_.store(b + 1);  // the batch is complete before any thread can see it
        wake_idle_workers();
    }

    // Claims and runs one item of the oldest batch with items left (among the first `upto`);
    // false if there is none.
    bool run_one(int64_t worker, size_t upto = SIZE_MAX) {
        const size_t n = std::min(published_.load(), upto);
        for (size_t b = first_open_.load(); b < n; b++) {
            Batch& batch = *batches_[b];
            const bool mine = batch.reserved && worker != 0 && !batch.reserved_taken.exchange(true);
            const int64_t i = mine ? 0 : batch.next.fetch_add(1);
            if (i >= batch.n_items) {
                size_t open = b;
                if (!batch.reserved || batch.reserved_taken.load()) first_open_.compare_exchange_strong(open, b + 1);
                continue;
            }
            if (!draining_.load()) overlapped_.fetch_add(1);
            api_->run_item(batch.work, i);
            workers_.fetch_or(uint64_t(1) << (worker & 63), std::memory_order_relaxed);
            if (batch.done.fetch_add(1) + 1 == batch.n_items) finish(batch);
            return true;
        }
        return false;
    }

    // The batch's every item has run: fold it and write its roots to their rows.
    void finish(Batch& batch) {
        const int rc = api_->end(batch.work);
        batch.work = nullptr;
        if (rc != 0) rc_.store(rc);
        for (size_t j = 0; j < batch.rows.size(); j++)
            std::copy(batch.out.begin() + 32 * j, batch.out.begin() + 32 * (j + 1), roots_ + 32 * batch.rows[j]);
        batch.ended.store(true);
        batch.ended.notify_all();
    }
};

struct Ref {
    int64_t buf, offset, numel;
};

struct PlanNode {
    int64_t kind = NK_PROGRAM;
    int64_t out_buf = RP_SOURCE_NODE_OUTPUT, out_offset = 0, out_numel = 0;
    std::vector<Ref> ins;
    bool has_prog = false;  // PROGRAM: the whole program; DOT/FOLD: an epilogue, run with r0 preset
    Prog prog;
    int64_t op = 0;  // FOLD: reduce op; BINARY: binary op
    // DOT: input slots, geometry (pointers set per run), per-batch element offsets
    int64_t sa = 0, sb = 0;
    GemmArgs g{};
    std::vector<int64_t> aoff, boff;
    // FOLD: out[r] = fold_k X[xoff + r*sr + k*sk]
    int64_t slot = 0, R = 0, Kr = 0, sr = 0, sk = 0, xoff = 0;
    // ROWDOT (with slot/xoff/sr/sk for A): B[boff2 + r*srb + k*skb] in input slot slot_b
    int64_t slot_b = 0, boff2 = 0, srb = 0, skb = 0;
    // JIT: a compiled map over n = out_numel elements
    MapFn fn = nullptr;
    int64_t work = 0;
    // DOT/FOLD/ROWDOT/PERMUTE: the epilogue as a compiled map (jit.py epilogue_map), run in place after
    // the kernel instead of the interpreter; input 0 is the node's output, input t + 1 input t.
    MapFn epi_fn = nullptr;
    int64_t epi_work = 0;
    // Window nodes: tables and geometry (window_plan.h)
    std::shared_ptr<const WindowParts> win;
    // How many threads the node's work is worth (work / its family's minimum per thread).
    double threads_worth = 0;
};

// The nodes of one level (see the top): big ones in order, small ones by decreasing work (the
// longest start first, so the threads finish together); all of them by decreasing work, and the
// level's total and largest work (run_level).
struct Level {
    std::vector<int64_t> big, small, all;  // small and all: the largest worth first
    double small_worth = 0, worth = 0, max_worth = 0;

    // Files nodes[index]. A node of two threads' worth or more is big (split across the
    // threads); the smaller ones run side by side, the largest first.
    void add(int64_t index, const std::vector<PlanNode>& nodes) {
        const double node_worth = nodes[index].threads_worth;
        const auto by_work = [&](std::vector<int64_t>& list) {
            list.insert(std::find_if(list.begin(), list.end(),
                                     [&](int64_t j) { return nodes[j].threads_worth < node_worth; }),
                        index);
        };
        by_work(all);
        worth += node_worth;
        max_worth = std::max(max_worth, node_worth);
        if (node_worth >= 2.0) {
            big.push_back(index);
        } else {
            by_work(small);
            small_worth += node_worth;
        }
    }
};

class StepPlan {
  public:
    StepPlan(int64_t arena_numel, int64_t prev_numel, int64_t batch_numel, int64_t mc, int64_t kc, int64_t nc,
             int64_t scratch_numel, int64_t work_numel)
        : size_{arena_numel, prev_numel, batch_numel, scratch_numel + work_numel},
          ring_(scratch_numel),
          work_(work_numel),
          mc_(round_up(std::max<int64_t>(1, mc), GEMM_MR)),
          kc_(std::max<int64_t>(1, kc)),
          nc_(round_up(std::max<int64_t>(1, nc), GEMM_NR)) {
        for (int64_t s : size_) TORCH_CHECK(s >= 0, "buffer sizes must be >= 0");
        TORCH_CHECK(scratch_numel >= 0 && work_numel >= 0, "buffer sizes must be >= 0");
    }

    void add_program(const torch::Tensor& refs, const torch::Tensor& maps, std::vector<int64_t> out_shape, int64_t K,
                     const torch::Tensor& pro, const torch::Tensor& body, const torch::Tensor& epi,
                     int64_t out_offset) {
        PlanNode nd = base_node(NK_PROGRAM, refs, maps, out_shape, K, pro, body, epi, out_offset);
        nd.has_prog = true;
        add_node(std::move(nd));
    }

    // A dot node: GEMM (batch = aoff.numel()) then, if the epilogue is not empty, the epilogue
    // (epi_fn: as a compiled map, set_epilogue_map; 0: on the interpreter). So for fold and rowdot.
    void add_dot(const torch::Tensor& refs, const torch::Tensor& maps, std::vector<int64_t> out_shape, int64_t K,
                 const torch::Tensor& pro, const torch::Tensor& body, const torch::Tensor& epi, int64_t out_offset,
                 int64_t sa, int64_t sb, int64_t M, int64_t N, const torch::Tensor& aoff, int64_t sai, int64_t sak,
                 const torch::Tensor& boff, int64_t sbk, int64_t sbj, const torch::Tensor& epi_lin, int64_t epi_fn,
                 int64_t epi_work) {
        PlanNode nd = base_node(NK_DOT, refs, maps, out_shape, K, pro, body, epi, out_offset);
        nd.has_prog = epi.size(0) > 0;
        set_epilogue_map(nd, epi_lin, epi_fn, epi_work);
        const int64_t n_in = (int64_t)nd.ins.size();
        TORCH_CHECK(sa >= 0 && sa < n_in && sb >= 0 && sb < n_in, "dot input slot out of range");
        nd.sa = sa;
        nd.sb = sb;
        nd.aoff = offsets(aoff);
        nd.boff = offsets(boff);
        const int64_t nb = (int64_t)nd.aoff.size();
        TORCH_CHECK((int64_t)nd.boff.size() == nb && nb >= 1 && M >= 1 && N >= 1, "bad dot geometry");
        TORCH_CHECK(nb * M * N == nd.out_numel, "dot output ", nb, "x", M, "x", N, " != ", nd.out_numel);
        check_box(nd.aoff, {sai, sak}, {M, K}, nd.ins[sa].numel, "dot A");
        check_box(nd.boff, {sbk, sbj}, {K, N}, nd.ins[sb].numel, "dot B");
        nd.g.sai = sai;
        nd.g.sak = sak;
        nd.g.sbk = sbk;
        nd.g.sbj = sbj;
        nd.g.batch = nb;
        nd.g.M = M;
        nd.g.N = N;
        nd.g.K = K;
        add_node(std::move(nd));
    }

    // A fold node: out[r] = fold over k of X[xoff + r*sr + k*sk] (r < numel, k < K), then the
    // epilogue if not empty.
    void add_fold(const torch::Tensor& refs, const torch::Tensor& maps, std::vector<int64_t> out_shape, int64_t K,
                  const torch::Tensor& pro, const torch::Tensor& body, const torch::Tensor& epi, int64_t out_offset,
                  int64_t slot, int64_t op, int64_t xoff, int64_t sr, int64_t sk, const torch::Tensor& epi_lin,
                  int64_t epi_fn, int64_t epi_work) {
        PlanNode nd = base_node(NK_FOLD, refs, maps, out_shape, K, pro, body, epi, out_offset);
        nd.has_prog = epi.size(0) > 0;
        set_epilogue_map(nd, epi_lin, epi_fn, epi_work);
        TORCH_CHECK(slot >= 0 && slot < (int64_t)nd.ins.size(), "fold input slot out of range");
        TORCH_CHECK(op >= 0 && op < RP_REDUCE_COUNT, "unknown reduce op ", op);
        check_box({xoff}, {sr, sk}, {nd.out_numel, K}, nd.ins[slot].numel, "fold X");
        nd.slot = slot;
        nd.op = op;
        nd.xoff = xoff;
        nd.R = nd.out_numel;
        nd.Kr = K;
        nd.sr = sr;
        nd.sk = sk;
        add_node(std::move(nd));
    }

    // A row dot node (norm.cpp): out[r] = dot chain over k of A[aoff + r*sra + k*ska] and
    // B[boff + r*srb + k*skb], then the epilogue if not empty.
    void add_rowdot(const torch::Tensor& refs, const torch::Tensor& maps, std::vector<int64_t> out_shape, int64_t K,
                    const torch::Tensor& pro, const torch::Tensor& body, const torch::Tensor& epi, int64_t out_offset,
                    int64_t sa, int64_t aoff, int64_t sra, int64_t ska, int64_t sb, int64_t boff, int64_t srb,
                    int64_t skb, const torch::Tensor& epi_lin, int64_t epi_fn, int64_t epi_work) {
        PlanNode nd = base_node(NK_ROWDOT, refs, maps, out_shape, K, pro, body, epi, out_offset);
        nd.has_prog = epi.size(0) > 0;
        set_epilogue_map(nd, epi_lin, epi_fn, epi_work);
        const int64_t n_in = (int64_t)nd.ins.size();
        TORCH_CHECK(sa >= 0 && sa < n_in && sb >= 0 && sb < n_in, "rowdot input slot out of range");
        check_box({aoff}, {sra, ska}, {nd.out_numel, K}, nd.ins[sa].numel, "rowdot A");
        check_box({boff}, {srb, skb}, {nd.out_numel, K}, nd.ins[sb].numel, "rowdot B");
        nd.slot = sa;
        nd.xoff = aoff;
        nd.sr = sra;
        nd.sk = ska;
        nd.slot_b = sb;
        nd.boff2 = boff;
        nd.srb = srb;
        nd.skb = skb;
        nd.R = nd.out_numel;
        nd.Kr = K;
        add_node(std::move(nd));
    }

    // out[e] = a[e] (op) b[e], both inputs exactly out_numel long.
    void add_binary(const torch::Tensor& refs, int64_t out_offset, int64_t numel, int64_t op) {
        PlanNode nd;
        nd.kind = NK_BINARY;
        nd.ins = read_refs(refs);
        set_out(nd, out_offset, numel);
        TORCH_CHECK(op >= 0 && op < RP_BIN_COUNT, "unknown binary op ", op);
        TORCH_CHECK(nd.ins.size() == 2 && nd.ins[0].numel == numel && nd.ins[1].numel == numel,
                    "binary inputs must have the output's size");
        nd.op = op;
        add_node(std::move(nd));
    }

    // A scatter-add node (spec.scatter_add, see scatter_rows_into): refs (g of P*R, idx of P).
    void add_scatter(const torch::Tensor& refs, int64_t out_offset, int64_t P, int64_t R, int64_t V) {
        PlanNode nd;
        nd.kind = NK_SCATTER;
        nd.ins = read_refs(refs);
        TORCH_CHECK(P >= 1 && R >= 1 && V >= 1 && V <= (1 << 24), "bad scatter geometry");
        set_out(nd, out_offset, V * R);
        TORCH_CHECK(nd.ins.size() == 2 && nd.ins[0].numel == P * R && nd.ins[1].numel == P,
                    "scatter inputs must be g (P*R elements) and idx (P)");
        nd.R = R;
        nd.Kr = P;
        add_node(std::move(nd));
    }

    // A compiled map (backends/cpu/jit.py jit_source): input t is read at lin[t] = (offset, s, q, p)
    // as offset + ((e / q) % p) * s for e < numel. fn_addr is the map's address (the library stays loaded
    // by functools.cache in Python; the plan's owner keeps a reference too).
    void add_jit(const torch::Tensor& refs, const torch::Tensor& lin, int64_t out_offset, int64_t numel,
                 int64_t fn_addr, int64_t work) {
        PlanNode nd;
        nd.kind = NK_JIT;
        nd.ins = read_refs(refs);
        set_out(nd, out_offset, numel);
        TORCH_CHECK(fn_addr != 0, "null map function");
        const std::vector<int64_t> rows = int64_rows(lin, (int64_t)nd.ins.size(), 4, "lin");
        for (size_t t = 0; t < nd.ins.size(); t++) check_map_inputs(rows, t, numel, nd.ins[t].numel);
        nd.fn = reinterpret_cast<MapFn>(fn_addr);
        nd.work = work;
        add_node(std::move(nd));
    }

    // ---- window nodes (window_plan.h); out_buf: RP_SOURCE_NODE_OUTPUT or RP_SCRATCH

    // C (nb, M, N) of the windowed operands a and b (refs: their two inputs), K ascending; in
    // the split layout if split is [n_inner, batch stride, outer stride] (windowed_gemm).
    void add_window_gemm(const torch::Tensor& refs, const torch::Tensor& a_rows, const torch::Tensor& a_ks,
                         const torch::Tensor& a_wins, int64_t a_fill, const torch::Tensor& b_rows,
                         const torch::Tensor& b_ks, const torch::Tensor& b_wins, int64_t b_fill, int64_t nb, int64_t M,
                         int64_t N, int64_t K, int64_t out_buf, int64_t out_offset, std::vector<int64_t> split) {
        PlanNode nd;
        nd.kind = NK_WGEMM;
        nd.ins = read_refs(refs);
        TORCH_CHECK(nd.ins.size() == 2, "a windowed GEMM reads two inputs");
        TORCH_CHECK(nb >= 1 && M >= 1 && N >= 1 && K >= 1, "bad windowed GEMM geometry");
        auto w = std::make_shared<WindowParts>();
        w->a = read_win_tables(a_rows, a_ks, a_wins, a_fill, K, "operand a");
        w->b = read_win_tables(b_rows, b_ks, b_wins, b_fill, K, "operand b");
        TORCH_CHECK(w->a.R == nb * M && w->b.R == nb * N, "windowed GEMM tables have ", w->a.R, " / ", w->b.R,
                    " rows, expected ", nb * M, " / ", nb * N);
        w->nb = nb;
        w->M = M;
        w->N = N;
        w->K = K;
        w->split = column_split(split, nb, M, N);
        nd.win = std::move(w);
        set_out(nd, out_offset, nb * M * N, out_buf);
        add_node(std::move(nd));
    }

    // Every element (R, K) of the windowed operand over its one input (refs), raw bits; (K, R) if kmajor.
    void add_window_gather(const torch::Tensor& refs, const torch::Tensor& rows, const torch::Tensor& ks,
                           const torch::Tensor& wins, int64_t fill, int64_t K, int64_t out_buf, int64_t out_offset,
                           bool kmajor) {
        PlanNode nd;
        nd.kind = NK_GATHER;
        nd.ins = read_refs(refs);
        TORCH_CHECK(nd.ins.size() == 1 && K >= 1, "a gather reads one input");
        auto w = std::make_shared<WindowParts>();
        w->a = read_win_tables(rows, ks, wins, fill, K, "operand");
        w->K = K;
        w->kmajor = kmajor;
        set_out(nd, out_offset, w->a.R * K, out_buf);
        nd.win = std::move(w);
        add_node(std::move(nd));
    }

    // The last input (refs) copied into out_shape's C order, element (c_0, ...) from
    // sum c_d * src_strides[d]; then the epilogue (if any) with r0 preset to it, the program
    // over all inputs (maps: one row per input), or as a compiled map (epi_fn, set_epilogue_map).
    void add_permute(const torch::Tensor& refs, const torch::Tensor& maps, std::vector<int64_t> out_shape, int64_t K,
                     const torch::Tensor& pro, const torch::Tensor& body, const torch::Tensor& epi,
                     int64_t out_offset, std::vector<int64_t> src_strides, const torch::Tensor& epi_lin,
                     int64_t epi_fn, int64_t epi_work) {
        PlanNode nd = base_node(NK_PERMUTE, refs, maps, out_shape, K, pro, body, epi, out_offset);
        nd.has_prog = epi.size(0) > 0;
        set_epilogue_map(nd, epi_lin, epi_fn, epi_work);
        TORCH_CHECK(src_strides.size() == out_shape.size(), "one source stride per output axis");
        std::vector<int64_t> ones(out_shape.size(), 1);
        check_box({0}, src_strides, out_shape.empty() ? ones : out_shape, nd.ins.back().numel, "permute source");
        auto w = std::make_shared<WindowParts>();
        w->shape = std::move(out_shape);
        w->src_strides = std::move(src_strides);
        nd.win = std::move(w);
        add_node(std::move(nd));
    }

    // max_pool_backward in scatter form (read_pool_backward): refs (arg, dy).
    void add_pool_backward(const torch::Tensor& refs, const torch::Tensor& axes, const torch::Tensor& plane_off,
                           int64_t K, int64_t out_offset) {
        PlanNode nd;
        nd.kind = NK_POOLBACK;
        nd.ins = read_refs(refs);
        TORCH_CHECK(nd.ins.size() == 2, "a max-pool backward reads two inputs");
        auto w = std::make_shared<WindowParts>();
        w->pool = read_pool_backward(axes, plane_off, K, nd.ins[0].numel, nd.ins[1].numel);
        w->K = K;
        set_out(nd, out_offset, w->pool.numel());
        nd.win = std::move(w);
        add_node(std::move(nd));
    }

    int64_t size() const { return (int64_t)nodes_.size(); }

    // Committed runs: plan node i's output is hashed into row rows[i] of run's `roots` (-1: not
    // hashed; a scratch-ring intermediate) with the keccak tree at api_addr (its
    // keccak_roots_api(), kernels/keccak_tree.c), on hash_threads threads (the hashing's own
    // count, as when the executor hashes an arena): at the hash points, and at two or more
    // threads also in the pool's idle time (IdleHashing; set_idle_hashing(false): only at the
    // hash points). Call after the last node is added: it fixes where the hashing goes between
    // the levels (see the top).
    void hash_outputs(const std::vector<int64_t>& rows, int64_t hash_threads, int64_t api_addr) {
        TORCH_CHECK(api_addr != 0, "null keccak_roots_api table");
        TORCH_CHECK(hash_threads >= 1, "hash_threads must be >= 1");
        TORCH_CHECK(rows.size() == nodes_.size(), "one root row per plan node");
        int64_t n_rows = 0;
        for (size_t i = 0; i < rows.size(); i++) {
            if (rows[i] < 0) continue;
            n_rows++;
            const PlanNode& nd = nodes_[i];
            // SAFETY: a ring intermediate is overwritten by later window nodes without a flush.
            TORCH_CHECK(nd.out_buf == RP_SOURCE_NODE_OUTPUT || nd.out_offset >= ring_,
                        "plan node ", i, " writes the scratch ring: its output is not a node output");
        }
        std::vector<char> seen(n_rows, 0);
        for (int64_t r : rows) {
            if (r < 0) continue;
            TORCH_CHECK(r < n_rows && !seen[r], "root rows must be 0..n-1, each once");
            seen[r] = 1;
        }
        hash_before_.assign(levels_.size(), {});
        overwritten_.assign(levels_.size(), {});
        std::vector<int64_t> pending, unhashed;  // since the last hash point; not yet overwritten
        for (size_t lv = 0; lv < levels_.size(); lv++) {
            const Level& level = levels_[lv];
            bool overwrites = false;
            for (const auto* part : {&level.big, &level.small})
                for (int64_t i : *part)
                    for (int64_t p : pending) overwrites = overwrites || same_place(nodes_[i], nodes_[p]);
            if (overwrites) hash_before_[lv].swap(pending);
            std::vector<int64_t> keep;
            for (int64_t p : unhashed) {
                bool hit = false;
                for (const auto* part : {&level.big, &level.small})
                    for (int64_t i : *part) hit = hit || same_place(nodes_[i], nodes_[p]);
                if (hit)
                    overwritten_[lv].push_back(rows[p]);
                else
                    keep.push_back(p);
            }
            unhashed.swap(keep);
            for (const auto* part : {&level.big, &level.small})
                for (int64_t i : *part)
                    if (rows[i] >= 0) {
                        pending.push_back(i);
                        unhashed.push_back(i);
                    }
        }
        hash_last_ = std::move(pending);
        roots_api_ = reinterpret_cast<const RootsApi*>(api_addr);
        root_row_ = rows;
        n_rows_ = n_rows;
        hash_threads_ = hash_threads;
    }

    // The schedule as run() follows it, for tests that check it against the nodes' buffers:
    // (levels: per level, its node indices in run order, big ones first; io: per node, its
    // output then its inputs as (buffer, offset, numel)).
    std::pair<std::vector<std::vector<int64_t>>, std::vector<std::vector<std::array<int64_t, 3>>>> schedule() const {
        std::vector<std::vector<int64_t>> order;
        for (const Level& lv : levels_) {
            order.push_back(lv.big);
            order.back().insert(order.back().end(), lv.small.begin(), lv.small.end());
        }
        std::vector<std::vector<std::array<int64_t, 3>>> io;
        for (const PlanNode& nd : nodes_) {
            io.push_back({{nd.out_buf, nd.out_offset, nd.out_numel}});
            for (const Ref& r : nd.ins) io.back().push_back({r.buf, r.offset, r.numel});
        }
        return {order, io};
    }

    // Per plan node: (kind, level, threads' worth), for profiles (scripts/bench_threads.py
    // --families) that file node and level times under families. Kinds: NodeKind, WindowNodeKind.
    std::vector<std::array<double, 3>> describe() const {
        std::vector<std::array<double, 3>> out;
        for (size_t i = 0; i < nodes_.size(); i++)
            out.push_back({(double)nodes_[i].kind, (double)level_of_[i], nodes_[i].threads_worth});
        return out;
    }

    // The plan nodes whose epilogue runs as a compiled map (tests: proof the map path is taken).
    std::vector<int64_t> compiled_epilogues() const {
        std::vector<int64_t> out;
        for (size_t i = 0; i < nodes_.size(); i++)
            if (nodes_[i].epi_fn) out.push_back((int64_t)i);
        return out;
    }

    // Whether level l runs all its nodes side by side at `threads` threads (run_level's rule).
    bool side_by_side(int64_t l, int64_t threads) const {
        TORCH_CHECK(l >= 0 && l < (int64_t)levels_.size(), "no level ", l);
        return all_side_by_side(levels_[l], threads);
    }

    // times (optional, float64, one per node): each node's seconds are ADDED to its entry
    // (profiling: scripts/bench_ops.py files them under op families); level_times (optional,
    // float64, one per level): each level's wall seconds, added likewise (at several threads a
    // level's nodes' times add up to more than its wall when they ran side by side; floating
    // nodes are in no level's wall: float_seconds). roots
    // (optional, uint8 (n, 32), contiguous): every hashed output's tensor root (hash_outputs).
    torch::Tensor run(const torch::Tensor& prev, const torch::Tensor& batch, int64_t threads,
                      const c10::optional<torch::Tensor>& times, const c10::optional<torch::Tensor>& roots,
                      const c10::optional<torch::Tensor>& level_times) const {
        check_buffer(prev, size_[RP_SOURCE_PREV_STEP_NODE_OUTPUT], "previous arena");
        check_buffer(batch, size_[RP_SOURCE_BATCH], "batch");
        uint8_t* root_rows = nullptr;
        if (roots.has_value()) {
            TORCH_CHECK(roots_api_ != nullptr && root_row_.size() == nodes_.size(),
                        "hash_outputs must be called after the last node, before a committed run");
            TORCH_CHECK(roots->scalar_type() == torch::kUInt8 && roots->is_contiguous() &&
                            roots->numel() == 32 * n_rows_,
                        "roots must be a contiguous uint8 tensor of ", n_rows_, " rows of 32 bytes");
            root_rows = roots->data_ptr<uint8_t>();
        }
        double* node_s = seconds(times, (int64_t)nodes_.size(), "times", "node");
        double* level_s = seconds(level_times, (int64_t)levels_.size(), "level_times", "level");
        torch::Tensor arena = arena_pool_->take({size_[RP_SOURCE_NODE_OUTPUT]}, torch::kFloat32);
        const torch::Tensor scratch = scratch_pool_->take({std::max<int64_t>(1, size_[RP_SCRATCH])}, torch::kFloat32);  // back to its pool when this run ends
        float* base[RP_SCRATCH + 1] = {arena.data_ptr<float>(), const_cast<float*>(prev.data_ptr<float>()),
                                       const_cast<float*>(batch.data_ptr<float>()), scratch.data_ptr<float>()};
        hash_workers_.store(0, std::memory_order_relaxed);
        double hash_s = 0;
        // At two or more hashing threads, outputs are hashed in the pool's idle time as the
        // levels run (IdleHashing); else, or while another run's idle hashing holds the pool,
        // all of them at the hash points.
        const int64_t idle_threads = std::min(threads, hash_threads_);
        std::unique_ptr<IdleHashing> idle;
        if (root_rows && roots_api_ && idle_threads > 1 && idle_hashing_) {
            idle = std::make_unique<IdleHashing>(roots_api_, (size_t)n_rows_, root_rows, idle_threads,
                                                 hash_workers_);
            if (!idle->installed()) idle.reset();
        }
        // A plain run at two or more threads lets its floating nodes run in the pool's idle
        // time (FloatingRun), unless another run's idle work holds the pool.
        std::shared_ptr<const FloatSchedule> fs;
        std::unique_ptr<FloatingRun> floating;
        if (!root_rows && threads > 1 && floating_on_) {
            fs = float_schedule();
            if (!fs->nodes.empty()) floating = std::make_unique<FloatingRun>(*this, *fs, base, node_s, threads);
            if (floating && !floating->installed()) floating.reset();
        }
        const std::vector<Level>& levels = floating ? fs->levels : levels_;
        double float_s = 0;  // the calling thread's wall at the floating nodes' deadlines
        size_t last_threaded = 0;  // one past the last level that runs on several threads
        for (size_t l = 0; l < levels.size(); l++)
            if (uses_threads(levels[l], threads)) last_threaded = l + 1;
        for (size_t l = 0; l < levels.size(); l++) {
            if (idle && !overwritten_[l].empty())
                hash_s += idle->drain(&overwritten_[l]);
            else if (root_rows && !idle && !hash_before_[l].empty())
                hash_s += hash_nodes(hash_before_[l], base, root_rows, threads);
            // A level on one thread before one on several: the workers would fall asleep in a
            // stretch of one-thread levels (the forward's norms, gathers and few-row GEMMs) and
            // take tens of microseconds to wake when the next level's job comes; woken again
            // before every such level, they still spin when it comes. (Woken four levels
            // ahead only, a worker came late to most of the tiny Llama's single GEMM
            // levels, which then ran no faster at 2 threads than at 1.)
            if (threads > 1 && !uses_threads(levels[l], threads) && l < last_threaded) prewake_workers(threads);
            if (floating) float_s += floating->finish_due((int64_t)l);
            const auto t0 = std::chrono::steady_clock::now();
            run_level(levels[l], base, threads, node_s);
            if (floating) floating->level_done((int64_t)l);
            if (level_s) level_s[l] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            if (idle)
                for (const auto* part : {&levels_[l].big, &levels_[l].small})
                    for (int64_t i : *part)
                        if (root_row_[i] >= 0) {
                            const PlanNode& nd = nodes_[i];
                            idle->add(reinterpret_cast<const uint32_t*>(base[nd.out_buf] + nd.out_offset),
                                      (size_t)nd.out_numel, root_row_[i]);
                        }
        }
        if (floating) float_s += floating->finish_due((int64_t)levels.size());
        if (!root_rows) {
            floated_by_workers_.store(floating ? floating->by_workers() : 0, std::memory_order_relaxed);
            floated_total_.store(floating ? (int64_t)fs->nodes.size() : 0, std::memory_order_relaxed);
            float_s_.store(float_s, std::memory_order_relaxed);
        }
        if (root_rows) hash_s += idle ? idle->drain() : hash_nodes(hash_last_, base, root_rows, threads);
        hash_s_.store(hash_s, std::memory_order_relaxed);
        idle_items_.store(idle ? idle->items_overlapped() : 0, std::memory_order_relaxed);
        all_items_.store(idle ? idle->items_total() : 0, std::memory_order_relaxed);
        return arena;
    }

    // Whether committed runs at two or more threads hash in the pool's idle time (default on;
    // off: every output at the hash points, as at one thread), for in-process comparisons
    // (scripts/bench_conv.py --idle-hashing) and tests.
    void set_idle_hashing(bool on) { idle_hashing_ = on; }

    // Whether plain runs at two or more threads let floating nodes run in the pool's idle time
    // (default on; off: every node in its level), for in-process comparisons
    // (scripts/bench_threads.py --floating) and tests.
    void set_floating(bool on) { floating_on_ = on; }

    // The nodes that float in plain runs at two or more threads, each with its deadline (the
    // level before which it must be done; the level count: the end), for tests that check the
    // schedule against the nodes' buffers.
    std::vector<std::array<int64_t, 2>> floating_nodes() const {
        const auto fs = float_schedule();
        std::vector<std::array<int64_t, 2>> out;
        for (size_t l = 0; l < fs->due.size(); l++)
            for (int64_t f : fs->due[l]) out.push_back({fs->nodes[f], (int64_t)l});
        std::sort(out.begin(), out.end());
        return out;
    }

    // The last plain run's floating nodes: (how many pool workers ran, how many there were);
    // (0, 0) when none floated.
    std::pair<int64_t, int64_t> floated() const {
        return {floated_by_workers_.load(std::memory_order_relaxed), floated_total_.load(std::memory_order_relaxed)};
    }

    // The wall seconds the last plain run's calling thread spent at the floating nodes'
    // deadlines, running those no worker had taken and waiting for those being run (the
    // profile's: level_times holds the levels' walls without it).
    double float_seconds() const { return float_s_.load(std::memory_order_relaxed); }

    // The last committed run's idle hashing: (items hashed while levels ran, all
    // its items); (0, 0) when it hashed at the hash points only.
    std::pair<int64_t, int64_t> idle_hashed() const {
        return {idle_items_.load(std::memory_order_relaxed), all_items_.load(std::memory_order_relaxed)};
    }

    // Wall seconds the last committed run spent hashing (its hash points together), for
    // benchmarks that set the hashing beside one keccak tree over the same bytes
    // (scripts/bench_conv.py --step MODEL --hashing).
    double hash_seconds() const { return hash_s_.load(std::memory_order_relaxed); }

    // How many distinct threads hashed outputs in the last committed run (tests: proof that the
    // hashing really ran on several threads; worker indices are distinct OS threads, pool.h).
    int64_t hash_workers() const { return __builtin_popcountll(hash_workers_.load(std::memory_order_relaxed)); }

  private:
    int64_t size_[RP_SCRATCH + 1];  // element count per source kind, then the scratch (ring + work)
    int64_t ring_, work_;           // the scratch: the window ring [0, ring_), then the work region
    // Committed runs (hash_outputs): the keccak tree, each plan node's root row (-1: none), the
    // nodes hashed before each level and after the last.
    const RootsApi* roots_api_ = nullptr;
    bool idle_hashing_ = true;
    mutable std::atomic<int64_t> idle_items_{0}, all_items_{0};  // the last committed run's (idle_hashed)
    int64_t hash_threads_ = 1;
    std::vector<int64_t> root_row_;
    int64_t n_rows_ = 0;
    std::vector<std::vector<int64_t>> hash_before_;
    std::vector<int64_t> hash_last_;
    // Idle hashing: per level, the root rows of the outputs it overwrites that no earlier level
    // overwrote (they must be hashed before it runs: IdleHashing::drain).
    std::vector<std::vector<int64_t>> overwritten_;
    mutable std::atomic<uint64_t> hash_workers_{0};  // bit w: worker w hashed in the last run
    mutable std::atomic<double> hash_s_{0};          // the last committed run's hashing seconds
    // The arena and scratch (ring + work region) of each run, recycled (recycled.h): without,
    // the first node writing each region of a fresh arena paid its page faults in every run (on
    // digits-wide, 9 MiB, ~1,900 faults a step, which made its big elementwise nodes several
    // times slower at 1 thread than at 2: the faults then split between the threads). A run's
    // arena outlives the run (it becomes the next run's previous arena), so it comes back when
    // Python drops it. One idle buffer of each is kept: a run of steps holds two arenas (the one
    // it reads, the one it writes) and gives one back per step, and every buffer kept idle is
    // resident memory (a GPT-2 small arena is 1.4 GiB).
    std::shared_ptr<RecycledBuffers> arena_pool_ = RecycledBuffers::make(1, SIZE_MAX);
    std::shared_ptr<RecycledBuffers> scratch_pool_ = RecycledBuffers::make(1, SIZE_MAX);
    int64_t mc_, kc_, nc_;
    std::vector<PlanNode> nodes_;
    std::vector<int64_t> level_of_;  // per node
    std::vector<Level> levels_;

    // Floating nodes (see the top): which nodes float, and the levels without them. Built on the
    // first plain run at two or more threads after the last node was added (float_schedule).
    struct FloatSchedule {
        size_t n_nodes = 0;                             // the node count it was built for
        std::vector<Level> levels;                      // levels_ without the floating nodes
        std::vector<int64_t> nodes;                     // the floating nodes, in index order
        std::vector<int64_t> after_level;               // per floating node: its last level-bound predecessor's level (-1)
        std::vector<std::vector<int64_t>> float_preds;  // per floating node: its floating predecessors (positions)
        std::vector<int64_t> order;                     // the floating nodes in the order they are taken
        std::vector<std::vector<int64_t>> due;          // per level l <= L: what must be done before l runs (L: the end), in order
        std::vector<char> wakes;                        // per level: its end makes some floating node ready
    };
    bool floating_on_ = true;
    mutable std::mutex float_mutex_;
    mutable std::shared_ptr<const FloatSchedule> float_;
    mutable std::atomic<int64_t> floated_by_workers_{0}, floated_total_{0};  // the last plain run's (floated)
    mutable std::atomic<double> float_s_{0};                                 // and its float_seconds

    std::shared_ptr<const FloatSchedule> float_schedule() const {
        std::lock_guard<std::mutex> lock(float_mutex_);
        if (!float_ || float_->n_nodes != nodes_.size()) float_ = build_float_schedule();
        return float_;
    }

    // Whether node i may float: small enough, and touching no window-ring intermediate (the ring
    // is the window nodes' scratch, written and read within a few levels).
    bool may_float(const PlanNode& nd) const {
        if (nd.threads_worth > FLOAT_MAX_WORTH) return false;
        if (nd.out_buf == RP_SCRATCH && nd.out_offset < ring_) return false;
        for (const Ref& r : nd.ins)
            if (r.buf == RP_SCRATCH && r.offset < ring_) return false;
        return true;
    }

    std::shared_ptr<const FloatSchedule> build_float_schedule() const {
        auto fs = std::make_shared<FloatSchedule>();
        const int64_t n = (int64_t)nodes_.size(), L = (int64_t)levels_.size();
        fs->n_nodes = nodes_.size();
        std::vector<std::vector<int64_t>> preds(n), succs(n);
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < i; j++)
                if (must_follow(nodes_[i], nodes_[j])) {
                    preds[i].push_back(j);
                    succs[j].push_back(i);
                }
        // The latest level each node could run at with every node after it where it is.
        std::vector<int64_t> latest(n, L - 1), pos(n, -1);
        for (int64_t i = n - 1; i >= 0; i--)
            for (int64_t t : succs[i]) latest[i] = std::min(latest[i], latest[t] - 1);
        for (int64_t i = 0; i < n; i++)
            if (latest[i] - level_of_[i] >= FLOAT_MIN_SLACK && may_float(nodes_[i])) {
                pos[i] = (int64_t)fs->nodes.size();
                fs->nodes.push_back(i);
            }
        // A floating node's deadline: the first level with a level-bound node that must follow
        // it, directly or through floating nodes (theirs come no later).
        std::vector<int64_t> deadline(n, L);
        for (int64_t i = n - 1; i >= 0; i--)
            if (pos[i] >= 0)
                for (int64_t t : succs[i]) deadline[i] = std::min(deadline[i], pos[t] >= 0 ? deadline[t] : level_of_[t]);
        const size_t nf = fs->nodes.size();
        fs->after_level.assign(nf, -1);
        fs->float_preds.assign(nf, {});
        fs->due.assign(L + 1, {});
        fs->wakes.assign(L, 0);
        // Earliest deadline first, the largest first among equal deadlines (the nodes left at
        // the end then finish together).
        fs->order.resize(nf);
        for (size_t f = 0; f < nf; f++) fs->order[f] = (int64_t)f;
        std::stable_sort(fs->order.begin(), fs->order.end(), [&](int64_t a, int64_t b) {
            const int64_t ia = fs->nodes[a], ib = fs->nodes[b];
            if (deadline[ia] != deadline[ib]) return deadline[ia] < deadline[ib];
            return nodes_[ia].threads_worth > nodes_[ib].threads_worth;
        });
        for (size_t f = 0; f < nf; f++) {
            const int64_t i = fs->nodes[f];
            for (int64_t j : preds[i]) {
                if (pos[j] >= 0)
                    fs->float_preds[f].push_back(pos[j]);
                else
                    fs->after_level[f] = std::max(fs->after_level[f], level_of_[j]);
            }
            if (fs->after_level[f] >= 0) fs->wakes[fs->after_level[f]] = 1;
        }
        for (int64_t f : fs->order) fs->due[deadline[fs->nodes[f]]].push_back(f);
        // The levels without their floating nodes, filed in the order add_node filed them.
        fs->levels.resize(L);
        for (int64_t i = 0; i < n; i++)
            if (pos[i] < 0) fs->levels[level_of_[i]].add(i, nodes_);
        return fs;
    }

    // One plain run's floating nodes. Pool workers with nothing else to do take the ready ones
    // (pool.h idle work) and run each on their own thread: ready when the levels of its
    // level-bound predecessors have ended and its floating predecessors are done. Before a
    // level with a node that must follow a floating node (its deadline), the calling thread
    // runs it there, on all threads, if no worker has taken it, or waits for the worker that
    // has. Every node still runs its own kernel on memory no node running beside it touches
    // (must_follow), so the bits are those of the levels. Under the pool's spread check the
    // first floating node is left to a worker (the calling thread waits for it at its
    // deadline), so a test knows that a worker ran one.
    class FloatingRun {
      public:
        FloatingRun(const StepPlan& plan, const FloatSchedule& fs, float* const* base, double* node_s, int64_t threads)
            : plan_(plan), fs_(fs), base_(base), node_s_(node_s), threads_(threads),
              state_(new std::atomic<int>[fs.nodes.size()]), spread_(spread_check_on()) {
            for (size_t f = 0; f < fs.nodes.size(); f++) state_[f].store(0);
            installed_ = install_idle_work(&FloatingRun::idle_fn, this, threads);
            if (installed_) wake_idle_workers();
        }
        ~FloatingRun() {
            if (installed_) remove_idle_work();
        }
        FloatingRun(const FloatingRun&) = delete;
        FloatingRun& operator=(const FloatingRun&) = delete;

        bool installed() const { return installed_; }
        int64_t by_workers() const { return by_workers_.load(); }

        // Level l has ended: the floating nodes waiting for it may start.
        void level_done(int64_t l) {
            levels_done_.store(l + 1);
            if (fs_.wakes[l]) wake_idle_workers();
        }

        // Makes sure every floating node due before level l (l = L: the end) is done; returns the
        // wall seconds it took. Re-throws a worker's exception.
        double finish_due(int64_t l) {
            if (fs_.due[l].empty()) return 0.0;  // most levels: no clock read
            const auto t0 = std::chrono::steady_clock::now();
            const int64_t done = levels_done_.load();
            bool ran_any = false;
            // Runs the due nodes nobody has taken as they become ready (a worker may be running
            // one of their floating predecessors), then waits for those the workers took.
            for (;;) {
                int64_t running = -1, left = -1;
                bool ran = false;
                for (int64_t f : fs_.due[l]) {
                    const int v = state_[f].load();
                    if (v == 2) continue;
                    int idle = 0;
                    if (v == 0 && !(spread_ && f == fs_.order[0]) && ready((size_t)f, done) &&
                        state_[f].compare_exchange_strong(idle, 1)) {
                        plan_.run_node(fs_.nodes[f], base_, threads_, node_s_);
                        state_[f].store(2);
                        state_[f].notify_all();
                        ran = ran_any = true;
                    } else if (state_[f].load() == 1) {
                        if (running < 0) running = f;
                    } else if (left < 0) {
                        left = f;
                    }
                }
                if (ran) continue;
                if (running < 0 && left < 0) break;
                const int64_t f = running >= 0 ? running : left;  // left: the spread check's node
                if (running < 0) wake_idle_workers();
                for (int v = state_[f].load(); v != 2 && v == state_[f].load();) state_[f].wait(v);
            }
            if (failed_.load()) {
                std::lock_guard<std::mutex> lock(error_mutex_);
                std::rethrow_exception(error_);
            }
            if (ran_any) wake_idle_workers();  // floating nodes that waited for these may start
            return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }

      private:
        const StepPlan& plan_;
        const FloatSchedule& fs_;
        float* const* base_;
        double* node_s_;
        int64_t threads_;
        std::unique_ptr<std::atomic<int>[]> state_;  // per floating node: 0 waiting, 1 running, 2 done
        const bool spread_;
        bool installed_ = false;
        std::atomic<int64_t> levels_done_{0}, by_workers_{0};
        std::atomic<size_t> first_open_{0};  // the nodes before it in fs_.order are all taken
        std::atomic<bool> failed_{false};
        std::mutex error_mutex_;
        std::exception_ptr error_;

        static bool idle_fn(void* ctx, int64_t worker) { return static_cast<FloatingRun*>(ctx)->take(worker); }

        bool ready(size_t f, int64_t levels_done) const {
            if (fs_.after_level[f] >= levels_done) return false;
            for (int64_t q : fs_.float_preds[f])
                if (state_[q].load() != 2) return false;
            return true;
        }

        // A pool worker's idle unit: runs the first ready floating node nobody has taken, on
        // this thread alone; false if there is none. The calling thread (worker 0) takes none
        // here: it keeps to the levels.
        bool take(int64_t worker) {
            if (worker == 0) return false;
            const int64_t done = levels_done_.load();
            const size_t n = fs_.nodes.size();
            size_t open = first_open_.load();
            bool prefix_taken = true;
            for (size_t k = open; k < n; k++) {
                const size_t f = (size_t)fs_.order[k];
                if (state_[f].load() != 0) {
                    if (prefix_taken) first_open_.compare_exchange_strong(open, k + 1), open = k + 1;
                    continue;
                }
                prefix_taken = false;
                int idle = 0;
                if (!ready(f, done) || !state_[f].compare_exchange_strong(idle, 1)) continue;
                try {
                    FpEnvGuard env;
                    plan_.run_node(fs_.nodes[f], base_, 1, node_s_);
                } catch (...) {
                    std::lock_guard<std::mutex> lock(error_mutex_);
                    if (!error_) error_ = std::current_exception();
                    failed_.store(true);
                }
                by_workers_.fetch_add(1);
                state_[f].store(2);
                state_[f].notify_all();
                return true;
            }
            return false;
        }
    };

    // The tensor roots of plan nodes `which` into their rows of `roots`, on up to min(threads,
    // hash_threads_) threads; returns the wall seconds it took. One pool_roots call per hash
    // point, its items run by the kernels' persistent pool: the keccak tree cuts
    // the big outputs into subtree tasks and groups the small ones (a step's hash points hold a
    // few to a few dozen outputs of 16-1000 leaves, and resnet18's also outputs of 2,048-16,384),
    // and the pool's threads share all of them out, finishing together once per hash point.
    // Before, the small outputs went in runs on the pool and each big one alone through the
    // tree's own threads, started and joined per output: resnet18's 404 outputs (171 MB, 29 of
    // 2,048+ leaves) at 2 threads took 37-45 ms against 34-36 now and 33 for one tree over the
    // same bytes, and 78-91 ms against 56-65 (one tree 52-66) while another process held a
    // core: a joined thread the OS ran late held up every big output. A root depends only on
    // its tensor's elements, so how the work is cut and who hashes it never changes a bit.
    double hash_nodes(const std::vector<int64_t>& which, float* const* base, uint8_t* roots, int64_t threads) const {
        if (which.empty()) return 0;
        const auto t0 = std::chrono::steady_clock::now();
        const size_t n = which.size();
        std::vector<const uint32_t*> elems(n);
        std::vector<size_t> numels(n);
        std::vector<uint8_t> out(32 * n);
        for (size_t j = 0; j < n; j++) {
            const PlanNode& nd = nodes_[which[j]];
            elems[j] = reinterpret_cast<const uint32_t*>(base[nd.out_buf] + nd.out_offset);
            numels[j] = (size_t)nd.out_numel;
        }
        const int64_t t = std::max<int64_t>(1, std::min(threads, hash_threads_));
        pool_roots(roots_api_, elems.data(), numels.data(), n, out.data(), t, hash_workers_);
        for (size_t j = 0; j < n; j++)
            std::copy(out.begin() + 32 * j, out.begin() + 32 * (j + 1), roots + 32 * root_row_[which[j]]);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }

    // Whether two nodes' outputs share memory.
    static bool same_place(const PlanNode& a, const PlanNode& b) {
        return a.out_buf == b.out_buf && a.out_offset < b.out_offset + b.out_numel &&
               b.out_offset < a.out_offset + a.out_numel;
    }

    // One level's nodes (independent of each other) on `threads` threads. When no node has more
    // than a thread's share of the level's work, all of them run side by side, one thread each,
    // the longest first: the threads then finish about together without any node being split
    // (a split node costs a wake-up and a wait for its slowest item; a few-hundred-microsecond
    // GEMM hardly gains from it). Otherwise the big nodes run one after another, each on all
    // threads, then the small ones side by side. Side by side only if the nodes together are
    // worth a thread's minimum work each; otherwise the wake-ups would cost more than they save.
    void run_level(const Level& lv, float* const* base, int64_t threads, double* node_s) const {
        const std::vector<int64_t>* side = &lv.small;
        double side_worth = lv.small_worth;
        if (all_side_by_side(lv, threads)) {
            side = &lv.all;
            side_worth = lv.worth;
        } else {
            for (int64_t i : lv.big) run_node(i, base, threads, node_s);
        }
        const int64_t n = (int64_t)side->size();
        parallel_items(n, threads_for(threads, n, side_worth, 1.0),
                       [&](int64_t j, int64_t) { run_node((*side)[j], base, 1, node_s); });
    }

    // The float64 entries (one per node or level) of an optional profile tensor of run().
    static double* seconds(const c10::optional<torch::Tensor>& t, int64_t n, const char* what, const char* per) {
        if (!t.has_value()) return nullptr;
        TORCH_CHECK(t->scalar_type() == torch::kFloat64 && t->is_contiguous() && t->numel() == n, what,
                    " must be a contiguous float64 tensor with one entry per ", per);
        return t->data_ptr<double>();
    }

    // Whether run_level may run some of this level on more than one thread.
    static bool uses_threads(const Level& lv, int64_t threads) {
        if (threads <= 1) return false;
        if (all_side_by_side(lv, threads)) return threads_for(threads, (int64_t)lv.all.size(), lv.worth, 1.0) > 1;
        return !lv.big.empty() || threads_for(threads, (int64_t)lv.small.size(), lv.small_worth, 1.0) > 1;
    }

    static bool all_side_by_side(const Level& lv, int64_t threads) {
        return lv.all.size() > 1 && lv.max_worth * (double)threads <= lv.worth;
    }

    // Node i on `threads` threads (node_s: see run).
    void run_node(int64_t i, float* const* base, int64_t threads, double* node_s) const {
        const PlanNode& nd = nodes_[i];
        const auto t0 = std::chrono::steady_clock::now();
        const uint32_t* data_small[8];
        std::vector<const uint32_t*> data_big;
        const uint32_t** data = data_small;
        if (nd.ins.size() > 8) {
            data_big.resize(nd.ins.size());
            data = data_big.data();
        }
        for (size_t t = 0; t < nd.ins.size(); t++)
            data[t] = reinterpret_cast<const uint32_t*>(base[nd.ins[t].buf] + nd.ins[t].offset);
        float* out = base[nd.out_buf] + nd.out_offset;
        uint32_t* out_bits = reinterpret_cast<uint32_t*>(out);
        switch (nd.kind) {
            case NK_PROGRAM: exec_prog(nd.prog, data, out_bits, nullptr, threads); break;
            case NK_DOT: {
                GemmArgs g = nd.g;
                g.A = reinterpret_cast<const float*>(data[nd.sa]);
                g.B = reinterpret_cast<const float*>(data[nd.sb]);
                g.C = out;
                g.aoff = nd.aoff.data();
                g.boff = nd.boff.data();
                gemm(g, threads, mc_, kc_, nc_);
                break;
            }
            case NK_FOLD:
                reduce_into(reinterpret_cast<const float*>(data[nd.slot]) + nd.xoff, nd.R, nd.Kr, nd.sr, nd.sk, nd.op,
                            out, threads);
                break;
            case NK_ROWDOT:
                rowdot_into(reinterpret_cast<const float*>(data[nd.slot]) + nd.xoff,
                            reinterpret_cast<const float*>(data[nd.slot_b]) + nd.boff2, nd.R, nd.Kr, nd.sr, nd.sk,
                            nd.srb, nd.skb, out, threads);
                break;
            case NK_BINARY:
                binary_into(reinterpret_cast<const float*>(data[0]), reinterpret_cast<const float*>(data[1]), out,
                            nd.out_numel, nd.op, threads);
                break;
            case NK_SCATTER:
                scatter_rows_into(reinterpret_cast<const float*>(data[0]), reinterpret_cast<const float*>(data[1]),
                                  nd.Kr, nd.R, nd.out_numel / nd.R, out, threads);
                break;
            case NK_WGEMM:
            case NK_GATHER:
            case NK_PERMUTE:
            case NK_POOLBACK: run_window_node(nd, data, out, threads); break;
            default:
                map_into(nd.fn, reinterpret_cast<const void* const*>(data), out_bits, nd.out_numel, nd.work, threads);
                break;
        }
        if (nd.epi_fn) {
            run_epilogue_map(nd, data, out_bits, threads);
        } else if (nd.has_prog && nd.kind != NK_PROGRAM) {
            exec_prog(nd.prog, data, out_bits, out_bits, threads);
        }
        if (node_s) node_s[i] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }

    // The epilogue map of a DOT/FOLD/ROWDOT/PERMUTE node (fn_addr 0: none, the interpreter runs the
    // epilogue). lin: one (offset, s, q, p) row per map input, the node's output first; that row
    // must be the identity (0, 1, 1, >= numel), which makes running the map in place safe:
    // element e of the result depends on element e of the output only, and the generated loop
    // (jit.py jit_source) loads every input of a block of W elements into registers before it
    // stores that block, so each element is read before it is overwritten, by the same thread
    // (map_into splits the elements into disjoint ranges).
    static void set_epilogue_map(PlanNode& nd, const torch::Tensor& lin, int64_t fn_addr, int64_t work) {
        if (fn_addr == 0) return;
        TORCH_CHECK(nd.has_prog, "an epilogue map needs an epilogue");
        TORCH_CHECK(work >= 0, "epilogue map work must be >= 0");
        const int64_t n_in = (int64_t)nd.ins.size() + 1;
        const std::vector<int64_t> rows = int64_rows(lin, n_in, 4, "epilogue lin");
        TORCH_CHECK(rows[0] == 0 && rows[1] == 1 && rows[2] == 1 && rows[3] >= nd.out_numel,
                    "an epilogue map reads the node's output element for element (input 0)");
        check_map_inputs(rows, 0, nd.out_numel, nd.out_numel);
        for (size_t t = 0; t < nd.ins.size(); t++) check_map_inputs(rows, t + 1, nd.out_numel, nd.ins[t].numel);
        nd.epi_fn = reinterpret_cast<MapFn>(fn_addr);
        nd.epi_work = work;
    }

    // The epilogue map over the node's output in place (set_epilogue_map says why that is safe).
    static void run_epilogue_map(const PlanNode& nd, const uint32_t* const* data, uint32_t* out, int64_t threads) {
        const void* in_small[9];
        std::vector<const void*> in_big;
        const void** in = in_small;
        if (nd.ins.size() + 1 > 9) {
            in_big.resize(nd.ins.size() + 1);
            in = in_big.data();
        }
        in[0] = out;
        for (size_t t = 0; t < nd.ins.size(); t++) in[t + 1] = data[t];
        map_into(nd.epi_fn, in, out, nd.out_numel, nd.epi_work, threads);
    }

    // Appends a node: its work in threads' worth, its level, its place in the level.
    void add_node(PlanNode nd) {
        const double epi = nd.epi_fn                                  ? (double)nd.epi_work / MAP_MIN_INSTRS
                           : nd.has_prog && nd.kind != NK_PROGRAM ? (double)nd.prog.epi_work / PROGRAM_MIN_INSTRS
                                                                  : 0.0;
        switch (nd.kind) {
            case NK_PROGRAM: nd.threads_worth = (double)nd.prog.work / PROGRAM_MIN_INSTRS; break;
            case NK_DOT:
                nd.threads_worth = (double)nd.g.batch * (double)nd.g.M * (double)nd.g.N * (double)nd.g.K / GEMM_MIN_FMAS;
                break;
            case NK_FOLD: nd.threads_worth = (double)nd.R * (double)nd.Kr / FOLD_MIN_ELEMS; break;
            case NK_ROWDOT: nd.threads_worth = 2.0 * (double)nd.R * (double)nd.Kr / FOLD_MIN_ELEMS; break;
            case NK_BINARY: nd.threads_worth = (double)nd.out_numel / BINARY_MIN_ELEMS; break;
            case NK_SCATTER:
                nd.threads_worth = (double)(nd.Kr * nd.R + nd.out_numel) / SCATTER_MIN_ELEMS;
                break;
            case NK_WGEMM:
                nd.threads_worth = (double)nd.out_numel * (double)nd.win->K / GEMM_MIN_FMAS;
                break;
            case NK_GATHER: nd.threads_worth = (double)nd.out_numel / BINARY_MIN_ELEMS; break;
            case NK_PERMUTE: nd.threads_worth = (double)nd.out_numel / PERMUTE_MIN_ELEMS; break;
            case NK_POOLBACK: nd.threads_worth = (double)nd.out_numel * (double)nd.win->K / BINARY_MIN_ELEMS; break;
            default: nd.threads_worth = (double)nd.work / MAP_MIN_INSTRS; break;
        }
        nd.threads_worth += epi;
        int64_t level = 0;
        for (size_t i = 0; i < nodes_.size(); i++)
            if (level_of_[i] >= level && must_follow(nd, nodes_[i])) level = level_of_[i] + 1;
        const int64_t index = (int64_t)nodes_.size();
        if ((int64_t)levels_.size() <= level) levels_.resize(level + 1);
        level_of_.push_back(level);
        nodes_.push_back(std::move(nd));
        levels_[level].add(index, nodes_);
        root_row_.clear();  // hash_outputs again: the levels changed
    }

    // Whether `later` must run after `earlier`: it reads what `earlier` writes, or writes what
    // `earlier` reads or writes (in this step's arena or the scratch; the other buffers are
    // read-only).
    static bool must_follow(const PlanNode& later, const PlanNode& earlier) {
        auto overlaps = [](int64_t a0, int64_t an, int64_t b0, int64_t bn) { return a0 < b0 + bn && b0 < a0 + an; };
        auto hits = [&](const Ref& r, const PlanNode& writer) {
            return r.buf == writer.out_buf && overlaps(r.offset, r.numel, writer.out_offset, writer.out_numel);
        };
        if (later.out_buf == earlier.out_buf &&
            overlaps(later.out_offset, later.out_numel, earlier.out_offset, earlier.out_numel))
            return true;
        for (const Ref& r : later.ins)
            if (hits(r, earlier)) return true;
        for (const Ref& r : earlier.ins)
            if (hits(r, later)) return true;
        return false;
    }

    // A window node (window_plan.h) on `threads` threads; a windowed address outside its input
    // fails the run (nothing outside is read).
    void run_window_node(const PlanNode& nd, const uint32_t* const* data, float* out, int64_t threads) const {
        const WindowParts& w = *nd.win;
        bool ok = true;
        switch (nd.kind) {
            case NK_WGEMM:
                ok = windowed_gemm(w.a.on(data[0], nd.ins[0].numel), w.b.on(data[1], nd.ins[1].numel), out, w.nb, w.M,
                                   w.N, w.K, threads, mc_, kc_, nc_, w.split);
                break;
            case NK_GATHER:
                ok = windowed_gather(w.a.on(data[0], nd.ins[0].numel), w.K, reinterpret_cast<uint32_t*>(out), threads,
                                     w.kmajor);
                break;
            case NK_POOLBACK: pool_backward_into(w.pool, data[0], data[1], out, threads); break;
            default:
                permute_into(reinterpret_cast<const float*>(data[nd.ins.size() - 1]), w.shape, w.src_strides, out,
                             threads);
                break;
        }
        TORCH_CHECK(ok, "step plan: a windowed operand address fell outside its input");
    }

    static void check_buffer(const torch::Tensor& t, int64_t numel, const char* what) {
        TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32 && t.is_contiguous(), what,
                    " must be a contiguous CPU float32 tensor");
        TORCH_CHECK(t.numel() == numel, what, " has ", t.numel(), " elements, the plan expects ", numel);
    }

    std::vector<Ref> read_refs(const torch::Tensor& refs) const {
        TORCH_CHECK(refs.dim() == 2, "refs must be (n_inputs, 3)");
        const std::vector<int64_t> rows = int64_rows(refs, refs.size(0), 3, "refs");
        std::vector<Ref> out(refs.size(0));
        for (size_t t = 0; t < out.size(); t++) out[t] = locate(rows[3 * t], rows[3 * t + 1], rows[3 * t + 2], "input");
        return out;
    }

    // Where the plan address (buf, offset, numel) lives: an arena address at or past
    // arena_numel is the work region (the scratch after the ring); a scratch address must stay
    // in the ring. A region never straddles two of them.
    Ref locate(int64_t buf, int64_t offset, int64_t numel, const char* what) const {
        TORCH_CHECK(buf >= RP_SOURCE_NODE_OUTPUT && buf <= RP_SCRATCH, "unknown buffer ", buf);
        TORCH_CHECK(offset >= 0 && numel >= 0, what, " has a negative offset or size");
        if (buf == RP_SOURCE_NODE_OUTPUT && offset >= size_[buf] && work_ > 0) {
            const int64_t w = offset - size_[buf];
            TORCH_CHECK(w + numel <= work_, what, " [", offset, ", +", numel, ") leaves the work region of ", work_);
            return {RP_SCRATCH, ring_ + w, numel};
        }
        const int64_t end = buf == RP_SCRATCH ? ring_ : size_[buf];
        if (offset + numel <= end) return {buf, offset, numel};
        if (std::string(what) == "output")
            TORCH_CHECK(false, "output [", offset, ", +", numel, ") leaves ",
                        buf == RP_SCRATCH ? "the scratch" : "the arena", " of ", end);
        TORCH_CHECK(false, what, " [", offset, ", +", numel, ") leaves buffer ", buf, " of ", end);
        return {};
    }

    void set_out(PlanNode& nd, int64_t out_offset, int64_t numel, int64_t buf = RP_SOURCE_NODE_OUTPUT) const {
        TORCH_CHECK(buf == RP_SOURCE_NODE_OUTPUT || buf == RP_SCRATCH, "outputs go to the arena or the scratch");
        TORCH_CHECK(numel >= 1, "an output has at least one element");
        const Ref at = locate(buf, out_offset, numel, "output");
        nd.out_buf = at.buf;
        nd.out_offset = at.offset;
        nd.out_numel = numel;
    }

    PlanNode base_node(int64_t kind, const torch::Tensor& refs, const torch::Tensor& maps,
                       const std::vector<int64_t>& out_shape, int64_t K, const torch::Tensor& pro,
                       const torch::Tensor& body, const torch::Tensor& epi, int64_t out_offset) const {
        PlanNode nd;
        nd.kind = kind;
        nd.ins = read_refs(refs);
        std::vector<int64_t> numels;
        for (const Ref& r : nd.ins) numels.push_back(r.numel);
        nd.prog = make_prog(int64_rows(maps, (int64_t)nd.ins.size(), (int64_t)out_shape.size() + 4, "maps").data(),
                            (int64_t)nd.ins.size(), out_shape, K, read_program(pro), read_program(body),
                            read_program(epi), numels);
        set_out(nd, out_offset, nd.prog.numel);
        return nd;
    }

    static std::vector<int64_t> offsets(const torch::Tensor& t) {
        TORCH_CHECK(t.scalar_type() == torch::kInt64 && t.dim() == 1, "offsets must be a 1-D int64 tensor");
        auto c = t.contiguous();
        return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
    }
};

}  // namespace

// Tests: the in-plan hashing's code (pool_roots) on any tensors. api_addr: the keccak tree's
// keccak_roots_api(); tensors: contiguous float32, >= 1 element each. Returns (roots (n, 32)
// uint8, how many distinct pool workers hashed).
static std::pair<torch::Tensor, int64_t> pool_tensor_roots(int64_t api_addr, const std::vector<torch::Tensor>& tensors,
                                                           int64_t threads) {
    TORCH_CHECK(api_addr != 0, "null keccak_roots_api table");
    TORCH_CHECK(threads >= 1, "threads must be >= 1");
    std::vector<const uint32_t*> elems;
    std::vector<size_t> numels;
    for (const torch::Tensor& t : tensors) {
        TORCH_CHECK(t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.numel() >= 1,
                    "tensors must be contiguous float32 with at least one element");
        elems.push_back(reinterpret_cast<const uint32_t*>(t.data_ptr<float>()));
        numels.push_back((size_t)t.numel());
    }
    torch::Tensor roots = torch::empty({(int64_t)tensors.size(), 32}, torch::kUInt8);
    std::atomic<uint64_t> workers{0};
    if (!tensors.empty())
        pool_roots(reinterpret_cast<const RootsApi*>(api_addr), elems.data(), numels.data(), elems.size(),
                   roots.data_ptr<uint8_t>(), threads, workers);
    return {roots, __builtin_popcountll(workers.load())};
}

void bind_step_plan(pybind11::module& m) {
    m.def("pool_tensor_roots", &pool_tensor_roots, pybind11::arg("api_addr"), pybind11::arg("tensors"),
          pybind11::arg("threads"), pybind11::call_guard<pybind11::gil_scoped_release>());
    pybind11::class_<StepPlan>(m, "StepPlan", "all nodes of one training step in one call")
        .def(pybind11::init<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>(),
             pybind11::arg("arena_numel"), pybind11::arg("prev_numel"), pybind11::arg("batch_numel"),
             pybind11::arg("mc"), pybind11::arg("kc"), pybind11::arg("nc"), pybind11::arg("scratch_numel") = 0,
             pybind11::arg("work_numel") = 0)
        .def("add_program", &StepPlan::add_program)
        .def("add_dot", &StepPlan::add_dot)
        .def("add_fold", &StepPlan::add_fold)
        .def("add_binary", &StepPlan::add_binary)
        .def("add_jit", &StepPlan::add_jit)
        .def("add_scatter", &StepPlan::add_scatter)
        .def("add_rowdot", &StepPlan::add_rowdot)
        .def("add_window_gemm", &StepPlan::add_window_gemm)
        .def("add_window_gather", &StepPlan::add_window_gather, pybind11::arg("refs"), pybind11::arg("rows"),
             pybind11::arg("ks"), pybind11::arg("wins"), pybind11::arg("fill"), pybind11::arg("K"),
             pybind11::arg("out_buf"), pybind11::arg("out_offset"), pybind11::arg("kmajor") = false)
        .def("add_permute", &StepPlan::add_permute)
        .def("add_pool_backward", &StepPlan::add_pool_backward)
        .def("hash_outputs", &StepPlan::hash_outputs, pybind11::arg("rows"), pybind11::arg("hash_threads"),
             pybind11::arg("api_addr"))
        .def("set_idle_hashing", &StepPlan::set_idle_hashing)
        .def("set_floating", &StepPlan::set_floating)
        .def("floating_nodes", &StepPlan::floating_nodes)
        .def("floated", &StepPlan::floated)
        .def("float_seconds", &StepPlan::float_seconds)
        .def("idle_hashed", &StepPlan::idle_hashed)
        .def("hash_workers", &StepPlan::hash_workers)
        .def("hash_seconds", &StepPlan::hash_seconds)
        .def("__len__", &StepPlan::size)
        .def("schedule", &StepPlan::schedule)
        .def("describe", &StepPlan::describe)
        .def("side_by_side", &StepPlan::side_by_side)
        .def("compiled_epilogues", &StepPlan::compiled_epilogues)
        .def("run", &StepPlan::run, pybind11::arg("prev"), pybind11::arg("batch"), pybind11::arg("threads"),
             pybind11::arg("times") = pybind11::none(), pybind11::arg("roots") = pybind11::none(),
             pybind11::arg("level_times") = pybind11::none(),
             pybind11::call_guard<pybind11::gil_scoped_release>());
}

}  // namespace repops_cpu
