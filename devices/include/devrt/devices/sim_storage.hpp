// Simulated storage: pages are ids and sizes only, with no memory behind them. It has the
// properties and capacity of any device (an H200's by `sim_options::h200()`), so traces larger than
// this machine can be replayed, and it fails on request: the N-th allocation, or the next flush.
// With a map granularity it also reserves address ranges and maps granules into them; unmapping
// takes effect at once (the simulated device runs no work that could still use the memory).
//
// Threading: owned by one memory manager; called only from its owner thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "devrt/memory/storage.hpp"

namespace devrt::devices {

struct sim_options {
  memory::device_properties props{1ULL << 30, 512, 0};  ///< capacity 0: no limit
  std::string name = "sim";
  /// Simulate work queues (streams): tickets pass only when the test lets the simulated device
  /// progress (`sim_storage::progress`), so stream-ordered reuse can be checked without a GPU.
  bool queues = false;
  /// With `queues`: an unmap takes effect as on a GPU, behind the work queued before it. A flush
  /// gives the memory back at once when no ticket of any queue is outstanding (the device has
  /// nothing left to run), otherwise behind a ticket on the device's queue, given back by the first
  /// flush or map after that ticket has passed. Until then the memory is returning
  /// (`returning_bytes`); the same bounds mapped again keep it; other bounds over it wait (counted
  /// in `waits()`).
  bool deferred_unmaps = false;

  /// An NVIDIA H200: 512-byte alignment, 150,109,880,320 bytes, pages up to a quarter of that,
  /// memory mapped in 2 MiB granules.
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
  /// Bytes of queued pages (released at the next flush).
  [[nodiscard]] std::uint64_t returning_bytes() const noexcept;
  /// Unmaps deferred behind queued work and not done yet.
  [[nodiscard]] std::size_t unmaps_in_flight() const noexcept { return unmapping_.size(); }
  /// Releases queued pages. Error device_error when a failure was injected; the queue is kept.
  result<void> flush();
  /// A resource with no pointer. Errors: not_found, invalid_argument.
  [[nodiscard]] result<memory::resource> get(const memory::storage_handle& h);
  result<void> write(const memory::storage_handle& h, const void* src);
  result<void> read(const memory::storage_handle& h, void* dst);
  [[nodiscard]] std::size_t pending_deallocations() const noexcept { return pending_.size() + unmapping_.size(); }
  [[nodiscard]] std::string name() const { return opts_.name; }

  // ---- Address ranges (when `props.map_granularity` is not 0) ----
  /// Error unsupported without a map granularity; invalid_argument for a size that is not a
  /// multiple of the unit or a unit not of the granularity; out_of_memory above 2^48 bytes (more
  /// addresses than a device has).
  result<memory::storage_handle> reserve_range(std::uint64_t size, std::uint64_t unit);
  /// Counts like an allocation (capacity, injected failures). Errors: out_of_memory, not_found,
  /// invalid_argument (not whole units of the range, outside it, or already mapped).
  result<void> map(memory::storage_id range, std::uint64_t offset, std::uint64_t size);
  /// Takes effect at once (at a flush with `deferred_unmaps`). Only what one map call mapped, whole;
  /// anything else is a misuse, counted (see misuses()) and ignored.
  void unmap(memory::storage_id range, std::uint64_t offset, std::uint64_t size);
  void release_range(memory::storage_id range);

  // ---- Simulated queues (sim_options::queues) ----
  [[nodiscard]] bool ordered() const noexcept { return opts_.queues; }
  [[nodiscard]] void* native_queue() noexcept { return nullptr; }
  result<void> begin_capture() { return {}; }
  result<std::shared_ptr<memory::recorded_work>> end_capture() { return std::shared_ptr<memory::recorded_work>(); }
  result<void> synchronize() {
    progress();
    return {};
  }
  /// A ticket that passes when the simulated device progresses past it on its queue.
  result<memory::ticket> mark(memory::queue_id q);
  result<bool> passed(memory::ticket t) const noexcept;
  /// Lets the ticket's queue run up to `t` (counted in waits()).
  result<void> wait(memory::ticket t) noexcept;
  /// The simulated device runs the ticket's queue up to `t` on its own (not a wait).
  void run_until(memory::ticket t) noexcept;
  result<void> join(memory::queue_id q, memory::ticket t) noexcept;
  void use_queue(memory::queue_id q);
  void retire_queue(memory::queue_id q);
  result<void> write_on(const memory::storage_handle& h, const void* src, memory::queue_id) { return write(h, src); }
  result<memory::ticket> read_async(const memory::storage_handle& h, void* dst, memory::queue_id q);
  /// The simulated device finishes every piece of work queued so far, on every queue.
  void progress() noexcept;
  /// Queue `q` (alone) finishes the work queued on it so far.
  void progress_queue(memory::queue_id q) noexcept;
  /// Tickets handed out so far (each new ticket is the next number).
  [[nodiscard]] memory::ticket issued_tickets() const noexcept { return issued_; }
  /// The newest ticket of queue `q` that has passed (0: none).
  [[nodiscard]] memory::ticket passed_on(memory::queue_id q) const noexcept;
  [[nodiscard]] std::uint64_t waits() const noexcept { return waits_; }
  [[nodiscard]] std::uint64_t joins() const noexcept { return joins_; }
  [[nodiscard]] const std::vector<memory::queue_id>& queues() const noexcept { return queues_; }

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
  /// Bytes mapped into address ranges.
  [[nodiscard]] std::uint64_t mapped_bytes() const noexcept { return mapped_; }
  [[nodiscard]] std::size_t range_count() const noexcept { return ranges_.size(); }
  /// Calls that broke the contract (unmapping what is not mapped, unknown ranges).
  [[nodiscard]] std::uint64_t misuses() const noexcept { return misuses_; }

 private:
  /// Counts an allocation call (pages and mappings alike) and refuses it on an injected fault or
  /// when the capacity would be passed: out_of_memory with the size, the bytes held and the capacity.
  result<void> admit(std::uint64_t size);
  /// Books `size` bytes as held.
  void charge(std::uint64_t size) noexcept;

  sim_options opts_;
  // A range: its mappings by first unit, with their lengths in units, so that an unmap is checked
  // against exactly one earlier map. Bookkeeping grows with the mappings, not with the range.
  struct range {
    std::uint64_t size = 0;
    std::uint64_t unit = 0;
    std::map<std::uint64_t, std::uint64_t> mappings;
  };
  result<void> check_granules(const range& r, std::uint64_t offset, std::uint64_t size) const;
  // An unmap that has not taken effect (deferred_unmaps): `after` 0 until a flush records it
  // behind a ticket of the device's queue; the memory stays held (allocated_) until it is given back.
  struct unmapping {
    memory::storage_id range;
    std::uint64_t first;   // unit
    std::uint64_t length;  // units
    std::uint64_t bytes;
    memory::ticket after;
  };
  // Gives back the unmappings of `id` that `pick` selects.
  template <class Pick>
  void give_back_unmaps(Pick pick);
  range* find_range(memory::storage_id id);

  std::unordered_map<memory::storage_id, std::uint64_t> pages_;
  std::unordered_map<memory::storage_id, range> ranges_;
  std::uint64_t mapped_ = 0;
  std::uint64_t misuses_ = 0;
  memory::storage_id last_range_id_ = 0;
  range* last_range_ = nullptr;  // unordered_map nodes do not move
  std::vector<memory::storage_id> pending_;
  std::vector<unmapping> unmapping_;
  std::uint64_t allocated_ = 0;
  std::uint64_t peak_ = 0;
  std::uint64_t alloc_calls_ = 0;
  std::uint64_t allocations_ = 0;
  std::uint64_t frees_ = 0;
  std::optional<std::uint64_t> fail_at_;
  bool fail_flush_ = false;
  memory::storage_id next_id_ = 1;
  memory::ticket issued_ = 0;
  std::map<memory::ticket, memory::queue_id> unpassed_;
  std::map<memory::queue_id, memory::ticket> passed_on_;
  std::uint64_t waits_ = 0;
  std::uint64_t joins_ = 0;
  std::vector<memory::queue_id> queues_;
};

static_assert(memory::storage_backend<sim_storage>);
static_assert(memory::queued_backend<sim_storage>);

}  // namespace devrt::devices
