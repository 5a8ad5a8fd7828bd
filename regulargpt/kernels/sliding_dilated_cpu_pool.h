// The output buffers of the fused sliding-dilated CPU kernel (included by sliding_dilated_cpu.cpp, after ATen).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/strides.h>

#include <sys/mman.h>

#include <cstdlib>
#include <map>
#include <mutex>

namespace sdpool {

// Outputs of kPooledBytes and more live in buffers kept for reuse (up to kPoolBytes of freed ones, by exact size):
// a fresh 33.5 MB output costs ~11 ms of page faults even on huge pages, more than writing it, and training asks for
// the same sizes at every step. New buffers are aligned to, and advised onto, transparent huge pages.
class Pool {
 public:
  static Pool& get() {
    static Pool* pool = new Pool;  // never destroyed: tensors may be freed after static destructors ran
    return *pool;
  }
  void* take(size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = free_.find(bytes); it != free_.end()) {
        void* p = it->second;
        free_.erase(it), cached_ -= bytes;
        return p;
      }
    }
    const size_t mapped = (bytes + kHuge - 1) / kHuge * kHuge;
    void* p = std::aligned_alloc(kHuge, mapped);
    TORCH_CHECK(p != nullptr, "sliding_dilated_cpu: out of memory allocating ", bytes, " bytes");
    madvise(p, mapped, MADV_HUGEPAGE);  // advice only
    return p;
  }
  void give(void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cached_ + bytes > kPoolBytes) return std::free(p);
    free_.emplace(bytes, p), cached_ += bytes;
  }

 private:
  static constexpr size_t kHuge = size_t(1) << 21, kPoolBytes = size_t(1) << 30;
  std::mutex mutex_;
  std::multimap<size_t, void*> free_;
  size_t cached_ = 0;
};

at::Tensor output(at::IntArrayRef sizes, at::IntArrayRef strides, const at::TensorOptions& options) {
  constexpr size_t kPooledBytes = size_t(1) << 20;
  const size_t bytes = at::detail::computeStorageNbytes(sizes, strides, options.dtype().itemsize());
  if (bytes < kPooledBytes) return at::empty_strided(sizes, strides, options);
  return at::from_blob(Pool::get().take(bytes), sizes, strides, [bytes](void* p) { Pool::get().give(p, bytes); },
                       options);
}

at::Tensor output(at::IntArrayRef sizes, const at::TensorOptions& options) {  // contiguous
  return output(sizes, c10::contiguous_strides(sizes), options);
}

}  // namespace sdpool
