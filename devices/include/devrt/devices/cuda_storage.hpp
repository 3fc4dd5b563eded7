// CUDA storage: device memory of one GPU, ordered on one CUDA stream that the storage owns.
//
// Pages come from the driver's stream-ordered allocator (cudaMallocAsync on the storage's stream);
// queued deallocations are flushed with cudaFreeAsync on the same stream, so a free never
// synchronizes the device and never overtakes work already enqueued that still reads the memory.
// `write` is a stream-ordered copy; `read` copies and waits for the stream. CUDA errors become
// devrt errors that carry the CUDA error name.
//
// Address ranges: where the driver offers virtual memory management, the storage also reserves
// address ranges (cuMemAddressReserve) and maps physical memory into them (cuMemCreate, cuMemMap,
// cuMemSetAccess), one physical allocation per `map` call, for the arena pool. Unmapping is
// stream-ordered without a synchronization: `unmap` only marks the memory, `flush` records an event
// behind the work queued so far, and the memory is unmapped and released once the event completed
// (checked at later flushes and maps). Mapping memory whose unmap is still pending just keeps it.
// The driver's functions are looked up through the runtime (cudaGetDriverEntryPointByVersion), so
// binaries do not link the driver library.
//
// Graph capture: `begin_capture`/`end_capture` bracket stream capture on the storage's stream; an
// allocation inside the window is refused (the persistent pool must be warmed first), so a
// captured graph never contains a driver allocation.
//
// Threading: owned by one memory manager; called only from its owner thread, which it binds to
// the device (cudaSetDevice) on every call.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "devrt/memory/storage.hpp"

namespace devrt::devices {

/// Number of CUDA devices usable by this process (0 without a driver or GPU).
int cuda_device_count() noexcept;
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
  /// cudaFreeAsync of every queued page on the stream. Error device_error.
  result<void> flush();
  [[nodiscard]] result<memory::resource> get(const memory::storage_handle& h);
  result<void> write(const memory::storage_handle& h, const void* src);
  result<void> read(const memory::storage_handle& h, void* dst);
  [[nodiscard]] std::size_t pending_deallocations() const noexcept {
    return pending_.size() + requested_unmaps_.size();
  }
  [[nodiscard]] std::string name() const { return name_; }

  /// The stream; also binds the calling thread to the device, so that kernels the caller launches
  /// on the stream go to the right GPU.
  [[nodiscard]] void* native_queue() noexcept;
  result<void> begin_capture();
  result<std::shared_ptr<memory::recorded_work>> end_capture();
  result<void> synchronize();

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

 private:
  struct page {
    void* ptr;
    std::uint64_t size;
  };
  // A mapping of a range, kept at the unit where it starts: its physical allocation, its length in
  // units and its state (0 none, 1 mapped, 2 unmap requested, 3 unmap recorded behind an event).
  // `owner` of every unit names the unit where its mapping starts.
  struct unit {
    std::uint64_t handle = 0;  // CUmemGenericAllocationHandle
    std::uint64_t count = 0;
    std::uint32_t owner = 0xffffffffU;
    std::uint8_t state = 0;
  };
  struct range {
    std::uint64_t base = 0;  // CUdeviceptr
    std::uint64_t size = 0;
    std::uint64_t unit_size = 0;
    std::vector<unit> units;
  };
  struct unmap_batch {
    void* event;  // cudaEvent_t recorded behind the unmapped memory's last use
    std::vector<std::pair<memory::storage_id, std::uint64_t>> units;
  };
  struct driver_api;
  result<void> bind_device() const;
  range* find_range(memory::storage_id id, std::uint64_t offset, std::uint64_t size);
  /// Unmaps and releases the units of completed batches; with `wait`, waits for all of them.
  result<void> complete_unmaps(bool wait);
  /// Records an event behind the requested unmaps (not while capturing).
  result<void> record_unmaps();
  void setup_mapping();
  void release_mapping(range& r, std::uint64_t start);

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
  std::uint64_t mapped_ = 0;
  std::uint64_t physical_allocs_ = 0;
};

static_assert(memory::storage_backend<cuda_storage>);
static_assert(memory::queued_backend<cuda_storage>);
static_assert(memory::mapping_backend<cuda_storage>);

}  // namespace devrt::devices
