// Virtual memory management: address ranges, the memory mapped into them, and the lifecycle of an
// unmap on a device whose work runs behind the host (a GPU's streams). The one implementation of
// it: the CUDA storage runs it over the driver (cuMemAddressReserve, cuMemCreate, cuMemMap, ...),
// the simulated device over its simulated driver, so every path of it (busy and idle devices,
// failed creates and maps, failed event records, captures) is tested on the host.
//
// The lifecycle of one mapping (kept at the unit where it starts):
//
//          map()                    unmap()
//   (none) ──────▶ mapped ─────────────────────▶ unmap_requested
//                   ▲  ▲                            │        │ record (flush, settle), the device's
//     map() again   │  │ map() again                │        │ stream busy: behind an event, in a batch
//     same bounds   │  └────────────────────────────┘        ▼
//                   └────────────────────────────────── unmap_recorded
//                                                           │ its batch's event passed
//   record with nothing left to run (idle), or ─────────────┤ (flush, settle, map)
//   unmap_idle() from mapped (no queued work reaches it) ───┤
//                                                           ▼
//                                      unmapped: the physical memory is released, or kept for
//                                      the next map of its size (an unmap done by settle or
//                                      unmap_idle)
//
// Invariants: a mapping in unmap_recorded names the batch (`batch`) that will unmap it, and only
// that batch may; a mapping mapped again before its unmap happened is `mapped` and in no batch
// (a newer unmap of it goes into a newer batch). The addresses of a mapping whose unmap has not
// happened are still mapped: a map there is allowed only with exactly its bounds (the same
// mapping, revived without waiting); other bounds over it wait for its unmap (counted in
// `waits`). A released range keeps its addresses until none of its unmaps is in flight. Kept
// physical memory is held (counted as returning) until the next map, which takes one of its size
// and releases the rest before its own memory counts, or the next flush.
//
// Owner: one storage, on its owner's thread.
#pragma once

#include <cstdint>
#include <map>
#include <unordered_map>
#include <utility>
#include <vector>

#include "devrt/memory/error.hpp"
#include "devrt/memory/storage.hpp"

namespace devrt::devices {

/// What the state machine needs from a driver. Every call comes from the owner's thread.
class vmm_driver {
 public:
  virtual ~vmm_driver() = default;
  /// `size` bytes of addresses, aligned to the granularity. Errors: out_of_memory, device_error.
  virtual result<std::uint64_t> reserve_addresses(std::uint64_t size) = 0;
  virtual void free_addresses(std::uint64_t base, std::uint64_t size) noexcept = 0;
  /// A physical allocation of `size` bytes. Errors: out_of_memory, device_error.
  virtual result<std::uint64_t> create(std::uint64_t size) = 0;
  virtual void release(std::uint64_t handle, std::uint64_t size) noexcept = 0;
  /// Maps `handle` at `at` and makes it accessible (to the device and its peers). On failure
  /// nothing stays mapped. Errors: out_of_memory, device_error.
  virtual result<void> map(std::uint64_t at, std::uint64_t size, std::uint64_t handle) = 0;
  virtual void unmap(std::uint64_t at, std::uint64_t size) noexcept = 0;
  /// Whether unmaps take effect behind the device's queued work (a GPU); false: at once.
  [[nodiscard]] virtual bool deferred() const noexcept = 0;
  /// Whether the device's stream records a capture: nothing may be recorded on it then.
  [[nodiscard]] virtual bool capturing() const noexcept = 0;
  /// Orders what is unmapped now behind the work queued on the device's stream (and the streams
  /// returns wait for): an event of the storage's, or 0 when nothing is left to run, so the unmaps
  /// may happen at once. Error device_error.
  virtual result<memory::event> behind_device() = 0;
  /// Whether the event passed (then it is released). Error device_error.
  virtual result<bool> query(memory::event e) = 0;
  /// Waits until the event passed. Error device_error.
  virtual result<void> wait(memory::event e) = 0;
  virtual void release_event(memory::event e) noexcept = 0;
};

class vmm {
 public:
  /// Where a mapping is in its life (see the diagram at the top of the file).
  enum class state : std::uint8_t { mapped, unmap_requested, unmap_recorded };

  vmm(vmm_driver& driver, std::uint64_t granularity) : driver_(driver), granularity_(granularity) {}
  vmm(const vmm&) = delete;
  vmm& operator=(const vmm&) = delete;

  /// A range of `size` bytes of addresses named `id`, mapped in units of `unit` bytes. Errors:
  /// invalid_argument (not a multiple of the unit, a unit not of the granularity), those of the
  /// driver.
  result<memory::storage_handle> reserve_range(memory::storage_id id, std::uint64_t size, std::uint64_t unit);
  /// One physical allocation behind `[offset, offset + size)`; `unmap` takes back exactly what one
  /// map mapped. Errors: invalid_argument (not whole units of a range, or mapped already),
  /// not_found (no such range), capture_active, out_of_memory (after one wait for unmaps in
  /// flight), device_error.
  result<void> map(memory::storage_id id, std::uint64_t offset, std::uint64_t size);
  /// Takes back what one map mapped (behind the device's work when it is deferred). Anything else
  /// is a misuse, counted and ignored.
  void unmap(memory::storage_id id, std::uint64_t offset, std::uint64_t size);
  /// The same for memory that no queued work can reach (the caller knows every stream that used it
  /// has passed): unmapped now, not behind the device's work, its physical memory kept for the
  /// next map of its size as after a settle. While a capture records, as `unmap`.
  void unmap_idle(memory::storage_id id, std::uint64_t offset, std::uint64_t size);
  /// Unmaps what is left of the range and frees its addresses once none of its unmaps is in flight.
  void release_range(memory::storage_id id);
  /// Records the requested unmaps (done at once when nothing is left to run), unmaps what passed
  /// batches allow, releases kept memory, frees released ranges whose unmaps are done. Error
  /// device_error (kept for the next flush).
  result<void> flush();
  /// The same, but the physical memory of unmaps done now is kept for the maps that follow.
  result<void> settle();
  /// After the device has drained (teardown): everything unmapped and released, every range freed.
  void teardown() noexcept;

  [[nodiscard]] bool has_range(memory::storage_id id) const noexcept { return ranges_.contains(id); }
  /// The first address of a range (0: none).
  [[nodiscard]] std::uint64_t base(memory::storage_id id) const noexcept;
  [[nodiscard]] std::uint64_t range_size(memory::storage_id id) const noexcept;
  /// Whether every unit of the view is inside a mapping that is mapped.
  [[nodiscard]] bool covered(memory::storage_id id, std::uint64_t offset, std::uint64_t size) const;
  /// Calls `f(at, bytes)` for every mapping whose addresses are mapped (unmaps in flight included).
  template <class F>
  result<void> for_each_mapping(F&& f) const {
    for (const auto& [id, r] : ranges_) {
      for (const auto& [first, m] : r.mappings) {
        if (auto x = f(r.base + first * r.unit, m.count * r.unit); !x) return x;
      }
    }
    return {};
  }

  /// Bytes of memory held that the device has not taken back: unmaps requested or recorded, kept.
  [[nodiscard]] std::uint64_t returning_bytes() const noexcept;
  /// Mappings whose unmap has not happened yet.
  [[nodiscard]] std::size_t unmaps_in_flight() const noexcept { return in_flight_; }
  /// What a flush still has to do.
  [[nodiscard]] std::size_t pending() const noexcept {
    return requested_.size() + batches_.size() + dying_.size() + kept_.size();
  }
  [[nodiscard]] std::uint64_t mapped_bytes() const noexcept { return mapped_; }
  [[nodiscard]] std::uint64_t physical_allocations() const noexcept { return creates_; }
  [[nodiscard]] std::uint64_t reused_allocations() const noexcept { return reuses_; }
  [[nodiscard]] std::size_t kept_allocations() const noexcept { return kept_.size(); }
  [[nodiscard]] std::uint64_t kept_bytes() const noexcept { return kept_bytes_; }
  /// Times a map waited for an unmap in flight (other bounds over it, or out of memory).
  [[nodiscard]] std::uint64_t waits() const noexcept { return waits_; }
  /// Flushes whose unmaps happened at once because nothing was left to run.
  [[nodiscard]] std::uint64_t idle_releases() const noexcept { return idle_releases_; }
  [[nodiscard]] std::uint64_t misuses() const noexcept { return misuses_; }
  [[nodiscard]] std::size_t range_count() const noexcept { return ranges_.size(); }

 private:
  struct mapping {
    std::uint64_t count = 0;   // units
    std::uint64_t handle = 0;  // the physical allocation
    std::uint64_t batch = 0;   // unmap_recorded: the batch that unmaps it (0 otherwise)
    state st = state::mapped;
  };
  struct range {
    std::uint64_t base = 0;
    std::uint64_t size = 0;
    std::uint64_t unit = 0;
    std::map<std::uint64_t, mapping> mappings;  // by first unit
    std::uint64_t in_flight = 0;                // mappings whose unmap has not happened
    bool dying = false;                         // released: freed once in_flight is 0
  };
  // Unmaps recorded behind one event; `seq` grows with every batch.
  struct batch {
    memory::event e;
    std::uint64_t seq;
    std::vector<std::pair<memory::storage_id, std::uint64_t>> mappings;  // range, first unit
  };

  range* find(memory::storage_id id) noexcept;
  /// The mapping one map call made at `offset` of range `id`, whole (`size` its bytes) and mapped;
  /// nullptr for anything else (a misuse). `r` names the range when there is one.
  mapping* whole_mapping(memory::storage_id id, std::uint64_t offset, std::uint64_t size, range*& r);
  /// Records the requested unmaps behind the device's work, or unmaps them at once (kept with
  /// `keep`) when nothing is left to run. Nothing while capturing.
  result<void> record(bool keep);
  /// Unmaps what the passed batches allow (all of them, waiting, with `wait`).
  result<void> complete(bool wait, bool keep);
  /// Unmaps the mapping at `first` of `r`: its memory is kept, or released.
  void unmap_now(memory::storage_id id, range& r, std::uint64_t first, bool keep);
  void release_kept() noexcept;
  void free_dying();

  vmm_driver& driver_;
  std::uint64_t granularity_;
  std::unordered_map<memory::storage_id, range> ranges_;
  std::vector<std::pair<memory::storage_id, std::uint64_t>> requested_;  // range, first unit
  std::vector<batch> batches_;
  std::uint64_t next_batch_ = 1;
  std::size_t recorded_ = 0;     // mappings in unmap_recorded
  std::size_t in_flight_ = 0;    // mappings in unmap_requested or unmap_recorded
  std::uint64_t returning_ = 0;  // their bytes
  std::vector<memory::storage_id> dying_;
  // Physical memory whose unmap happened outside a flush, for the next map of its size: {bytes, handle}.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> kept_;
  std::uint64_t kept_bytes_ = 0;
  std::uint64_t mapped_ = 0;
  std::uint64_t creates_ = 0;
  std::uint64_t reuses_ = 0;
  std::uint64_t waits_ = 0;
  std::uint64_t idle_releases_ = 0;
  std::uint64_t misuses_ = 0;
  memory::storage_id last_id_ = 0;
  range* last_ = nullptr;  // unordered_map nodes do not move
};

}  // namespace devrt::devices
