// Events of one CUDA device: the one event mechanism of the storage, for stream fences, unmap
// batches, staged copies and the waits between streams. Events are pooled (cudaEventCreate costs
// about a microsecond) and handed to the memory core as ids (`memory::event`): generation << 32 |
// (slot + 1), so an id that was finished never names a later event. Free-time fences of native
// streams (`stream_free_fence`) move one event forward at every free and hand it over as an id.
//
// Threading: the owner's thread, except `stream_free_fence::record`, which any thread calls.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "devrt/memory/error.hpp"
#include "devrt/memory/storage.hpp"

namespace devrt::devices::cuda_detail {

class staging_pool;

/// A pinned host buffer of the staging pool.
struct staging_buffer {
  void* ptr = nullptr;
  std::uint64_t size = 0;
};

class event_table {
 public:
  explicit event_table(int device) : device_(device) {}
  event_table(const event_table&) = delete;
  event_table& operator=(const event_table&) = delete;
  /// Destroys every event (the device has drained) and frees the buffers of staged reads.
  ~event_table();

  /// An event behind the work queued on `s` so far. Error device_error.
  result<memory::event> record(cudaStream_t s);
  /// An id for an event recorded elsewhere (a free fence's); `foreign`: of another device,
  /// destroyed rather than pooled when done.
  memory::event adopt(cudaEvent_t ev, bool foreign);
  /// Once `e` has passed, copies `bytes` from the staging buffer into `dst` and gives the buffer
  /// back to `pool` (a staged read).
  void on_completion(memory::event e, staging_buffer b, void* dst, std::uint64_t bytes, staging_pool* pool);
  /// Whether `e` passed, without blocking; once it has (or failed), its completion is done and the
  /// id is gone. An unknown id has passed. Error device_error.
  result<bool> query(memory::event e);
  /// Blocks until `e` has passed. Error device_error.
  result<void> wait(memory::event e);
  /// Later work on `s` waits for `e`; the id stays. Error device_error.
  result<void> stream_wait(cudaStream_t s, memory::event e);
  /// The id is no longer needed. A staged read's buffer goes back only once its copy is done.
  void release(memory::event e) noexcept;
  /// The event behind an id (nullptr: unknown or finished).
  [[nodiscard]] cudaEvent_t event_of(memory::event e) const noexcept;
  /// An event of this device from the pool, or a new one. Error device_error.
  result<cudaEvent_t> take();
  void give(cudaEvent_t ev) noexcept;

 private:
  struct slot {
    cudaEvent_t event = nullptr;
    staging_buffer staging;  // a staged read's buffer, given back on completion
    staging_pool* pool = nullptr;
    void* dst = nullptr;  // where a staged read copies its bytes once the event completed
    std::uint64_t bytes = 0;
    std::uint32_t generation = 0;
    bool live = false;
    bool foreign = false;
  };
  slot* find(memory::event e) noexcept;
  [[nodiscard]] const slot* find(memory::event e) const noexcept;
  void finish(slot& s, bool copy) noexcept;

  int device_;
  std::vector<cudaEvent_t> free_;
  std::vector<slot> slots_;
  std::vector<std::uint32_t> free_slots_;
};

/// The free-time fences of one native stream: `record` records the current event again (from the
/// freeing thread, under a spin lock held only around the record); `take` hands it to the owner as
/// an id and puts a fresh event in its place. Events of another device's stream are made on that
/// device.
class stream_free_fence final : public memory::free_fence {
 public:
  stream_free_fence(event_table& events, cudaStream_t stream, int device, bool foreign, cudaEvent_t first)
      : events_(events), stream_(stream), device_(device), foreign_(foreign), current_(first) {}
  stream_free_fence(const stream_free_fence&) = delete;
  stream_free_fence& operator=(const stream_free_fence&) = delete;
  ~stream_free_fence() override;
  void record() noexcept override;
  result<memory::event> take() override;
  /// A new event of `device` (the current device is put back after). Error device_error.
  static result<cudaEvent_t> make_event(int device);

 private:
  result<cudaEvent_t> fresh();

  event_table& events_;
  cudaStream_t stream_;
  int device_;
  bool foreign_;
  std::atomic_flag lock_ = ATOMIC_FLAG_INIT;
  cudaEvent_t current_;        // under lock_
  std::uint64_t records_ = 0;  // under lock_: records into current_ since the last take
  bool failed_ = false;        // under lock_: a record failed since the last take
};

}  // namespace devrt::devices::cuda_detail
