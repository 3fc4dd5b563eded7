// What every pool needs from its manager: the storage, the statistics and the release queue that
// drops are reported to. Owned by the manager; used only on the manager's owner thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "devrt/memory/error.hpp"
#include "devrt/memory/handle.hpp"
#include "devrt/memory/snapshot.hpp"
#include "devrt/memory/storage.hpp"
#include "devrt/memory/stream.hpp"
#include "devrt/memory/usage.hpp"

namespace devrt::memory {

/// Everything a pool touches outside itself.
struct pool_context {
  storage& store;
  memory_statistics& stats;
  release_queue& queue;
  /// Descriptors detached while a drop was handing them to the release queue; the manager waits
  /// for them before it goes away.
  std::uint64_t detached_in_flight = 0;
  /// Stream order of the device (fences and their epochs); see stream_order.hpp.
  class stream_order* order = nullptr;
  /// The registration (its serial, stream_order.hpp) of the reserve being served when its pool may
  /// hand it memory freed on that stream whose fence has not passed (0: only memory free for every
  /// stream).
  std::uint64_t reserve_tag = 0;
  /// Set when a page, a mapping or an address range goes back to the storage (where it waits for
  /// a flush); cleared by memory_manager::deallocations_queued once the storage has nothing left
  /// to do. So that question costs one load between the returns, not a call into the storage.
  bool returns_queued = false;
  /// Called by a pool before it maps memory for a reserve: fences the streams with frees not yet
  /// fenced, queries the fences in flight (never waits) and returns to every stream the memory
  /// whose fences passed, held frees included. True when something came back. Null: the pool
  /// harvests its own stream-tagged memory only. A plain function, so the call allocates nothing.
  bool (*reuse_streams)(void* owner) = nullptr;
  void* reuse_owner = nullptr;
  /// The device's memory limit (bytes; 0: none): a page or a mapping that would take what the
  /// device holds for devrt (`held()`) past it is refused with out_of_memory.
  std::uint64_t limit = 0;
  /// What the pools' policy measures headroom against: the limit, else the device's capacity (0:
  /// unknown, and the pools stay as tight as they can).
  std::uint64_t budget = 0;
  /// Below this the pools are far from the budget (see roomy): half the device's capacity without
  /// a limit; an eighth of a limit, which may sit just above the workload's peak.
  std::uint64_t roomy_below = 0;
  /// Sets the limit (0: none) and, with the device's capacity, the budget.
  void set_limit(std::uint64_t bytes, std::uint64_t capacity) {
    limit = bytes;
    budget = bytes != 0 ? bytes : capacity;
    roomy_below = bytes != 0 ? bytes / 8 : capacity / 2;
  }
  /// The caller's descriptor that the next slice placed gets instead of a fresh one (see
  /// memory_manager::reserve_into); consumed by attach_new.
  detail::descriptor* into = nullptr;
  /// The manager's trace of memory events (snapshot.hpp); one branch per page or mapping while it
  /// is off.
  memory_history* history = nullptr;

  /// Gives a fresh descriptor to a slice at `loc`, with one user handle, or attaches `into`
  /// (whose handles the caller holds already). Returns it.
  detail::descriptor* attach_new(const location& loc) {
    if (into != nullptr) {
      detail::descriptor* d = into;
      into = nullptr;
      attach_existing(d, loc);
      return d;
    }
    detail::descriptor* d = detail::descriptor::create();
    d->loc = loc;
    d->queue = &queue;
    // The slice's own reference plus the handle returned to the caller.
    d->state.store(detail::descriptor::attached_bit | detail::descriptor::one_handle | 2, std::memory_order_release);
    return d;
  }
  /// Attaches an existing descriptor (from bind) that callers already hold.
  void attach_existing(detail::descriptor* d, const location& loc) {
    d->loc = loc;
    d->queue = &queue;
    d->state.fetch_add(detail::descriptor::attached_bit | detail::descriptor::one_ref, std::memory_order_acq_rel);
  }
  /// Detaches a descriptor from its slice; recycles it when nothing else refers to it.
  void detach(detail::descriptor* d) {
    if (d->state.load(std::memory_order_acquire) == (detail::descriptor::attached_bit | detail::descriptor::one_ref)) {
      // Only the slice's reference is left: nothing else can reach the descriptor.
      detail::descriptor::destroy(d);
      return;
    }
    const std::uint64_t old =
        d->state.fetch_sub(detail::descriptor::attached_bit | detail::descriptor::one_ref, std::memory_order_acq_rel);
    if (detail::descriptor::total(old) == 1) detail::descriptor::destroy(d);
    if ((old & detail::descriptor::queued_bit) != 0) ++detached_in_flight;
  }

  /// What the device holds for devrt: the pools' memory and what is on its way back.
  [[nodiscard]] std::uint64_t held() const { return stats.bytes_reserved + store.returning_bytes(); }
  /// Whether `more` bytes fit under the limit (memory on its way back is let go first when the
  /// device has nothing left to run). For a mapping, physical memory the device keeps from earlier
  /// unmaps does not count: the map reuses or releases it before it takes memory (kept_bytes).
  bool within_limit(std::uint64_t more, bool mapping = false) {
    const auto fits = [&] { return held() - (mapping ? store.kept_bytes() : 0) + more <= limit; };
    if (limit == 0 || fits()) return true;
    push_unmaps();
    return fits();
  }
  /// The refusal of `size` bytes at the limit.
  [[nodiscard]] error over_limit(std::uint64_t size) const {
    error e = error::make(errc::out_of_memory, "the device's memory limit would be passed");
    e.size = size;
    e.limit = limit;
    e.in_use = held();
    e.text = "memory limit";
    return e;
  }
  /// Far from the budget: what the device holds, with `more` bytes, stays under roomy_below. The
  /// pools then keep free memory mapped and map in larger units; nearer, they trim. Not more: the
  /// free parts of large mappings that live slices pin stay mapped for good, and a workload
  /// capped at 1.05 times its peak of live bytes needs them back by then (measured on the traces
  /// of BENCHMARKS.md: an eighth of such a limit, half of a device without one).
  [[nodiscard]] bool roomy(std::uint64_t more) const { return roomy_below != 0 && held() + more <= roomy_below; }

  /// Allocates a page from the storage and counts it.
  result<storage_handle> alloc_page(std::uint64_t size) {
    if (!within_limit(size)) return over_limit(size);
    auto r = store.alloc(size);
    if (r) {
      ++stats.driver_allocs;
      stats.bytes_reserved += size;
      note_peak();
      if (tracing()) trace_segment(trace_action::segment_alloc, r->id, r->offset, size);
    } else if (r.code() == errc::out_of_memory) {
      ++stats.out_of_memory;
    }
    return r;
  }
  /// Queues a page for return to the storage and counts it.
  void free_page(storage_id id, std::uint64_t size) {
    if (tracing()) trace_segment(trace_action::segment_free, id, 0, size);
    store.dealloc(id);
    returns_queued = true;
    ++stats.driver_frees;
    stats.bytes_reserved -= size;
  }
  /// Maps memory into an address range of the storage and counts it like a page.
  result<void> map_memory(storage_id range, std::uint64_t offset, std::uint64_t size) {
    if (!within_limit(size, true)) return over_limit(size);
    auto r = store.map(range, offset, size);
    if (r) {
      ++stats.maps;
      stats.bytes_reserved += size;
      note_peak();
      if (tracing()) trace_segment(trace_action::segment_alloc, range, offset, size);
    } else if (r.code() == errc::out_of_memory) {
      ++stats.out_of_memory;
    }
    return r;
  }
  /// Unmaps memory from an address range (returned after the device's queued work) and counts it.
  /// `idle`: no queued work can reach the memory (storage::unmap_idle): given back at once.
  void unmap_memory(storage_id range, std::uint64_t offset, std::uint64_t size, bool idle = false) {
    if (tracing()) trace_segment(trace_action::segment_free, range, offset, size);
    if (idle) {
      store.unmap_idle(range, offset, size);
    } else {
      store.unmap(range, offset, size);
    }
    returns_queued = true;
    ++stats.unmaps;
    stats.bytes_reserved -= size;
  }
  /// Lets the unmaps just requested reach an ordered device before memory is mapped elsewhere: a
  /// device with nothing left to run takes them back at once, so that the memory held never counts
  /// them and the new mapping together, and may keep their physical memory for the maps that
  /// follow (`storage::settle`). Behind busy streams they stay on their way back. A failed settle
  /// keeps its queue for the flush after the batch, which reports it.
  void push_unmaps() {
    if (store.ordered() && store.pending_deallocations() != 0) (void)store.settle();
  }
  /// The peak of what the device holds: the pools' memory and what is still on its way back.
  void note_peak() {
    const std::uint64_t held = stats.bytes_reserved + store.returning_bytes();
    if (held > stats.peak_bytes_reserved) stats.peak_bytes_reserved = held;
  }
  void add_in_use(std::uint64_t bytes) {
    stats.bytes_in_use += bytes;
    if (stats.bytes_in_use > stats.peak_bytes_in_use) stats.peak_bytes_in_use = stats.bytes_in_use;
  }
  void sub_in_use(std::uint64_t bytes) { stats.bytes_in_use -= bytes; }
  [[nodiscard]] bool tracing() const noexcept { return history != nullptr && history->enabled(); }
  void trace_segment(trace_action a, storage_id id, std::uint64_t offset, std::uint64_t size) {
    history->add(a, snapshot_address(store, id, offset), size, streams::none);
  }
};

/// The state of one live or free slice as lookups see it.
struct slice_view {
  storage_handle storage;  ///< page id, offset of the slice, requested size
  std::uint64_t padding = 0;
  std::uint64_t cursor = 0;
};

/// Rounds `n` up to a multiple of `align` (align >= 1); a mask, not a divide, for the powers of
/// two that alignments and granules are in practice.
constexpr std::uint64_t align_up(std::uint64_t n, std::uint64_t align) noexcept {
  if ((align & (align - 1)) == 0) return (n + align - 1) & ~(align - 1);
  return (n + align - 1) / align * align;
}
/// Bytes a slice of `size` occupies: at least one alignment unit, so every allocation, including
/// a zero-size one, has an address of its own.
constexpr std::uint64_t slice_extent(std::uint64_t size, std::uint64_t align) noexcept {
  return align_up(size == 0 ? 1 : size, align);
}

}  // namespace devrt::memory
