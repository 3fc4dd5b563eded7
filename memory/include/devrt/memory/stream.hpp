// Streams: the device queues that allocations are used on.
//
// Every allocation is used on a stream: the device's own by default, or one the client names (a
// CUDA stream of its own, the legacy default stream, the per-thread default stream). When its last
// handle is dropped, the memory is free in stream order: an allocation on the same stream may
// reuse it at once, and any other reuse, an unmap or a return to the driver waits for an event
// recorded on every stream that used it. Devices without queues (host, sim) accept every stream
// and ignore it: their work is done when the call that does it returns.
//
// The memory core sees a stream as a `queue_id`, an opaque 64-bit value: 0 never names a stream
// (it tags memory that is free for every stream), small values name the special streams, and
// anything else is the native handle (a cudaStream_t) itself.
#pragma once

#include <cstdint>

namespace devrt::memory {

/// A stream as the memory core sees it (see `stream::id`).
using queue_id = std::uint64_t;

/// The queue ids that do not carry a native handle.
namespace queue {
inline constexpr queue_id none = 0;        ///< no stream: memory tagged with it is free for all
inline constexpr queue_id legacy = 1;      ///< CUDA's legacy default stream (cudaStreamLegacy, or 0)
inline constexpr queue_id per_thread = 2;  ///< the calling thread's per-thread default stream
inline constexpr queue_id device = 3;      ///< the device's own stream (devrt's)
/// Whether frees on `q` may be reused at once by later work on the same `q`: not for the
/// per-thread default stream, which names a different stream on every thread.
constexpr bool reusable_in_order(queue_id q) noexcept { return q != none && q != per_thread; }
}  // namespace queue

/// A device queue named by a client. Cheap to copy; compares by identity.
///
///     devrt::memory::stream s = devrt::memory::stream::native(my_cuda_stream);
///     auto h = client.reserve(bytes, s).get();   // used on my_cuda_stream
class stream {
 public:
  /// The device's own stream (the default everywhere).
  constexpr stream() noexcept = default;
  /// A native queue: a cudaStream_t on CUDA devices. nullptr (0) and cudaStreamLegacy name the
  /// legacy default stream, cudaStreamPerThread the per-thread default stream.
  static stream native(void* s) noexcept {
    const auto v = reinterpret_cast<std::uintptr_t>(s);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
    if (v == 0 || v == 1) return stream(queue::legacy);
    if (v == 2) return stream(queue::per_thread);
    return stream(static_cast<queue_id>(v));
  }
  /// CUDA's legacy default stream.
  static constexpr stream legacy() noexcept { return stream(queue::legacy); }
  /// The per-thread default stream of the thread that uses it.
  static constexpr stream per_thread() noexcept { return stream(queue::per_thread); }
  /// The stream whose memory-core id is `id` (`id()` of another stream).
  static constexpr stream from_id(queue_id id) noexcept { return stream(id == queue::none ? queue::device : id); }

  /// The memory core's id of this stream (never queue::none).
  [[nodiscard]] constexpr queue_id id() const noexcept { return id_; }
  [[nodiscard]] constexpr bool is_device_stream() const noexcept { return id_ == queue::device; }
  /// The native handle to launch on: the cudaStream_t, cudaStreamLegacy (1) or
  /// cudaStreamPerThread (2); nullptr for the device's own stream (ask the client for it).
  [[nodiscard]] void* native_handle() const noexcept {
    return id_ == queue::device ? nullptr : reinterpret_cast<void*>(static_cast<std::uintptr_t>(id_));  // NOLINT
  }
  friend constexpr bool operator==(stream, stream) = default;

 private:
  constexpr explicit stream(queue_id id) noexcept : id_(id) {}
  queue_id id_ = queue::device;
};

}  // namespace devrt::memory
