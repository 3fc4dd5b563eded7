// CUDA storage: device memory of one GPU, with a stream of its own (the device's stream).
//
// It is the composition of one mechanism per file under devices/src/cuda/:
// - pages from the driver's stream-ordered allocator (cudaMallocAsync on the device's stream),
//   given back with cudaFreeAsync there, so a free never synchronizes the device;
// - address ranges and the memory mapped into them (cuMemAddressReserve, cuMemCreate, cuMemMap,
//   cuMemSetAccess), run by the state machine the simulated device runs too (vmm.hpp, with the
//   unmapping lifecycle), over the driver (cuda_vmm_driver.cpp);
// - events (cuda_events.hpp): one pooled event type for stream fences, unmap batches, staged
//   copies and waits between streams, and the free-time fences of native streams;
// - pinned staging buffers (cuda_staging.hpp): writes and reads never make the owner wait;
// - graphs (cuda_graph.hpp) and peer access (cuda_peer.cpp).
//
// Stream order: memory goes back to the driver (an unmap, a page free) behind the work queued on
// the device's stream, after that stream has waited for the streams `return_after` names (the
// legacy stream, once frees on it are reused without fences). Everything a client's stream may
// still use is kept from the driver by the memory core's fences before it gets here. When the
// device's stream has nothing left to run, an unmap happens at once. The driver's functions are
// looked up through the runtime (cudaGetDriverEntryPointByVersion), so binaries do not link the
// driver.
//
// Graph capture: `begin_capture`/`end_capture` bracket stream capture on the device's stream; an
// allocation, a map, a copy or an event record on the device's stream inside the window is
// refused before anything is enqueued, and no queued free is flushed into a capture, so a captured
// graph never contains a driver call or a staging buffer.
//
// Threading: owned by one memory manager; called only from its owner thread, which it binds to
// the device (cudaSetDevice) on every call; free-time fences record from any thread.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "devrt/memory/storage.hpp"

namespace devrt::devices {

class vmm;
namespace cuda_detail {
struct driver_api;
class event_table;
class staging_pool;
}  // namespace cuda_detail

/// Number of CUDA devices usable by this process (0 without a driver or GPU).
int cuda_device_count() noexcept;

/// Where a CUDA storage's time with the driver went: calls and nanoseconds per kind, for the
/// replay tool and benchmarks. `map_total` and `flush_total` are whole `map` and `flush` calls
/// (the driver calls they make included; an unmap of idle memory, done at once, counts as a
/// flush), so what they hold beyond the driver calls is the storage's own work.
struct driver_profile {
  enum kind : std::uint8_t {
    address_reserve,  // cuMemAddressReserve
    create,           // cuMemCreate
    map,              // cuMemMap
    set_access,       // cuMemSetAccess
    unmap,            // cuMemUnmap
    release,          // cuMemRelease
    stream_query,     // cudaStreamQuery of the device's stream before unmapping
    map_total,        // cuda_storage::map, whole
    flush_total,      // cuda_storage::flush, settle and unmap_idle, whole
    kinds
  };
  std::array<std::uint64_t, kinds> calls{};
  std::array<std::uint64_t, kinds> ns{};
  static const char* name(kind k) noexcept;
};
/// Why no CUDA device is usable ("" when at least one is), for skip messages and logs.
std::string cuda_unavailable_reason();

class cuda_storage {
 public:
  /// Creates the storage of `device` and its stream. Throws devrt::exception (device_error) if
  /// the device cannot be used.
  explicit cuda_storage(int device);
  cuda_storage(const cuda_storage&) = delete;
  cuda_storage& operator=(const cuda_storage&) = delete;
  /// Waits for the whole device (every stream's work on its memory is done), frees every page and
  /// mapping, destroys the stream.
  ~cuda_storage();

  [[nodiscard]] std::uint64_t alignment() const noexcept { return props_.alignment; }
  [[nodiscard]] memory::device_properties properties() const noexcept { return props_; }
  /// Errors: out_of_memory (the driver's error name in the detail), capture_active, device_error.
  result<memory::storage_handle> alloc(std::uint64_t size);
  void dealloc(memory::storage_id id);
  /// cudaFreeAsync of every queued page on the stream, unmaps recorded behind the stream (or done
  /// at once when nothing is left to run), kept physical allocations released. Nothing while
  /// capturing. Error device_error (the queue is kept).
  result<void> flush();
  /// The requested unmaps recorded (done at once when nothing is left to run), their physical
  /// allocations kept for the maps that follow until the next flush. Error device_error.
  result<void> settle();
  [[nodiscard]] result<memory::resource> get(const memory::storage_handle& h);
  result<void> write(const memory::storage_handle& h, const void* src);
  /// Copies on the device's stream and waits for it. Error capture_active during a capture.
  result<void> read(const memory::storage_handle& h, void* dst);
  /// Bytes given back (queued pages, unmaps requested or recorded, kept allocations) that the
  /// device has not taken back yet: still held, and counted as reserved.
  [[nodiscard]] std::uint64_t returning_bytes() const noexcept;
  /// Memory a flush still has to give back.
  [[nodiscard]] std::size_t pending_deallocations() const noexcept;
  /// Mappings whose unmap has not happened yet (requested, or recorded behind an event).
  [[nodiscard]] std::size_t unmaps_in_flight() const noexcept;
  [[nodiscard]] std::string name() const { return name_; }
  /// cudaMemGetInfo's free bytes of this device (absent when the call fails).
  [[nodiscard]] std::optional<std::uint64_t> device_free();

  /// The stream; also binds the calling thread to the device, so that kernels the caller launches
  /// on the stream go to the right GPU.
  [[nodiscard]] void* native_stream() noexcept;
  /// The device's calls are about to run on this thread (the device thread, or a client serving a
  /// request in place): makes this device current on it and relaxes its stream-capture mode, so
  /// that a capture the client runs on a stream of its own (in any mode) refuses none of the
  /// device's calls; `return_thread` puts both back.
  [[nodiscard]] std::uint64_t borrow_thread() noexcept;
  void return_thread(std::uint64_t saved) noexcept;
  result<void> begin_capture();
  result<std::shared_ptr<memory::recorded_work>> end_capture();
  result<void> synchronize();
  [[nodiscard]] bool capturing() const noexcept { return capturing_; }

  // ---- Events and streams (see memory::queued_backend) ----
  /// Error capture_active on the device's stream during a capture, device_error.
  result<memory::event> record_event(memory::stream_id q);
  result<bool> query_event(memory::event t);
  result<void> wait_event(memory::event t);
  result<void> stream_wait_event(memory::stream_id q, memory::event t);
  void release_event(memory::event t) noexcept;
  /// cudaStreamGetId and cudaStreamGetDevice of a native stream (the device asked once per stream
  /// id: ids are never reused). Error invalid_argument.
  result<memory::stream_identity> identify(memory::stream_id s);
  /// Free-time fences of a native stream, with events of the stream's device.
  result<std::unique_ptr<memory::free_fence>> make_free_fence(memory::stream_id s, const memory::stream_identity& id);
  /// cudaDeviceSynchronize (counted in gpu_waits). Error capture_active while the device's stream
  /// records a capture.
  result<void> synchronize_device();
  /// Memory given back to the driver waits for the work queued on `s` too (a stream that lives as
  /// long as the device: the legacy stream; direct users of the storage may name others).
  void return_after(memory::stream_id s);
  /// Errors: capture_active (a copy on the device's stream during a capture), out_of_memory (no
  /// pinned memory), device_error.
  result<void> write_on(const memory::storage_handle& h, const void* src, memory::stream_id q);
  result<memory::event> read_async(const memory::storage_handle& h, void* dst, memory::stream_id q);
  /// Pinned host memory for a sleeping tag's contents (cudaHostAlloc). Error out_of_memory.
  result<void*> alloc_host(std::uint64_t size);
  /// cudaFreeHost, once the copies that used it are done (it waits for the device itself).
  void free_host(void* p, std::uint64_t size) noexcept;
  /// cudaMemcpyAsync between the view and pinned host memory on the device's stream, not waited
  /// for. Errors: capture_active, device_error.
  result<void> copy_to_host(const memory::storage_handle& h, void* dst);
  result<void> copy_from_host(const memory::storage_handle& h, const void* src);
  /// The CUDA stream that work for `q` is ordered on.
  [[nodiscard]] void* stream_of(memory::stream_id q) const noexcept;
  /// Times the owner thread waited for the GPU: an unmap that a map had to wait for, memory
  /// pressure, a device synchronization (for tests; 0 on the normal path).
  [[nodiscard]] std::uint64_t gpu_waits() const noexcept;
  /// Flushes whose unmaps went back at once because the device's stream had nothing left to run
  /// (no event, nothing returning).
  [[nodiscard]] std::uint64_t idle_releases() const noexcept;
  /// Pinned staging memory held (bytes).
  [[nodiscard]] std::uint64_t staging_bytes() const noexcept;

  [[nodiscard]] int device() const noexcept { return device_; }
  /// Bytes held from the driver: pages and physical allocations (kept ones included).
  [[nodiscard]] std::uint64_t allocated_bytes() const noexcept { return allocated_; }
  /// Pages and physical allocations made (cudaMallocAsync, cuMemCreate) and given back.
  [[nodiscard]] std::uint64_t driver_allocations() const noexcept { return driver_allocs_; }
  [[nodiscard]] std::uint64_t driver_frees() const noexcept { return driver_frees_; }

  // ---- Address ranges (properties().map_granularity != 0) ----
  /// Errors: unsupported, invalid_argument (not a granularity multiple), out_of_memory, device_error.
  result<memory::storage_handle> reserve_range(std::uint64_t size, std::uint64_t unit_size);
  /// One physical allocation for the whole call; `unmap` takes back exactly what one `map` call
  /// mapped. Errors: out_of_memory (after waiting once for pending unmaps), invalid_argument,
  /// capture_active, device_error.
  result<void> map(memory::storage_id range, std::uint64_t offset, std::uint64_t size);
  void unmap(memory::storage_id range, std::uint64_t offset, std::uint64_t size);
  /// Memory no queued work reaches (every stream that used it passed): cuMemUnmap now, not behind
  /// the stream's work; the physical memory is kept for the next map of its size until the next
  /// flush. While a capture records, or where the device cannot be made current, as `unmap`.
  void unmap_idle(memory::storage_id range, std::uint64_t offset, std::uint64_t size);
  /// Unmaps what is left behind the work in flight, and frees the addresses once its unmaps are done.
  void release_range(memory::storage_id range);
  /// Bytes of physical memory mapped into ranges, unmaps not yet completed included.
  [[nodiscard]] std::uint64_t mapped_bytes() const noexcept;
  /// Physical allocations created for ranges (cuMemCreate calls).
  [[nodiscard]] std::uint64_t physical_allocations() const noexcept;
  /// Maps that used a kept physical allocation instead of creating one.
  [[nodiscard]] std::uint64_t reused_allocations() const noexcept;
  /// Physical allocations kept after their unmap completed, and their bytes (held, counted as
  /// returning until the next map takes one of its size and releases the others, or the next
  /// flush releases them).
  [[nodiscard]] std::size_t kept_allocations() const noexcept;
  [[nodiscard]] std::uint64_t kept_bytes() const noexcept;
  /// Calls to the driver and their time (see driver_profile).
  [[nodiscard]] const driver_profile& profile() const noexcept { return profile_; }

  // ---- Peer access (cuda_peer.cpp) ----
  /// Makes this device's memory readable and writable by kernels and copies of the devices in
  /// `peers` (CUDA indices), replacing the previous list (devices left out lose access): every
  /// mapping of the ranges, those there now and every later one, gets one access descriptor per
  /// device (cuMemSetAccess), and the pool cudaMallocAsync pages come from (the device's current
  /// memory pool, cudaDeviceGetMemPool) gets the same (cudaMemPoolSetAccess; that pool is the
  /// process's, shared with any other user of it). Errors: invalid_argument (a peer that is not a
  /// device, the device itself, a peer listed twice), unsupported (no peer path between the two,
  /// cudaDeviceCanAccessPeer; or a peer without virtual memory management while ranges are in
  /// use), device_error. On an error from the driver the list may be applied in part.
  result<void> set_peer_access(std::vector<int> peers);
  /// The devices that may access this device's memory besides itself.
  [[nodiscard]] const std::vector<int>& peers() const noexcept { return peers_; }
  /// Whether the view is memory mapped into an address range (arena memory) rather than a page of
  /// cudaMallocAsync: another device reaches mapped memory only with peer access to it.
  [[nodiscard]] bool mapped(const memory::storage_handle& h) const noexcept;
  /// Whether device `peer` may read and write the memory mapped at `ptr` in one of the ranges
  /// (cuMemGetAccess), for tests and diagnostics. Errors: unsupported (no ranges), device_error.
  result<bool> mapped_access(const void* ptr, int peer) const;

 private:
  struct page {
    void* ptr;
    std::uint64_t size;
  };
  class vmm_driver_impl;  // cuda_vmm_driver.cpp
  result<void> bind_device() const;
  /// The device's stream waits for the work queued on the streams returns wait for.
  result<void> wait_for_return_streams();
  /// Sets the access of every device to the mapping at [at, at + size): read-write for the device
  /// and its peers, none for `revoked`.
  result<void> set_mapping_access(std::uint64_t at, std::uint64_t size, const std::vector<int>& revoked) const;
  /// capture_active when a copy or an event on `q` would be recorded into the capture.
  result<void> refuse_in_capture(memory::stream_id q, const char* what) const;

  int device_;
  std::string name_;
  memory::device_properties props_;
  void* stream_ = nullptr;  // cudaStream_t
  bool capturing_ = false;
  std::unordered_map<memory::storage_id, page> pages_;
  std::vector<memory::storage_id> pending_;
  std::uint64_t allocated_ = 0;
  std::uint64_t driver_allocs_ = 0;
  std::uint64_t driver_frees_ = 0;
  memory::storage_id next_id_ = 1;
  std::shared_ptr<const cuda_detail::driver_api> api_;
  mutable driver_profile profile_;  // counted from const calls too (set_mapping_access)
  std::unique_ptr<cuda_detail::event_table> events_;
  std::unique_ptr<cuda_detail::staging_pool> staging_;
  std::unique_ptr<vmm_driver_impl> vmm_driver_;
  std::unique_ptr<vmm> vmm_;
  std::vector<memory::stream_id> return_after_;  // streams returns wait for besides the device's own
  std::uint64_t gpu_waits_ = 0;
  // The devices of streams identified lately, by stream id (direct-mapped; a reserve on a client's
  // stream identifies it every time, and its device never changes). uid 0: an empty entry.
  struct known_stream {
    std::uint64_t uid = 0;
    int device = 0;
  };
  std::array<known_stream, 64> known_streams_{};
  std::vector<int> peers_;  // devices given access to this device's memory (set_peer_access)
};

static_assert(memory::storage_backend<cuda_storage>);
static_assert(memory::queued_backend<cuda_storage>);
static_assert(memory::mapping_backend<cuda_storage>);

}  // namespace devrt::devices
