// The mailbox of a device actor: many producer threads, one runner at a time.
//
// Who runs the actor is part of the mailbox's state (`owner`), changed under its lock:
//   none    nobody; nothing is queued.
//   device  the device thread's strand: a drain is posted or running, and takes what is queued.
//   caller  a client thread runs its own message in place, because it found the actor idle; what
//           others queue meanwhile goes to the device thread when it is done.
//
//   none --push--> device --drain finds nothing--> none
//   none --claim--> caller --release, queue empty--> none
//                         --release, queue not empty--> device
//
// Producers push messages; only the producer that finds the mailbox idle asks for a drain (it
// posts one drain to the strand), so a burst of messages costs one strand post instead of one per
// message. The device thread takes everything queued with one swap under the lock and runs it
// outside the lock. Messages hold their completion state inline (no allocation for small
// handlers).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "devrt/memory/error.hpp"
#include "devrt/runtime/spin.hpp"

namespace devrt::runtime {

class actor_core;

/// A move-only message: run on the strand with the actor's state, or aborted with an error when
/// the actor shuts down first. Callables up to `inline_size` bytes are stored inline.
class message {
 public:
  static constexpr std::size_t inline_size = 112;

  message() noexcept = default;
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, message>>>
  explicit message(F&& f) {  // NOLINT(bugprone-forwarding-reference-overload)
    using T = std::decay_t<F>;
    // NOLINTNEXTLINE(misc-redundant-expression): the terms are constant per message type
    if constexpr (sizeof(T) <= inline_size && alignof(T) <= alignof(std::max_align_t) &&
                  std::is_nothrow_move_constructible_v<T>) {
      ::new (static_cast<void*>(buf_)) T(std::forward<F>(f));
      vt_ = &inline_vtable<T>;
    } else {
      *reinterpret_cast<T**>(buf_) = new T(std::forward<F>(f));  // NOLINT
      vt_ = &heap_vtable<T>;
    }
  }
  message(message&& o) noexcept : vt_(std::exchange(o.vt_, nullptr)) {
    if (vt_ != nullptr) vt_->move(o.buf_, buf_);
  }
  message& operator=(message&& o) noexcept {
    if (this != &o) {
      reset();
      vt_ = std::exchange(o.vt_, nullptr);
      if (vt_ != nullptr) vt_->move(o.buf_, buf_);
    }
    return *this;
  }
  message(const message&) = delete;
  message& operator=(const message&) = delete;
  ~message() { reset(); }

  explicit operator bool() const noexcept { return vt_ != nullptr; }
  /// Runs the message on the strand. Consumes it.
  void run(actor_core& core) {
    auto* vt = std::exchange(vt_, nullptr);
    vt->run(buf_, core);
    vt->destroy(buf_);
  }
  /// Completes the message with an error instead of running it. Consumes it.
  void abort(const error& e) noexcept {
    auto* vt = std::exchange(vt_, nullptr);
    vt->abort(buf_, e);
    vt->destroy(buf_);
  }

 private:
  struct vtable {
    void (*run)(void*, actor_core&);
    void (*abort)(void*, const error&) noexcept;
    void (*destroy)(void*) noexcept;
    void (*move)(void* from, void* to) noexcept;
  };
  template <class T>
  static T& inl(void* p) noexcept {
    return *std::launder(reinterpret_cast<T*>(p));  // NOLINT
  }
  template <class T>
  static T& heap(void* p) noexcept {
    return **reinterpret_cast<T**>(p);  // NOLINT
  }
  template <class T>
  static constexpr vtable inline_vtable{[](void* p, actor_core& c) { inl<T>(p)(&c, nullptr); },
                                        [](void* p, const error& e) noexcept { inl<T>(p)(nullptr, &e); },
                                        [](void* p) noexcept { inl<T>(p).~T(); },
                                        [](void* from, void* to) noexcept {
                                          ::new (to) T(std::move(inl<T>(from)));
                                          inl<T>(from).~T();
                                        }};
  template <class T>
  static constexpr vtable heap_vtable{
      [](void* p, actor_core& c) { heap<T>(p)(&c, nullptr); },
      [](void* p, const error& e) noexcept { heap<T>(p)(nullptr, &e); }, [](void* p) noexcept { delete &heap<T>(p); },
      [](void* from, void* to) noexcept { *reinterpret_cast<T**>(to) = *reinterpret_cast<T**>(from); }};  // NOLINT

  void reset() noexcept {
    if (vt_ != nullptr) std::exchange(vt_, nullptr)->destroy(buf_);
  }

  alignas(std::max_align_t) unsigned char buf_[inline_size];
  const vtable* vt_ = nullptr;
};

/// Batching multi-producer queue of messages, and who runs them.
class mailbox {
 public:
  /// Who runs the actor now (see the diagram above). Invariant: the queue is empty when `none`.
  enum class owner : std::uint8_t { none, device, caller };

  enum class push_result {
    queued,          ///< the device thread or a caller will see it
    schedule_drain,  ///< the mailbox was idle: the caller must schedule a drain
    closed           ///< the mailbox is closed: the message was not queued
  };

  /// Queues a message. On `closed`, `m` is left untouched so the caller can abort it.
  push_result push(message& m) {
    std::lock_guard guard(lock_);
    if (closed_) return push_result::closed;
    queue_.push_back(std::move(m));
    queued_.store(true, std::memory_order_relaxed);
    if (owner_ != owner::none) return push_result::queued;
    owner_ = owner::device;
    return push_result::schedule_drain;
  }

  enum class claim_result {
    claimed,  ///< the caller runs `m` now; `m` was not queued
    queued,   ///< someone else runs the actor: `m` is queued for it
    closed    ///< the mailbox is closed: `m` was not queued
  };

  /// When nobody runs the actor, makes the caller its runner (`m` stays with the caller);
  /// otherwise queues `m` as `push` does.
  claim_result claim_or_push(message& m) {
    std::lock_guard guard(lock_);
    if (closed_) return claim_result::closed;
    if (owner_ == owner::none) {
      owner_ = owner::caller;
      return claim_result::claimed;
    }
    queue_.push_back(std::move(m));
    queued_.store(true, std::memory_order_relaxed);
    return claim_result::queued;
  }

  /// Ends a caller's run. True when the device thread must take over (messages were queued
  /// meanwhile, or `keep` says the actor has work to poll): the caller then schedules a drain.
  bool release(bool keep) {
    std::lock_guard guard(lock_);
    if (!closed_ && (keep || !queue_.empty())) {
      owner_ = owner::device;
      return true;
    }
    owner_ = owner::none;
    return false;
  }

  /// For strand work outside a drain (a timer, the shutdown): makes the device thread the runner
  /// unless a caller runs the actor now. Returns who ran it before: `caller` means not claimed,
  /// try again later; `device` means a drain is already scheduled and will give the actor up.
  owner claim_for_device() {
    std::lock_guard guard(lock_);
    const owner before = owner_;
    if (before != owner::caller) owner_ = owner::device;
    return before;
  }

  /// Takes every queued message into `out` (which must be empty); the device thread only. When
  /// nothing was queued, returns false and, if `go_idle`, gives the actor up (`none`: the next
  /// push schedules a drain).
  bool take(std::vector<message>& out, bool go_idle = true) {
    std::lock_guard guard(lock_);
    if (queue_.empty()) {
      if (go_idle) owner_ = owner::none;
      return false;
    }
    out.swap(queue_);
    queued_.store(false, std::memory_order_relaxed);
    return true;
  }

  /// Whether a message may be waiting, without taking the lock (for polling; `take` decides).
  [[nodiscard]] bool maybe_queued() const noexcept { return queued_.load(std::memory_order_relaxed); }

  /// Refuses further messages and returns those still queued.
  std::vector<message> close() {
    std::lock_guard guard(lock_);
    closed_ = true;
    return std::exchange(queue_, {});
  }

  [[nodiscard]] bool closed() const {
    std::lock_guard guard(lock_);
    return closed_;
  }

  [[nodiscard]] owner current_owner() const {
    std::lock_guard guard(lock_);
    return owner_;
  }

 private:
  mutable spin_lock lock_;
  std::vector<message> queue_;
  std::atomic<bool> queued_{false};
  owner owner_ = owner::none;
  bool closed_ = false;
};

}  // namespace devrt::runtime
