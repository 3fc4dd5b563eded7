// Pinned staging memory of one CUDA device: host-to-device and device-to-host copies go through
// pinned buffers, so that a copy never makes the calling thread wait for the GPU (from pageable
// memory the driver stages itself and may wait). Buffers are rounded up to a power of two of at
// least 64 KiB and kept for the next copy: freeing pinned memory would synchronize the device.
//
// Threading: the owner's thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "cuda_events.hpp"
#include "devrt/memory/error.hpp"

namespace devrt::devices::cuda_detail {

class staging_pool {
 public:
  /// Copies up to this size are staged.
  static constexpr std::uint64_t max_staged = std::uint64_t{64} << 20;

  staging_pool() = default;
  staging_pool(const staging_pool&) = delete;
  staging_pool& operator=(const staging_pool&) = delete;
  /// Frees every buffer (the device has drained).
  ~staging_pool();

  /// The smallest free buffer that holds `size` bytes, or a new one. Error out_of_memory.
  result<staging_buffer> take(std::uint64_t size, event_table& events);
  void give(staging_buffer b) noexcept;
  /// `b` is used by work queued before `ev` (an event of `events`' device unless `foreign`): it
  /// goes back to the pool once `ev` has passed, and `ev` with it.
  void give_after(event_table& events, cudaEvent_t ev, staging_buffer b, bool foreign) noexcept;
  /// Gives back the buffers whose events passed.
  void recycle(event_table& events) noexcept;
  /// Pinned bytes held.
  [[nodiscard]] std::uint64_t bytes() const noexcept { return bytes_; }

 private:
  struct in_flight {
    cudaEvent_t ev;
    staging_buffer b;
    bool foreign;
  };
  std::vector<staging_buffer> free_;
  std::vector<in_flight> in_flight_;
  std::uint64_t bytes_ = 0;
};

}  // namespace devrt::devices::cuda_detail
