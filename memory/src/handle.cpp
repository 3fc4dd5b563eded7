#include "devrt/memory/handle.hpp"

namespace devrt::memory {

namespace detail {

std::uint64_t next_memory_id() noexcept {
  static std::atomic<std::uint64_t> counter{1};
  return counter.fetch_add(1, std::memory_order_relaxed);
}

descriptor* descriptor::create() {
  auto* d = new descriptor();
  d->id = memory_id{next_memory_id()};
  return d;
}

void descriptor::renew() noexcept {
  id = memory_id{next_memory_id()};
  loc = location{};
  queue = nullptr;
  next_released = nullptr;
}

void descriptor::release(std::uint64_t delta) noexcept {
  std::uint64_t old = state.load(std::memory_order_relaxed);
  for (;;) {
    if ((old & attached_bit) != 0 && (old & queued_bit) == 0 && total(old) == 2) {
      // Only the slice's own reference remains besides ours: hand our reference to the release
      // queue instead of dropping it, so the descriptor stays valid until the owner has seen it.
      const std::uint64_t next = (old - (delta & ~one_ref)) | queued_bit;
      if (state.compare_exchange_weak(old, next, std::memory_order_acq_rel, std::memory_order_relaxed)) {
        queue->push(this);
        return;
      }
      continue;
    }
    const std::uint64_t next = old - delta;
    if (state.compare_exchange_weak(old, next, std::memory_order_acq_rel, std::memory_order_relaxed)) {
      if (total(next) == 0) delete this;
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
