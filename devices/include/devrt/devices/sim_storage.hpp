// Simulated storage: pages are ids and sizes only, with no memory behind them. It has the
// properties and capacity of any device (an H200's by `sim_options::h200()`), so traces larger than
// this machine can be replayed, and it fails on request: the N-th allocation, or the next flush.
//
// Threading: owned by one memory manager; called only from its owner thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "devrt/memory/storage.hpp"

namespace devrt::devices {

struct sim_options {
  memory::device_properties props{1ULL << 30, 512, 0};  ///< capacity 0: no limit
  std::string name = "sim";

  /// An NVIDIA H200: 512-byte alignment, 150,109,880,320 bytes, pages up to a quarter of that.
  static sim_options h200();
};

class sim_storage {
 public:
  explicit sim_storage(sim_options opts = {});

  [[nodiscard]] std::uint64_t alignment() const noexcept { return opts_.props.alignment; }
  [[nodiscard]] memory::device_properties properties() const noexcept { return opts_.props; }
  /// Errors: out_of_memory when the capacity would be exceeded or a failure was injected.
  result<memory::storage_handle> alloc(std::uint64_t size);
  void dealloc(memory::storage_id id);
  /// Releases queued pages. Error device_error when a failure was injected; the queue is kept.
  result<void> flush();
  /// A resource with no pointer. Errors: not_found, invalid_argument.
  [[nodiscard]] result<memory::resource> get(const memory::storage_handle& h);
  result<void> write(const memory::storage_handle& h, const void* src);
  result<void> read(const memory::storage_handle& h, void* dst);
  [[nodiscard]] std::size_t pending_deallocations() const noexcept { return pending_.size(); }
  [[nodiscard]] std::string name() const { return opts_.name; }

  // ---- Fault injection and introspection ----
  /// Makes the n-th allocation from now (1 = the next one) fail with out_of_memory.
  void fail_allocation(std::uint64_t n) noexcept { fail_at_ = alloc_calls_ + n; }
  /// Makes the next flush fail with device_error.
  void fail_next_flush() noexcept { fail_flush_ = true; }
  void set_capacity(std::uint64_t bytes) noexcept { opts_.props.capacity = bytes; }
  [[nodiscard]] std::uint64_t allocated_bytes() const noexcept { return allocated_; }
  [[nodiscard]] std::uint64_t peak_allocated_bytes() const noexcept { return peak_; }
  [[nodiscard]] std::size_t page_count() const noexcept { return pages_.size(); }
  [[nodiscard]] std::uint64_t alloc_calls() const noexcept { return alloc_calls_; }
  [[nodiscard]] std::uint64_t allocations() const noexcept { return allocations_; }
  [[nodiscard]] std::uint64_t frees() const noexcept { return frees_; }

 private:
  sim_options opts_;
  std::unordered_map<memory::storage_id, std::uint64_t> pages_;
  std::vector<memory::storage_id> pending_;
  std::uint64_t allocated_ = 0;
  std::uint64_t peak_ = 0;
  std::uint64_t alloc_calls_ = 0;
  std::uint64_t allocations_ = 0;
  std::uint64_t frees_ = 0;
  std::optional<std::uint64_t> fail_at_;
  bool fail_flush_ = false;
  memory::storage_id next_id_ = 1;
};

static_assert(memory::storage_backend<sim_storage>);

}  // namespace devrt::devices
