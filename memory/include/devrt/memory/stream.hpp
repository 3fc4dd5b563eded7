// Streams: the device queues that allocations are used on.
//
// Every allocation is used on a stream: the device's own by default, or one the client names (a
// CUDA stream of its own, the legacy default stream, the per-thread default stream). When its last
// handle is dropped, the memory is free in stream order: an allocation on the same stream may
// reuse it at once, and any other reuse, an unmap or a return to the driver waits for an event
// recorded on every stream that used it. Devices without queues (host, sim) accept every stream
// and ignore it: their work is done when the call that does it returns.
//
// The memory core sees a stream as a `stream_id`, an opaque 64-bit value: 0 never names a stream,
// small values name the streams without a handle of their own, and anything else is the native
// handle (a cudaStream_t) itself. A handle names a stream only while that stream lives: the driver
// may give the same handle to a stream created later, so the memory core keys what it knows of a
// stream by the device's identity of it (stream_order.hpp), not by the handle.
#pragma once

#include <cstdint>

namespace devrt::memory {

/// A stream as the memory core sees it (see `stream::id`).
using stream_id = std::uint64_t;

/// The stream ids that do not carry a native handle.
namespace streams {
inline constexpr stream_id none = 0;        ///< no stream
inline constexpr stream_id legacy = 1;      ///< CUDA's legacy default stream (cudaStreamLegacy, or 0)
inline constexpr stream_id per_thread = 2;  ///< the calling thread's per-thread default stream
inline constexpr stream_id device = 3;      ///< the device's own stream (devrt's)
/// Whether frees on `q` may be reused at once by later work on the same `q`: not for the
/// per-thread default stream, which names a different stream on every thread.
constexpr bool reusable_in_order(stream_id q) noexcept { return q != none && q != per_thread; }
/// Whether `q` is a stream a client created (a handle of its own), which may be destroyed at any
/// time after the memory used on it was freed.
constexpr bool is_native(stream_id q) noexcept { return q > device; }
}  // namespace streams

/// A stream named by a client. Cheap to copy; compares by handle.
///
///     devrt::memory::stream s = devrt::memory::stream::native(my_cuda_stream);
///     auto h = client.reserve(bytes, s).get();   // used on my_cuda_stream
class stream {
 public:
  /// The device's own stream (the default everywhere).
  constexpr stream() noexcept = default;
  /// The device's own stream, by name.
  static constexpr stream device() noexcept { return stream(streams::device); }
  /// A native stream: a cudaStream_t on CUDA devices. nullptr (0) and cudaStreamLegacy name the
  /// legacy default stream, cudaStreamPerThread the per-thread default stream.
  static stream native(void* s) noexcept {
    const auto v = reinterpret_cast<std::uintptr_t>(s);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
    if (v == 0 || v == 1) return stream(streams::legacy);
    if (v == 2) return stream(streams::per_thread);
    return stream(static_cast<stream_id>(v));
  }
  /// CUDA's legacy default stream.
  static constexpr stream legacy() noexcept { return stream(streams::legacy); }
  /// The per-thread default stream of the thread that uses it.
  static constexpr stream per_thread() noexcept { return stream(streams::per_thread); }
  /// The stream whose memory-core id is `id` (`id()` of another stream).
  static constexpr stream from_id(stream_id id) noexcept { return stream(id == streams::none ? streams::device : id); }

  /// The memory core's id of this stream (never streams::none).
  [[nodiscard]] constexpr stream_id id() const noexcept { return id_; }
  [[nodiscard]] constexpr bool is_device_stream() const noexcept { return id_ == streams::device; }
  /// The native handle to launch on: the cudaStream_t, cudaStreamLegacy (1) or
  /// cudaStreamPerThread (2); nullptr for the device's own stream (ask the client for it).
  [[nodiscard]] void* native_handle() const noexcept {
    return id_ == streams::device ? nullptr : reinterpret_cast<void*>(static_cast<std::uintptr_t>(id_));  // NOLINT
  }
  friend constexpr bool operator==(stream, stream) = default;

 private:
  constexpr explicit stream(stream_id id) noexcept : id_(id) {}
  stream_id id_ = streams::device;
};

}  // namespace devrt::memory
