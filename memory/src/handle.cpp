#include "devrt/memory/handle.hpp"

#include <cstddef>
#include <mutex>
#include <vector>

namespace devrt::memory {

namespace detail {

namespace {

// Free descriptors move between threads in batches of this many, linked through `next_released`.
constexpr std::uint32_t batch_size = 64;
// A thread keeps at most two batches; the process-wide pool at most this many batches (beyond,
// batches are deleted).
constexpr std::size_t max_shared_batches = 16384;
// Ids a thread takes from the process-wide counter at once.
constexpr std::uint64_t id_block = 1024;

std::atomic<std::uint64_t> id_counter{1};

/// Batches of free descriptors that threads gave back beyond their own cache.
struct shared_pool {
  std::mutex mutex;
  std::vector<descriptor*> batches;  // each the head of `batch_size` linked descriptors
};

shared_pool& shared() {
  // Never destroyed: threads give their caches back when they exit, which may be after the
  // destruction of statics.
  static auto* pool = new shared_pool();
  return *pool;
}

/// The calling thread's cache. Trivially destructible, so it stays usable while other
/// thread-local and static objects are destroyed; `gone` is set once its guard has emptied it.
struct thread_cache {
  descriptor* head = nullptr;
  std::uint32_t count = 0;
  bool guarded = false;
  bool gone = false;
  std::uint64_t next_id = 0;
  std::uint64_t end_id = 0;
};
thread_local thread_cache cache;

void delete_list(descriptor* d) noexcept {
  while (d != nullptr) {
    descriptor* next = d->next_released;
    delete d;
    d = next;
  }
}

/// Empties the thread's cache when the thread exits.
struct thread_cache_guard {
  thread_cache_guard() = default;
  thread_cache_guard(const thread_cache_guard&) = delete;
  thread_cache_guard& operator=(const thread_cache_guard&) = delete;
  ~thread_cache_guard() {
    delete_list(cache.head);
    cache.head = nullptr;
    cache.count = 0;
    cache.gone = true;
  }
};

void guard_cache() {
  static thread_local thread_cache_guard guard;
  (void)guard;
  cache.guarded = true;
}

bool refill_from_shared() {
  if (!cache.guarded) guard_cache();  // what the thread then holds is freed when it exits
  shared_pool& pool = shared();
  std::lock_guard lock(pool.mutex);
  if (pool.batches.empty()) return false;
  cache.head = pool.batches.back();
  cache.count = batch_size;
  pool.batches.pop_back();
  return true;
}

/// Moves one batch from the thread's cache to the process-wide pool.
void spill_to_shared() noexcept {
  descriptor* first = cache.head;
  descriptor* last = first;
  for (std::uint32_t i = 1; i < batch_size; ++i) last = last->next_released;
  cache.head = last->next_released;
  cache.count -= batch_size;
  last->next_released = nullptr;
  shared_pool& pool = shared();
  {
    std::lock_guard lock(pool.mutex);
    if (pool.batches.size() < max_shared_batches) {
      try {
        pool.batches.push_back(first);
        return;
      } catch (...) {
        // Out of host memory for the list: delete the batch instead.
      }
    }
  }
  delete_list(first);
}

}  // namespace

std::uint64_t next_memory_id() noexcept {
  if (cache.next_id == cache.end_id) {
    cache.next_id = id_counter.fetch_add(id_block, std::memory_order_relaxed);
    cache.end_id = cache.next_id + id_block;
  }
  return cache.next_id++;
}

descriptor* descriptor::create() {
  descriptor* d = nullptr;
  if (cache.head != nullptr || (!cache.gone && refill_from_shared())) {
    d = cache.head;
    cache.head = d->next_released;
    --cache.count;
    d->state.store(0, std::memory_order_relaxed);
    d->loc = location{};
    d->queue = nullptr;
    d->next_released = nullptr;
    d->place(nullptr, 0);
    d->stream = streams::device;
    d->stream_reg = nullptr;
    d->more_streams = nullptr;
    d->fence_at_free = false;
    d->held = false;
    d->sequence = 0;
  } else {
    d = new descriptor();
  }
  d->id = memory_id{next_memory_id()};
  return d;
}

void descriptor::destroy(descriptor* d) noexcept {
  d->failure.reset();
  delete d->more_streams;
  d->more_streams = nullptr;
  if (cache.gone) {
    delete d;
    return;
  }
  if (!cache.guarded) guard_cache();
  d->next_released = cache.head;
  cache.head = d;
  if (++cache.count >= 2 * batch_size) spill_to_shared();
}

void descriptor::release(std::uint64_t delta) noexcept {
  std::uint64_t old = state.load(std::memory_order_relaxed);
  for (;;) {
    if ((old & attached_bit) != 0 && (old & queued_bit) == 0 && total(old) == 2) {
      // Only the slice's own reference remains besides ours: hand our reference to the release
      // queue instead of dropping it, so the descriptor stays valid until the owner has seen it.
      const std::uint64_t next = (old - (delta & ~one_ref)) | queued_bit;
      if (state.compare_exchange_weak(old, next, std::memory_order_acq_rel, std::memory_order_relaxed)) {
        // This drop frees the memory: the streams it was used on are fenced here and now, while
        // they are known to exist.
        if (fence_at_free) record_free_fences(this);
        queue->push(this);
        return;
      }
      continue;
    }
    const std::uint64_t next = old - delta;
    if (state.compare_exchange_weak(old, next, std::memory_order_acq_rel, std::memory_order_relaxed)) {
      if (total(next) == 0) destroy(this);
      return;
    }
  }
}

}  // namespace detail

memory_handle memory_handle::make() {
  auto* d = detail::descriptor::create();
  d->add_handle();
  return adopt(d);
}

}  // namespace devrt::memory
