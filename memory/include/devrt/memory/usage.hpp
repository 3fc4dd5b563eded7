// Memory usage and statistics of a manager or a pool.
#pragma once

#include <cstdint>
#include <string>

namespace devrt::memory {

/// A snapshot of what a pool (or a whole manager) holds.
struct memory_usage {
  std::uint64_t number_allocs = 0;   ///< live allocations
  std::uint64_t bytes_in_use = 0;    ///< bytes requested by live allocations
  std::uint64_t bytes_padding = 0;   ///< alignment padding of live allocations
  std::uint64_t bytes_reserved = 0;  ///< bytes held from the device

  memory_usage& operator+=(const memory_usage& o) noexcept {
    number_allocs += o.number_allocs;
    bytes_in_use += o.bytes_in_use;
    bytes_padding += o.bytes_padding;
    bytes_reserved += o.bytes_reserved;
    return *this;
  }
  friend memory_usage operator+(memory_usage a, const memory_usage& b) noexcept { return a += b; }
  friend bool operator==(const memory_usage&, const memory_usage&) = default;

  /// Multi-line readable report.
  [[nodiscard]] std::string to_string() const;
};

/// For the pools' invariant checks: empty when a pool's running counters equal what its slices
/// (or pages) add up to, otherwise a sentence naming `what` (such as "arena 0") and both sets of
/// figures.
[[nodiscard]] std::string usage_mismatch(const memory_usage& counted, const memory_usage& summed,
                                         const std::string& what);

/// Running statistics of a manager: current and peak values, and event counts.
struct memory_statistics {
  /// Bytes the pools hold from the device.
  std::uint64_t bytes_reserved = 0;
  /// Bytes the pools gave back that the device has not taken back yet (queued frees, unmaps behind
  /// queued work); the memory the device holds for devrt is bytes_reserved + bytes_returning.
  std::uint64_t bytes_returning = 0;
  /// Peak of what the device held for devrt (bytes_reserved + bytes_returning).
  std::uint64_t peak_bytes_reserved = 0;
  std::uint64_t bytes_in_use = 0;
  std::uint64_t peak_bytes_in_use = 0;
  std::uint64_t reserves = 0;         ///< successful reserves
  std::uint64_t driver_allocs = 0;    ///< pages allocated from the storage
  std::uint64_t driver_frees = 0;     ///< pages returned to the storage
  std::uint64_t maps = 0;             ///< memory mapped into address ranges (calls)
  std::uint64_t unmaps = 0;           ///< memory unmapped from address ranges (calls)
  std::uint64_t failed_reserves = 0;  ///< reserves that returned an error
  std::uint64_t out_of_memory = 0;    ///< storage allocations refused by the device
  std::uint64_t out_of_memory_errors =
      0;                       ///< reserves and wakes that failed with out_of_memory (after a reclaim and retry)
  std::uint64_t cleanups = 0;  ///< explicit cleanups run
  std::uint64_t reclaims = 0;  ///< cleanups forced by an out-of-memory before a retry
  std::uint64_t stream_waits =
      0;  ///< times the device waited for its streams (memory pressure: fences, memory on its way back)
  std::uint64_t fences = 0;                  ///< fences recorded on streams (one per stream per batch of frees)
  std::uint64_t streams = 0;                 ///< streams whose memory devrt tracks now (registrations alive)
  std::uint64_t stream_registrations = 0;    ///< streams registered so far (a reused handle counts anew)
  std::uint64_t broken_streams = 0;          ///< registrations whose fence could not be recorded or queried
  std::uint64_t bytes_held_for_streams = 0;  ///< freed bytes kept until their streams' fences pass
  /// The floor that stream order sets under the memory held: the peak of bytes in use plus bytes
  /// freed on streams whose fences had not passed, sampled after each reserve that polled the
  /// fences before mapping, and at least the peak in use (0 on devices without streams, and while
  /// no reserve had to poll). Memory still busy on a stream can neither serve another stream nor
  /// go back, so any allocator that hands out memory only once such fences show it passed holds at
  /// least this much, and peak_bytes_in_use / peak_bytes_busy bounds its memory efficiency.
  std::uint64_t peak_bytes_busy = 0;
  std::uint64_t bytes_sleeping = 0;     ///< memory unmapped by sleeping tags (memory/tag.hpp), mapped again on wake
  std::uint64_t bytes_offloaded = 0;    ///< host memory holding the contents sleeping tags kept
  std::uint64_t bytes_host_cached = 0;  ///< pinned host memory kept for later sleeps' copies (no contents)
  std::uint64_t sleeps = 0;             ///< tags put to sleep
  std::uint64_t wakes = 0;              ///< tags woken

  [[nodiscard]] std::string to_string() const;
};

}  // namespace devrt::memory
