// Handles and bindings: reference-counted identities of managed memory.
//
// A `memory_handle` and every copy of it share one descriptor: an id plus the location of the
// slice that holds the memory. A `memory_binding` shares the descriptor too, keeping the memory
// alive without counting as a user handle, so `can_mut()` (exactly one user handle) is unaffected
// by bindings held by queued work.
//
// Threading: copies, moves and drops of handles and bindings are safe from any thread (atomic
// counts). The location is read and written only by the owner of the memory manager (its thread or
// strand). When the last user reference to a slice's memory is dropped, the drop pushes the
// descriptor onto the manager's release queue (lock-free); the manager learns of the free the next
// time it runs, without scanning its slices.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "devrt/memory/error.hpp"
#include "devrt/memory/stream.hpp"

namespace devrt::memory {

/// Process-unique identity of an allocation.
struct memory_id {
  std::uint64_t value = 0;
  friend constexpr bool operator==(memory_id, memory_id) = default;
  friend constexpr auto operator<=>(memory_id, memory_id) = default;
};

/// Where a handle's memory lives: a pool, a page of it, and a slice slot.
struct location {
  static constexpr std::uint16_t persistent_pool = 255;  ///< sentinel pool index of the persistent pool
  /// Pool indices from here on are tags' arenas (index - first_tag_pool: the tag's number - 1).
  static constexpr std::uint16_t first_tag_pool = 256;
  std::uint16_t pool = 0;
  std::uint32_t page = 0;
  std::uint32_t slice = 0;
  bool init = false;  ///< false until a pool has placed the memory
  friend constexpr bool operator==(const location&, const location&) = default;
};

class release_queue;
class stream_state;

namespace detail {

/// The streams `record_stream` added to an allocation (owner thread writes; see descriptor).
struct stream_list {
  std::vector<stream_state*> streams;
};

/// Shared state behind handles and bindings.
///
/// `state` packs the reference counts and two flags so that a drop is one atomic operation:
///   bits  0..31  total references: user handles + bindings + 1 while attached (the slice's own
///                reference) + 1 while queued (the release queue's reference)
///   bits 32..61  user handles (for can_mut)
///   bit  62      queued: sits on (or is being pushed onto) a release queue
///   bit  63      attached: a live slice of a manager refers to this descriptor
/// Invariants: attached implies `queue != nullptr`; only the owner thread sets or clears attached.
struct descriptor {
  static constexpr std::uint64_t one_ref = 1;
  static constexpr std::uint64_t one_handle = std::uint64_t{1} << 32;
  static constexpr std::uint64_t total_mask = 0xffffffffULL;
  static constexpr std::uint64_t handle_mask = ((std::uint64_t{1} << 30) - 1) << 32;
  static constexpr std::uint64_t queued_bit = std::uint64_t{1} << 62;
  static constexpr std::uint64_t attached_bit = std::uint64_t{1} << 63;

  std::atomic<std::uint64_t> state{0};
  memory_id id{};
  location loc{};                       // owner thread only
  release_queue* queue = nullptr;       // set before attached is published
  descriptor* next_released = nullptr;  // link in the release queue or a free list
  /// Address and requested size of the memory, written by the owner when a pool places (or bind
  /// moves) it and before the handle is handed out; nullptr / 0 until then, and on devices
  /// without addresses (sim). Read from any thread.
  std::atomic<void*> address{nullptr};
  std::atomic<std::uint64_t> bytes{0};
  /// The stream the memory is used on (owner thread only; streams::device unless the reserve named
  /// another).
  stream_id stream = streams::device;
  /// On devices with streams: the registration of that stream, and those `record_stream` added
  /// (stream_order.hpp). The owner writes them before the handle is handed out or while a message
  /// holds a reference; the thread whose drop frees the memory reads them, to record the
  /// free-time fences of native streams before it hands the descriptor to the release queue.
  stream_state* stream_reg = nullptr;
  stream_list* more_streams = nullptr;
  /// Whether one of those streams is native (fenced at the free): the drop's one check.
  bool fence_at_free = false;
  /// Kept live by stream_order until the fences of its streams pass (owner thread only): a drop
  /// while held (after a capture pinned it again) does not hold it twice.
  bool held = false;
  /// The number of the reserve that gave it its memory on its device, from 1 (owner thread only;
  /// for snapshots and out-of-memory reports: older allocations have smaller numbers).
  std::uint64_t sequence = 0;
  /// Its tag (memory/tag.hpp; 0: none), set with the address (owner thread only).
  std::uint16_t tag = 0;

  /// Publishes where the memory lives (owner thread).
  void place(void* ptr, std::uint64_t size) noexcept {
    address.store(ptr, std::memory_order_relaxed);
    bytes.store(size, std::memory_order_relaxed);
  }
  // Why giving memory to this identity failed (a client's create), so that its later uses report
  // that failure for as long as the identity lives, however many others failed. Owner thread only;
  // allocated only on failure, freed with the descriptor.
  std::unique_ptr<const error> failure;

  static constexpr std::uint64_t total(std::uint64_t s) noexcept { return s & total_mask; }
  static constexpr std::uint64_t handles(std::uint64_t s) noexcept { return (s & handle_mask) >> 32; }

  /// An unattached descriptor with a fresh id and no references: from the calling thread's cache
  /// of free descriptors, which refills in batches from a process-wide pool, so the steady state
  /// allocates nothing however the threads that create descriptors and the threads that drop them
  /// are paired.
  static descriptor* create();
  /// Gives back a descriptor nobody refers to, to the calling thread's cache.
  static void destroy(descriptor* d) noexcept;

  void add_handle() noexcept { state.fetch_add(one_handle | one_ref, std::memory_order_relaxed); }
  void add_binding() noexcept { state.fetch_add(one_ref, std::memory_order_relaxed); }
  /// Drops one reference of the given kind (`one_handle | one_ref` or `one_ref`). Thread-safe.
  void release(std::uint64_t delta) noexcept;
};

/// Records the free-time fences of the native streams `d` was used on (stream_order.cpp); called
/// by the thread whose drop frees the memory, before the descriptor goes to the release queue.
void record_free_fences(const descriptor* d) noexcept;

/// A process-unique id; never 0. Threads take ids in blocks, so ids are unique but not ordered
/// across threads.
std::uint64_t next_memory_id() noexcept;

}  // namespace detail

class memory_binding;

/// A user's reference to managed memory. Cheap to copy; safe to copy and drop from any thread.
class memory_handle {
 public:
  /// An empty handle that refers to nothing.
  memory_handle() noexcept = default;
  /// A fresh identity with no memory yet: bind it to a reserved slice to give it memory.
  static memory_handle make();

  memory_handle(const memory_handle& o) noexcept : d_(o.d_) {
    if (d_ != nullptr) d_->add_handle();
  }
  memory_handle(memory_handle&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  memory_handle& operator=(const memory_handle& o) noexcept {
    memory_handle tmp(o);
    std::swap(d_, tmp.d_);
    return *this;
  }
  memory_handle& operator=(memory_handle&& o) noexcept {
    memory_handle tmp(std::move(o));
    std::swap(d_, tmp.d_);
    return *this;
  }
  ~memory_handle() { reset(); }

  /// Drops this reference (the handle becomes empty).
  void reset() noexcept {
    if (d_ != nullptr)
      std::exchange(d_, nullptr)->release(detail::descriptor::one_handle | detail::descriptor::one_ref);
  }

  [[nodiscard]] bool empty() const noexcept { return d_ == nullptr; }
  explicit operator bool() const noexcept { return d_ != nullptr; }
  /// The allocation's id (0 for an empty handle).
  [[nodiscard]] memory_id id() const noexcept { return d_ != nullptr ? d_->id : memory_id{}; }
  /// The memory's address (a device pointer on CUDA devices), valid while any handle or binding
  /// to it lives; available as soon as the reserve that returned the handle completed (for a
  /// `create`d handle, once the device has bound it). nullptr for an empty handle and on devices
  /// without addresses (sim).
  [[nodiscard]] void* ptr() const noexcept {
    return d_ != nullptr ? d_->address.load(std::memory_order_relaxed) : nullptr;
  }
  /// The size that was reserved (0 for an empty handle or a `create` not bound yet).
  [[nodiscard]] std::uint64_t size() const noexcept {
    return d_ != nullptr ? d_->bytes.load(std::memory_order_relaxed) : 0;
  }
  /// True when this is the only user handle (bindings do not count): the memory may be mutated
  /// in place.
  [[nodiscard]] bool can_mut() const noexcept {
    return d_ != nullptr && detail::descriptor::handles(d_->state.load(std::memory_order_acquire)) == 1;
  }
  /// Number of user handles sharing this identity (for tests and diagnostics).
  [[nodiscard]] std::uint64_t use_count() const noexcept {
    return d_ != nullptr ? detail::descriptor::handles(d_->state.load(std::memory_order_acquire)) : 0;
  }

  /// A binding to the same memory.
  [[nodiscard]] memory_binding binding() const& noexcept;
  /// Converts this handle into a binding.
  [[nodiscard]] memory_binding binding() && noexcept;

  friend bool operator==(const memory_handle& a, const memory_handle& b) noexcept { return a.d_ == b.d_; }

  /// Internal: the shared descriptor.
  [[nodiscard]] detail::descriptor* raw() const noexcept { return d_; }
  /// Internal: adopts a descriptor on which a handle reference was already added.
  static memory_handle adopt(detail::descriptor* d) noexcept {
    memory_handle h;
    h.d_ = d;
    return h;
  }

 private:
  detail::descriptor* d_ = nullptr;
};

/// A reference that keeps memory alive without counting as a user handle. Used by queued work.
class memory_binding {
 public:
  memory_binding() noexcept = default;
  memory_binding(const memory_binding& o) noexcept : d_(o.d_) {
    if (d_ != nullptr) d_->add_binding();
  }
  memory_binding(memory_binding&& o) noexcept : d_(std::exchange(o.d_, nullptr)) {}
  memory_binding& operator=(const memory_binding& o) noexcept {
    memory_binding tmp(o);
    std::swap(d_, tmp.d_);
    return *this;
  }
  memory_binding& operator=(memory_binding&& o) noexcept {
    memory_binding tmp(std::move(o));
    std::swap(d_, tmp.d_);
    return *this;
  }
  ~memory_binding() { reset(); }

  void reset() noexcept {
    if (d_ != nullptr) std::exchange(d_, nullptr)->release(detail::descriptor::one_ref);
  }
  [[nodiscard]] bool empty() const noexcept { return d_ == nullptr; }
  [[nodiscard]] memory_id id() const noexcept { return d_ != nullptr ? d_->id : memory_id{}; }
  /// See memory_handle::ptr and memory_handle::size.
  [[nodiscard]] void* ptr() const noexcept {
    return d_ != nullptr ? d_->address.load(std::memory_order_relaxed) : nullptr;
  }
  [[nodiscard]] std::uint64_t size() const noexcept {
    return d_ != nullptr ? d_->bytes.load(std::memory_order_relaxed) : 0;
  }
  [[nodiscard]] detail::descriptor* raw() const noexcept { return d_; }
  static memory_binding adopt(detail::descriptor* d) noexcept {
    memory_binding b;
    b.d_ = d;
    return b;
  }

 private:
  detail::descriptor* d_ = nullptr;
};

inline memory_binding memory_handle::binding() const& noexcept {
  if (d_ == nullptr) return {};
  d_->add_binding();
  return memory_binding::adopt(d_);
}

inline memory_binding memory_handle::binding() && noexcept {
  if (d_ == nullptr) return {};
  // Turn the handle reference into a binding reference: the total count is unchanged.
  d_->add_binding();
  memory_binding b = memory_binding::adopt(d_);
  reset();
  return b;
}

/// A multi-producer, single-consumer list of descriptors whose last user reference was dropped.
/// Producers are any threads; the consumer is the owner of the memory manager.
class release_queue {
 public:
  void push(detail::descriptor* d) noexcept {
    detail::descriptor* head = head_.load(std::memory_order_relaxed);
    do {
      d->next_released = head;
    } while (!head_.compare_exchange_weak(head, d, std::memory_order_release, std::memory_order_relaxed));
  }
  /// Takes everything pushed so far (most recent first).
  detail::descriptor* take_all() noexcept { return head_.exchange(nullptr, std::memory_order_acquire); }
  [[nodiscard]] bool empty() const noexcept { return head_.load(std::memory_order_relaxed) == nullptr; }

 private:
  std::atomic<detail::descriptor*> head_{nullptr};
};

}  // namespace devrt::memory
