// CUDA storage: device memory of one GPU, with a stream of its own (the device's stream) and the
// streams of its users.
//
// Pages come from the driver's stream-ordered allocator (cudaMallocAsync on the device's stream);
// queued deallocations are flushed with cudaFreeAsync on the same stream, so a free never
// synchronizes the device. Every stream that uses the memory is known (`use_queue`): before memory
// goes back to the driver, the device's stream is made to wait for the work queued on each of
// them (an event per stream, cudaStreamWaitEvent), so a return never overtakes a user's kernel.
//
// Tickets are pooled events: `mark` records one on a stream, `passed` queries it without
// blocking. Copies never make the calling thread wait for the GPU: `write_on` stages the bytes in
// pinned host memory from a small pool of the device's and copies from there, `read_async`
// copies into pinned memory and hands the bytes over once its event has passed. (`read` and
// `synchronize` still wait, for callers that want exactly that.) The legacy default stream is
// used as it is; work for the per-thread default stream of a client is ordered on the legacy
// stream, which waits for every blocking stream, the per-thread ones included.
//
// Address ranges: where the driver offers virtual memory management, the storage also reserves
// address ranges (cuMemAddressReserve) and maps physical memory into them (cuMemCreate, cuMemMap,
// cuMemSetAccess), one physical allocation per `map` call, for the arena pool. Unmapping is
// stream-ordered without a synchronization: `unmap` only marks the mapping, `flush` records an
// event behind the work queued so far (on every stream in use) and the mapping is unmapped and
// released once the event completed (checked at later flushes and maps). A physical allocation
// whose unmap completed outside a flush (a `settle`, a map) is kept, so that a map of the same
// size right after it (the arena unmaps free memory and maps new memory in the same reserve) maps
// it again at its new address instead of a cuMemRelease and a cuMemCreate. Kept memory counts as
// returning; what the next map does not take goes back in that map, before it counts (and at the
// next flush), so the device never holds kept memory and new memory together. Each mapping remembers
// the batch of its unmap, so a mapping mapped again (same bounds) before its unmap happened and
// unmapped again is released only by its own, newer batch. The driver's functions are looked up
// through the runtime (cudaGetDriverEntryPointByVersion), so binaries do not link the driver.
//
// Graph capture: `begin_capture`/`end_capture` bracket stream capture on the device's stream; an
// allocation inside the window is refused (the persistent pool must be warmed first), and no
// queued free is flushed into a capture, so a captured graph never contains a driver call.
//
// Threading: owned by one memory manager; called only from its owner thread, which it binds to
// the device (cudaSetDevice) on every call.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "devrt/memory/storage.hpp"

namespace devrt::devices {

/// Number of CUDA devices usable by this process (0 without a driver or GPU).
int cuda_device_count() noexcept;

/// Where a CUDA storage's time with the driver went: calls and nanoseconds per kind, for the
/// replay tool and benchmarks. `map_total` and `flush_total` are whole `map` and `flush` calls
/// (the driver calls they make included), so what they hold beyond the driver calls is the
/// storage's own work.
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
    flush_total,      // cuda_storage::flush, whole
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
  /// Frees every page, waits for the stream and destroys it.
  ~cuda_storage();

  [[nodiscard]] std::uint64_t alignment() const noexcept { return props_.alignment; }
  [[nodiscard]] memory::device_properties properties() const noexcept { return props_; }
  /// Errors: out_of_memory (the driver's error name in the detail), capture_active, device_error.
  result<memory::storage_handle> alloc(std::uint64_t size);
  void dealloc(memory::storage_id id);
  /// cudaFreeAsync of every queued page on the stream, unmaps recorded behind the streams in use
  /// (or done at once when nothing is left to run), kept physical allocations released. Error
  /// device_error.
  result<void> flush();
  /// The requested unmaps recorded (done at once when nothing is left to run), their physical
  /// allocations kept for the maps that follow until the next flush. Error device_error.
  result<void> settle();
  [[nodiscard]] result<memory::resource> get(const memory::storage_handle& h);
  result<void> write(const memory::storage_handle& h, const void* src);
  result<void> read(const memory::storage_handle& h, void* dst);
  /// Bytes given back (queued pages, unmaps requested or recorded) that the device has not taken
  /// back yet: still held, and counted as reserved.
  [[nodiscard]] std::uint64_t returning_bytes() const noexcept;
  /// Memory a flush still has to give back: queued pages, unmaps requested or waiting for their
  /// event, address ranges waiting for their unmaps, kept physical allocations.
  [[nodiscard]] std::size_t pending_deallocations() const noexcept {
    return pending_.size() + requested_unmaps_.size() + batches_.size() + dying_ranges_.size() + kept_.size();
  }
  /// Mappings whose unmap has not happened yet (requested, or recorded behind an event).
  [[nodiscard]] std::size_t unmaps_in_flight() const noexcept;
  [[nodiscard]] std::string name() const { return name_; }

  /// The stream; also binds the calling thread to the device, so that kernels the caller launches
  /// on the stream go to the right GPU.
  [[nodiscard]] void* native_stream() noexcept;
  result<void> begin_capture();
  result<std::shared_ptr<memory::recorded_work>> end_capture();
  result<void> synchronize();

  // ---- Streams and events (see memory::queued_backend) ----
  result<memory::event> record_event(memory::stream_id q);
  result<bool> query_event(memory::event t);
  result<void> wait_event(memory::event t);
  result<void> stream_wait_event(memory::stream_id q, memory::event t);
  void release_event(memory::event t) noexcept;
  /// cudaStreamGetId and cudaStreamGetDevice of a native stream. Errors: invalid_argument.
  result<memory::stream_identity> identify(memory::stream_id s);
  /// Free-time fences of a native stream, with events of the stream's device.
  result<std::unique_ptr<memory::free_fence>> make_free_fence(memory::stream_id s, const memory::stream_identity& id);
  /// cudaDeviceSynchronize. Error capture_active while the device's stream records a capture.
  result<void> synchronize_device();
  void return_after(memory::stream_id s);
  result<void> write_on(const memory::storage_handle& h, const void* src, memory::stream_id q);
  result<memory::event> read_async(const memory::storage_handle& h, void* dst, memory::stream_id q);
  /// The CUDA stream that work for `q` is ordered on.
  [[nodiscard]] void* stream_of(memory::stream_id q) const noexcept;
  /// Times the owner thread waited for the GPU: an unmap that a map had to wait for, or memory
  /// pressure (for tests; 0 on the normal path).
  [[nodiscard]] std::uint64_t gpu_waits() const noexcept { return gpu_waits_; }
  /// Flushes whose unmaps went back at once because the device's stream had nothing left to run
  /// (no event, nothing returning).
  [[nodiscard]] std::uint64_t idle_releases() const noexcept { return idle_releases_; }
  /// Pinned staging memory held (bytes).
  [[nodiscard]] std::uint64_t staging_bytes() const noexcept { return staging_bytes_; }

  [[nodiscard]] int device() const noexcept { return device_; }
  [[nodiscard]] std::uint64_t allocated_bytes() const noexcept { return allocated_; }
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
  /// Waits for the stream, unmaps and releases what is left, and frees the addresses.
  void release_range(memory::storage_id range);
  /// Bytes of physical memory mapped into ranges, unmaps not yet completed included.
  [[nodiscard]] std::uint64_t mapped_bytes() const noexcept { return mapped_; }
  /// Physical allocations created for ranges (cuMemCreate calls).
  [[nodiscard]] std::uint64_t physical_allocations() const noexcept { return physical_allocs_; }
  /// Maps that used a kept physical allocation instead of creating one.
  [[nodiscard]] std::uint64_t reused_allocations() const noexcept { return reused_allocs_; }
  /// Physical allocations kept after their unmap completed, and their bytes (held, counted as
  /// returning until the next map takes one of its size and releases the others, or the next
  /// flush releases them).
  [[nodiscard]] std::size_t kept_allocations() const noexcept { return kept_.size(); }
  [[nodiscard]] std::uint64_t kept_bytes() const noexcept { return kept_bytes_; }
  /// Calls to the driver and their time (see driver_profile).
  [[nodiscard]] const driver_profile& profile() const noexcept { return profile_; }

  // ---- Peer access ----
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
  [[nodiscard]] bool mapped(const memory::storage_handle& h) const noexcept { return ranges_.contains(h.id); }
  /// Whether device `peer` may read and write the memory mapped at `ptr` in one of the ranges
  /// (cuMemGetAccess), for tests and diagnostics. Errors: unsupported (no ranges), device_error.
  result<bool> mapped_access(const void* ptr, int peer) const;

 private:
  struct page {
    void* ptr;
    std::uint64_t size;
  };
  // Where a mapping is in its life. Kept at the unit where it starts.
  enum class unit_state : std::uint8_t {
    none,             // no mapping starts here
    mapped,           // mapped and accessible
    unmap_requested,  // `unmap` was called; the next flush records it into a batch
    unmap_recorded,   // in batch `batch`, unmapped once that batch's event has completed
  };
  // A mapping of a range, kept at the unit where it starts: its physical allocation, its length
  // in units and its state. `owner` of every unit names the unit where its mapping starts.
  // Invariants: `batch` is the sequence number of the batch holding the unmap when the state is
  // unmap_recorded (0 otherwise), and only that batch may release the mapping; a mapping mapped
  // again before its unmap happened goes back to `mapped` and leaves every batch.
  struct unit {
    std::uint64_t handle = 0;  // CUmemGenericAllocationHandle
    std::uint64_t count = 0;
    std::uint64_t batch = 0;
    std::uint32_t owner = 0xffffffffU;
    unit_state state = unit_state::none;
  };
  struct range {
    std::uint64_t base = 0;  // CUdeviceptr
    std::uint64_t size = 0;
    std::uint64_t unit_size = 0;
    std::vector<unit> units;
  };
  // Unmaps recorded behind one event; `seq` increases with every batch.
  struct unmap_batch {
    void* event;  // cudaEvent_t recorded behind the unmapped memory's last use, on every stream
    std::uint64_t seq;
    std::vector<std::pair<memory::storage_id, std::uint64_t>> units;
  };
  // An event of the pool and what completes with it. Its id: generation << 32 | (slot + 1).
  struct ticket_slot {
    void* event = nullptr;    // cudaEvent_t
    void* staging = nullptr;  // pinned buffer of a staged read (or write), given back on completion
    std::uint64_t staging_size = 0;
    void* dst = nullptr;  // where a staged read copies its bytes once the event completed
    std::uint64_t bytes = 0;
    std::uint32_t generation = 0;
    bool live = false;
    bool foreign = false;  // an event of another device: destroyed, not pooled
  };
  struct staging_buffer {
    void* ptr;
    std::uint64_t size;
  };
  struct driver_api;
  class free_fence_impl;
  /// A ticket for an event taken from a free fence (`foreign`: of another device, destroyed when done).
  memory::event adopt_event(void* ev, bool foreign);
  result<void> bind_device() const;
  range* find_range(memory::storage_id id, std::uint64_t offset, std::uint64_t size);
  /// Unmaps and releases the units of completed batches; with `wait`, waits for all of them.
  result<void> complete_unmaps(bool wait);
  /// Records the requested unmaps behind the device's stream (joined to every user's stream first
  /// unless `users_joined`), or gives them back at once when that stream has nothing left to run.
  /// Nothing while capturing.
  result<void> record_unmaps(bool users_joined = false);
  /// The device's stream waits for the work queued on every stream in use.
  result<void> join_users();
  void setup_mapping();
  /// Unmaps the mapping at `start`; its physical allocation is kept (see kept_) or, with
  /// `release`, given back to the driver.
  void release_mapping(range& r, std::uint64_t start, bool release = false);
  /// cuMemRelease of every kept physical allocation.
  void release_kept();
  void free_range_now(memory::storage_id id);
  /// Sets the access of every device to the mapping at [at, at + size): read-write for the device
  /// and its peers, none for `revoked`.
  result<void> set_mapping_access(std::uint64_t at, std::uint64_t size, const std::vector<int>& revoked) const;
  // Events and events.
  result<void*> take_event();
  void give_event(void* ev) noexcept;
  ticket_slot* slot_of(memory::event t) noexcept;
  memory::event new_ticket(void* ev);
  void finish_ticket(memory::event t) noexcept;
  // Pinned staging memory.
  result<staging_buffer> take_staging(std::uint64_t size);
  void give_staging(staging_buffer b) noexcept;
  void recycle_staging() noexcept;

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
  std::shared_ptr<const driver_api> api_;
  std::unordered_map<memory::storage_id, range> ranges_;
  std::vector<std::pair<memory::storage_id, std::uint64_t>> requested_unmaps_;
  std::vector<unmap_batch> batches_;
  std::uint64_t next_batch_ = 1;
  std::vector<memory::storage_id> dying_ranges_;  // released; addresses freed once their unmaps are done
  std::uint64_t mapped_ = 0;
  std::uint64_t physical_allocs_ = 0;
  std::uint64_t reused_allocs_ = 0;
  // Physical allocations whose unmap completed, not yet released: {bytes, handle}. Filled by
  // unmaps that complete outside a flush (a settle, a map), emptied by the next map (which may
  // take one) and at the end of every flush.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> kept_;
  std::uint64_t kept_bytes_ = 0;
  mutable driver_profile profile_;               // counted from const calls too (set_mapping_access)
  std::vector<memory::stream_id> return_after_;  // streams returns wait for besides the device's own
  std::vector<void*> free_events_;
  std::vector<ticket_slot> tickets_;
  std::vector<std::uint32_t> free_tickets_;
  std::vector<staging_buffer> staging_free_;
  std::vector<std::pair<memory::event, staging_buffer>> staging_in_flight_;
  std::uint64_t staging_bytes_ = 0;
  std::uint64_t gpu_waits_ = 0;
  std::uint64_t idle_releases_ = 0;
  std::vector<int> peers_;  // devices given access to this device's memory (set_peer_access)
};

static_assert(memory::storage_backend<cuda_storage>);
static_assert(memory::queued_backend<cuda_storage>);
static_assert(memory::mapping_backend<cuda_storage>);

}  // namespace devrt::devices
