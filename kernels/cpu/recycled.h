// SPDX-License-Identifier: MIT
//
// recycled.h — big result buffers handed back to the next request of their size instead of to
// malloc. A fresh buffer of megabytes is mapped by the OS page by page on first touch (a fault
// and a zeroed 4 KiB page each), and glibc gives freed memory at the top of its heap back to the
// OS once more than its trim threshold is free there: a kernel returning an 8 MiB tensor that
// the caller drops before the next call could pay ~2,000 faults every call. Measured on
// 2026-12-05 (the 64 -> 64 3x3 forward on 32 x 32 maps, batch 32, its 8 MiB output dropped
// between calls): 1,000-2,500 faults and 1.6-4.4 ms of system time a call, 19.4 -> 21.8 ms at
// 1 thread and 10.7 -> 13.4 at 2 (the two threads fault on the same region); how often it
// happens depends on what else the process's heap holds, so two runs of one script differed.
// Contents are unspecified, as torch::empty's.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace repops_cpu {

// The bytes of a tensor of `shape` and `dtype`.
inline int64_t tensor_bytes(at::IntArrayRef shape, torch::ScalarType dtype) {
    return (int64_t)c10::multiply_integers(shape) * (int64_t)c10::elementSize(dtype);
}

class RecycledBuffers : public std::enable_shared_from_this<RecycledBuffers> {
  public:
    // Keeps at most keep_per_size idle buffers of one byte size and keep_bytes idle in all; a
    // buffer given back past either is freed. Every buffer kept idle is resident memory.
    static std::shared_ptr<RecycledBuffers> make(size_t keep_per_size, size_t keep_bytes) {
        return std::make_shared<RecycledBuffers>(keep_per_size, keep_bytes);
    }
    RecycledBuffers(size_t keep_per_size, size_t keep_bytes) : keep_per_size_(keep_per_size), keep_bytes_(keep_bytes) {}
    ~RecycledBuffers() { release_idle(); }
    RecycledBuffers(const RecycledBuffers&) = delete;
    RecycledBuffers& operator=(const RecycledBuffers&) = delete;

    // A contiguous tensor of `shape` and `dtype` on a recycled buffer (or a new one); when its
    // storage dies the buffer comes back here (or is freed if this pool has gone).
    torch::Tensor take(at::IntArrayRef shape, torch::ScalarType dtype) {
        const size_t bytes = round_bytes(std::max<int64_t>(1, tensor_bytes(shape, dtype)));
        void* p = nullptr;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            auto it = idle_.find(bytes);
            if (it != idle_.end() && !it->second.empty()) {
                p = it->second.back();
                it->second.pop_back();
                idle_bytes_ -= bytes;
                reused_++;
            }
        }
        if (!p) p = std::aligned_alloc(kAlign, bytes);
        TORCH_CHECK(p, "out of memory for a buffer of ", bytes, " bytes");
        std::weak_ptr<RecycledBuffers> pool = weak_from_this();
        return torch::from_blob(
            p, shape,
            [pool, bytes](void* q) {
                if (auto live = pool.lock()) return live->give(q, bytes);
                std::free(q);
            },
            torch::TensorOptions().dtype(dtype));
    }

    // Frees every idle buffer.
    void release_idle() {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto& [bytes, list] : idle_)
            for (void* p : list) std::free(p);
        idle_.clear();
        idle_bytes_ = 0;
    }

    // (bytes held idle, takes served from an idle buffer so far)
    std::pair<int64_t, int64_t> counts() {
        std::lock_guard<std::mutex> lock(mutex_);
        return {(int64_t)idle_bytes_, reused_};
    }

  private:
    static constexpr size_t kAlign = 64;
    static size_t round_bytes(int64_t b) { return ((size_t)b + kAlign - 1) / kAlign * kAlign; }

    void give(void* p, size_t bytes) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            std::vector<void*>& list = idle_[bytes];
            if (list.size() < keep_per_size_ && idle_bytes_ + bytes <= keep_bytes_) {
                list.push_back(p);
                idle_bytes_ += bytes;
                return;
            }
        }
        std::free(p);
    }

    const size_t keep_per_size_, keep_bytes_;
    std::mutex mutex_;
    std::map<size_t, std::vector<void*>> idle_;  // by byte size
    size_t idle_bytes_ = 0;
    int64_t reused_ = 0;
};

}  // namespace repops_cpu
