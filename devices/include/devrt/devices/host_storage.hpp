// Host storage: pages of real, aligned, zero-filled host memory. A resource's pointer can be read
// and written by the program. It also reserves address ranges (mmap without access) and maps
// memory into them granule by granule (access granted; unmapping hands the pages back to the
// kernel at once, since the host has no queued work).
//
// Threading: owned by one memory manager; called only from its owner thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "devrt/memory/storage.hpp"

namespace devrt::devices {

struct host_options {
  std::uint64_t alignment = 64;              ///< a power of two
  std::uint64_t max_page_size = 1ULL << 30;  ///< largest page the layouts ask for
  /// Refuse allocations and mappings past this many bytes (0: what the host can back for devrt
  /// when the storage is created, host_memory.hpp: the memory available and free swap, and the
  /// room left in the process's memory cgroups).
  std::uint64_t capacity = 0;
  std::uint64_t map_granularity = 1ULL << 21;  ///< unit of mapping into ranges (0: no ranges); a page multiple
};

class host_storage {
 public:
  /// Throws devrt::exception (invalid_argument) if the alignment is not a power of two.
  explicit host_storage(host_options opts = {});
  host_storage(const host_storage&) = delete;
  host_storage& operator=(const host_storage&) = delete;
  ~host_storage();

  [[nodiscard]] std::uint64_t alignment() const noexcept { return opts_.alignment; }
  [[nodiscard]] memory::device_properties properties() const noexcept {
    return {opts_.max_page_size, opts_.alignment, opts_.capacity, opts_.map_granularity};
  }
  /// A new zero-filled page. Error out_of_memory when the system or the capacity refuses it.
  result<memory::storage_handle> alloc(std::uint64_t size);
  /// Queues the page for release at the next flush.
  void dealloc(memory::storage_id id);
  /// Bytes given back whose release is still queued (until the next flush).
  [[nodiscard]] std::uint64_t returning_bytes() const noexcept;
  /// Always 0: the host unmaps at once.
  [[nodiscard]] std::size_t unmaps_in_flight() const noexcept { return 0; }
  /// Releases every queued page.
  result<void> flush();
  /// The pointer and size of a view. Errors: not_found (unknown page), invalid_argument (the view
  /// is outside the page).
  [[nodiscard]] result<memory::resource> get(const memory::storage_handle& h);
  result<void> write(const memory::storage_handle& h, const void* src);
  result<void> read(const memory::storage_handle& h, void* dst);
  [[nodiscard]] std::size_t pending_deallocations() const noexcept { return pending_.size(); }
  [[nodiscard]] std::string name() const { return "host"; }

  // ---- Address ranges ----
  /// Addresses only (no access, no memory). Errors: unsupported (granularity 0), invalid_argument
  /// (not a granule multiple), out_of_memory (the system refused the addresses).
  result<memory::storage_handle> reserve_range(std::uint64_t size, std::uint64_t unit);
  /// Grants access to zero-filled memory. Errors: out_of_memory (capacity, or the system refused),
  /// not_found, invalid_argument (not whole units inside the range, or mapped already).
  result<void> map(memory::storage_id range, std::uint64_t offset, std::uint64_t size);
  /// Returns the pages to the kernel and removes access: exactly what one map call mapped, else
  /// nothing.
  void unmap(memory::storage_id range, std::uint64_t offset, std::uint64_t size);
  /// Frees the addresses at the next flush.
  void release_range(memory::storage_id range);

  [[nodiscard]] std::uint64_t allocated_bytes() const noexcept { return allocated_; }
  /// Bytes it may still allocate: the limit (the capacity, or the host's available memory) less
  /// what it holds.
  [[nodiscard]] std::uint64_t device_free() const noexcept { return limit_ - std::min(allocated_, limit_); }
  /// The bytes past which allocations and mappings are refused: the capacity, or what the host
  /// could back for devrt when the storage was created (host_memory_available).
  [[nodiscard]] std::uint64_t limit() const noexcept { return limit_; }
  [[nodiscard]] std::size_t page_count() const noexcept { return pages_.size(); }

 private:
  struct page {
    void* ptr;
    std::uint64_t size;
    bool mapped;  // from mmap rather than the heap
    bool range = false;
    std::uint64_t range_mapped = 0;  // bytes of a range with memory behind them
    std::uint64_t unit = 0;          // a range is mapped in whole units
    // Per unit of a range: at the first unit of each mapping its length in units, so that an unmap
    // is checked against exactly one earlier map; every unit of a mapping is marked in `unit_mapped`.
    std::vector<std::uint64_t> length;
    std::vector<std::uint8_t> unit_mapped;
  };
  page* find_range(memory::storage_id id, std::uint64_t offset, std::uint64_t size);
  void release(const page& p) noexcept;
  [[nodiscard]] bool fits(std::uint64_t size) const noexcept {
    return limit_ == 0 || size <= limit_ - std::min(allocated_, limit_);
  }

  host_options opts_;
  std::uint64_t limit_ = 0;  // 0 only when the machine's memory could not be read
  std::string bound_;        // without a capacity: what set limit_ (host_memory::bound)
  [[nodiscard]] error limit_reached(std::uint64_t size) const;  // out_of_memory at the limit
  std::unordered_map<memory::storage_id, page> pages_;
  std::vector<memory::storage_id> pending_;
  std::uint64_t allocated_ = 0;
  memory::storage_id next_id_ = 1;
};

static_assert(memory::storage_backend<host_storage>);

}  // namespace devrt::devices
