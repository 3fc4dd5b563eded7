#include "cuda_events.hpp"

#include <cstring>
#include <utility>

#include "cuda_driver.hpp"
#include "cuda_staging.hpp"

namespace devrt::devices::cuda_detail {

event_table::~event_table() {
  for (auto& s : slots_) {
    if (!s.live) continue;
    if (s.staging.ptr != nullptr) cudaFreeHost(s.staging.ptr);
    if (s.event != nullptr) cudaEventDestroy(s.event);
  }
  for (cudaEvent_t ev : free_) cudaEventDestroy(ev);
}

result<cudaEvent_t> event_table::take() {
  if (!free_.empty()) {
    cudaEvent_t ev = free_.back();
    free_.pop_back();
    return ev;
  }
  cudaEvent_t ev = nullptr;
  if (auto e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess) {
    return cuda_error(e, "cudaEventCreateWithFlags failed");
  }
  return ev;
}

void event_table::give(cudaEvent_t ev) noexcept {
  try {
    free_.push_back(ev);
  } catch (...) {
    cudaEventDestroy(ev);
  }
}

memory::event event_table::adopt(cudaEvent_t ev, bool foreign) {
  std::uint32_t index = 0;
  if (!free_slots_.empty()) {
    index = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slots_.emplace_back();
    index = static_cast<std::uint32_t>(slots_.size() - 1);
  }
  slot& s = slots_[index];
  const std::uint32_t generation = s.generation + 1;
  s = slot{};
  s.event = ev;
  s.generation = generation;
  s.live = true;
  s.foreign = foreign;
  return (static_cast<memory::event>(generation) << 32) | (index + 1);
}

event_table::slot* event_table::find(memory::event e) noexcept {
  const auto index = static_cast<std::uint32_t>(e & 0xffffffffU);
  if (index == 0 || index > slots_.size()) return nullptr;
  slot& s = slots_[index - 1];
  if (!s.live || s.generation != static_cast<std::uint32_t>(e >> 32)) return nullptr;
  return &s;
}

const event_table::slot* event_table::find(memory::event e) const noexcept {
  return const_cast<event_table*>(this)->find(e);  // NOLINT(cppcoreguidelines-pro-type-const-cast)
}

cudaEvent_t event_table::event_of(memory::event e) const noexcept {
  const slot* s = find(e);
  return s != nullptr ? s->event : nullptr;
}

result<memory::event> event_table::record(cudaStream_t stream) {
  auto ev = take();
  if (!ev) return std::move(ev).err();
  if (auto e = cudaEventRecord(*ev, stream); e != cudaSuccess) {
    give(*ev);
    return cuda_error(e, "cudaEventRecord failed");
  }
  return adopt(*ev, false);
}

void event_table::on_completion(memory::event e, staging_buffer b, void* dst, std::uint64_t bytes, staging_pool* pool) {
  slot* s = find(e);
  if (s == nullptr) return;
  s->staging = b;
  s->pool = pool;
  s->dst = dst;
  s->bytes = bytes;
}

void event_table::finish(slot& s, bool copy) noexcept {
  if (s.staging.ptr != nullptr) {
    if (copy && s.dst != nullptr && s.bytes > 0) std::memcpy(s.dst, s.staging.ptr, s.bytes);
    if (s.pool != nullptr) s.pool->give(s.staging);
  }
  if (s.foreign) {
    cudaEventDestroy(s.event);
  } else {
    give(s.event);
  }
  s.event = nullptr;
  s.staging = {};
  s.pool = nullptr;
  s.dst = nullptr;
  s.live = false;
  try {
    free_slots_.push_back(static_cast<std::uint32_t>(&s - slots_.data()));
  } catch (...) {
    // The slot is lost to reuse; the table stays correct.
  }
}

result<bool> event_table::query(memory::event e) {
  slot* s = find(e);
  if (s == nullptr) return true;
  const cudaError_t q = cudaEventQuery(s->event);
  if (q == cudaErrorNotReady) {
    // Not an error, but cleared as one: the query may run on a client's thread (a request served
    // in place), whose next launch check must not see it.
    (void)cudaGetLastError();
    return false;
  }
  finish(*s, q == cudaSuccess);
  if (q != cudaSuccess) return cuda_error(q, "cudaEventQuery failed");
  return true;
}

result<void> event_table::wait(memory::event e) {
  slot* s = find(e);
  if (s == nullptr) return {};
  if (auto r = cudaEventSynchronize(s->event); r != cudaSuccess) return cuda_error(r, "cudaEventSynchronize failed");
  return {};
}

result<void> event_table::stream_wait(cudaStream_t stream, memory::event e) {
  slot* s = find(e);
  if (s == nullptr) return {};
  // Enqueued with the event as it is now: the event may be recorded again at once.
  if (auto r = cudaStreamWaitEvent(stream, s->event, 0); r != cudaSuccess) {
    return cuda_error(r, "cudaStreamWaitEvent failed");
  }
  return {};
}

void event_table::release(memory::event e) noexcept {
  slot* s = find(e);
  if (s == nullptr) return;
  if (s->staging.ptr != nullptr && s->pool != nullptr) {
    // A copy may still write the buffer: it goes back once its event passed, the bytes unread.
    s->pool->give_after(*this, s->event, s->staging, s->foreign);
    s->staging = {};
    s->event = nullptr;
    s->live = false;
    try {
      free_slots_.push_back(static_cast<std::uint32_t>(s - slots_.data()));
    } catch (...) {
    }
    return;
  }
  finish(*s, false);
}

// ---- Free-time fences ----

result<cudaEvent_t> stream_free_fence::make_event(int device) {
  const restore_current_device restore;
  cudaSetDevice(device);
  cudaEvent_t ev = nullptr;
  if (auto e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess) {
    return cuda_error(e, "cudaEventCreateWithFlags failed");
  }
  return ev;
}

stream_free_fence::~stream_free_fence() {
  if (current_ != nullptr) cudaEventDestroy(current_);
}

void stream_free_fence::record() noexcept {
  while (lock_.test_and_set(std::memory_order_acquire)) {
  }
  if (cudaEventRecord(current_, stream_) == cudaSuccess) {
    ++records_;
  } else {
    cudaGetLastError();
    failed_ = true;
  }
  lock_.clear(std::memory_order_release);
}

result<cudaEvent_t> stream_free_fence::fresh() { return foreign_ ? make_event(device_) : events_.take(); }

result<memory::event> stream_free_fence::take() {
  auto next = fresh();
  if (!next) return std::move(next).err();
  while (lock_.test_and_set(std::memory_order_acquire)) {
  }
  const bool failed = std::exchange(failed_, false);
  cudaEvent_t taken = nullptr;
  if (!failed && records_ > 0) {
    taken = std::exchange(current_, *next);
    records_ = 0;
  }
  lock_.clear(std::memory_order_release);
  if (taken == nullptr) {
    if (foreign_) {
      cudaEventDestroy(*next);
    } else {
      events_.give(*next);
    }
  }
  if (failed) {
    return error::make(
        errc::device_error,
        "a free-time cudaEventRecord failed (the stream was destroyed before its memory was freed, or is "
        "being captured)");
  }
  if (taken == nullptr) return memory::event{0};
  return events_.adopt(taken, foreign_);
}

}  // namespace devrt::devices::cuda_detail
