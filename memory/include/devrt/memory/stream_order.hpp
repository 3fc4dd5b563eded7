// Stream order: when memory freed on one stream may be used again, by whom, and when it may go
// back to the driver.
//
// The contract (the one PyTorch's caching allocator and cudaMallocAsync keep): memory whose last
// handle was dropped is free *in stream order*. Work queued on a stream runs in order, so memory
// that only its own stream used may be reused at once by later allocations on that stream. Any
// other reuse, an unmap or a return to the driver waits until a fence recorded on every stream
// that used the memory has passed.
//
// How devrt keeps it, per device (one `stream_order` per memory manager):
//
// - A *fence* is a ticket of the storage (a pooled CUDA event), never one per free: at most one in
//   flight per stream, recorded at the end of a batch once enough frees are unfenced or when
//   memory is wanted (see `fence`). Frees are numbered by *epoch*: the epoch advances at every
//   batch, so a stream's fence of epoch e covers every free on that stream of epoch <= e. Fences
//   are queried without blocking (after each batch, and when memory is needed); `done(q)` is the
//   newest epoch whose fence on `q` has passed.
// - While a single stream (other than the per-thread default stream) has used the device, frees
//   need no fence at all: every later allocation is on that stream too. When a second stream
//   comes, it is first made to wait for everything queued on the streams before it (`join`), and
//   from then on frees carry their stream.
// - With several streams, a free on its own stream goes back to its pool *tagged* with that
//   stream (the arena keeps tagged free memory apart and hands it only to the same stream) until
//   the stream's fence for its epoch has passed; other frees (the per-thread default stream,
//   memory `record_stream` named more streams for, pools without tags) are *held*: the slice stays
//   live in its pool until the fences of every stream it used have passed.
// - Memory goes back to the driver only behind the work of every stream in use: the storage is
//   told which streams those are (`use_queue`) and orders its returns after all of them.
// - Only under memory pressure (a reserve that would fail) does the device wait for fences
//   (`wait_all`), and each such wait is counted.
//
// On devices without queues (host, sim without queues) nothing here does anything: every ticket
// has passed, and frees are immediate.
//
// Owner: the memory manager; single-threaded like it.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <vector>

#include "devrt/memory/handle.hpp"
#include "devrt/memory/storage.hpp"
#include "devrt/memory/stream.hpp"

namespace devrt::memory {

/// Streams named for one allocation: its own and those `record_stream` added. Up to four without
/// a heap allocation (more are rare), contiguous either way.
class stream_set {
 public:
  stream_set() = default;
  stream_set(std::initializer_list<queue_id> qs) {
    for (const queue_id q : qs) push_back(q);
  }
  void push_back(queue_id q) {
    if (!heap_.empty() || n_ == inline_.size()) {
      if (heap_.empty()) heap_.assign(inline_.begin(), inline_.begin() + n_);
      heap_.push_back(q);
      return;
    }
    inline_[n_++] = q;
  }
  [[nodiscard]] const queue_id* begin() const noexcept { return heap_.empty() ? inline_.data() : heap_.data(); }
  [[nodiscard]] const queue_id* end() const noexcept { return begin() + size(); }
  [[nodiscard]] std::size_t size() const noexcept { return heap_.empty() ? n_ : heap_.size(); }
  [[nodiscard]] queue_id front() const noexcept { return *begin(); }

 private:
  std::array<queue_id, 4> inline_{};
  std::size_t n_ = 0;
  std::vector<queue_id> heap_;
};

class stream_order {
 public:
  explicit stream_order(storage& store) : store_(store), ordered_(store.ordered()) {}
  stream_order(const stream_order&) = delete;
  stream_order& operator=(const stream_order&) = delete;

  /// Whether the device has queues at all.
  [[nodiscard]] bool ordered() const noexcept { return ordered_; }
  /// Whether frees must carry their stream (several streams in use, or the per-thread one).
  [[nodiscard]] bool several() const noexcept { return several_; }
  /// The epoch a free made now belongs to.
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }

  /// Notes that `q` uses the device's memory (an allocation on it, or `record_stream`). The first
  /// use of a second stream joins it behind the streams before it. Errors: device_error.
  result<void> use(queue_id q);
  /// Forgets `q` (its owner is about to destroy it): frees on it are fenced now, and nothing is
  /// recorded on it afterwards. Errors: device_error.
  result<void> retire(queue_id q);

  /// A free on `q` of the current epoch that needs `q`'s fence (tagged or held).
  void freed_on(queue_id q);
  /// Holds `d` (still attached to its slice) until the fences of every stream in `streams` for
  /// the current epoch have passed.
  void hold(detail::descriptor* d, const stream_set& streams);
  [[nodiscard]] bool holding() const noexcept { return held_count_ > 0; }
  [[nodiscard]] std::uint64_t held_bytes() const noexcept { return held_bytes_; }

  /// End of a batch: records a fence on the streams freed on, and opens the next epoch. A stream
  /// has at most one fence in flight, and gets a new one only once `fence_after` frees are
  /// unfenced on it, or when memory is wanted (`want_fences`), or when slices are held: so a
  /// stream that reuses its own memory costs no event at all, and a busy one about one event per
  /// pass of the device. Errors: device_error (the frees stay unfenced and are retried at the
  /// next batch).
  result<void> fence();
  /// Memory is wanted by another stream (or held): the next `fence` fences every stream with
  /// unfenced frees.
  void want_fences() noexcept { urgent_ = true; }
  /// Frees unfenced on a stream before it gets a fence without being asked.
  static constexpr std::uint32_t fence_after = 64;
  /// Queries the oldest fences of every stream without blocking; true when some stream's done
  /// epoch advanced.
  bool poll();
  /// Memory pressure: fences what is unfenced and waits for every fence (counted in `waits`).
  /// False when nothing was pending.
  bool wait_all();
  /// Whether any fence is pending or any free is unfenced.
  [[nodiscard]] bool pending() const noexcept { return pending_fences_ > 0 || unfenced_; }

  /// The newest epoch whose fence on `q` has passed (every free on `q` of that epoch or before is
  /// safe for every stream).
  [[nodiscard]] std::uint64_t done(queue_id q) const noexcept;

  /// Calls `release(d)` for every held descriptor whose fences have all passed, and forgets it.
  template <class F>
  void release_ready(F&& release) {
    if (held_count_ == 0) return;
    for (auto& s : streams_) {
      while (!s.held.empty() && s.held.front().epoch <= s.done) {
        detail::descriptor* d = s.held.front().d;
        held_bytes_ -= s.held.front().bytes;
        s.held.pop_front();
        --held_count_;
        release(d);
      }
    }
    for (std::size_t i = 0; i < multi_.size();) {
      if (!ready(multi_[i])) {
        ++i;
        continue;
      }
      detail::descriptor* d = multi_[i].d;
      held_bytes_ -= multi_[i].bytes;
      multi_[i] = std::move(multi_.back());
      multi_.pop_back();
      --held_count_;
      release(d);
    }
  }
  /// Every held descriptor, ready or not (the manager's teardown, after the device has drained).
  template <class F>
  void release_all(F&& release) {
    for (auto& s : streams_) {
      for (auto& h : s.held) release(h.d);
      s.held.clear();
    }
    for (auto& m : multi_) release(m.d);
    multi_.clear();
    held_count_ = 0;
    held_bytes_ = 0;
  }

  /// Waits for fences under memory pressure (counted).
  [[nodiscard]] std::uint64_t waits() const noexcept { return waits_; }
  /// Fences recorded (one per stream per batch with frees).
  [[nodiscard]] std::uint64_t fences() const noexcept { return fences_; }
  /// Streams in use.
  [[nodiscard]] std::size_t stream_count() const noexcept;

 private:
  struct held_entry {
    detail::descriptor* d;
    std::uint64_t epoch;
    std::uint64_t bytes;
  };
  struct multi_entry {
    detail::descriptor* d;
    std::uint64_t epoch;
    std::uint64_t bytes;
    stream_set streams;
  };
  struct fence_entry {
    ticket t;
    std::uint64_t epoch;
  };
  // One stream's state. Invariants: `fences` are in epoch order, all newer than `done`;
  // `unfenced_epoch` > every fence's epoch when set (0 otherwise); `held` is in epoch order.
  struct stream_state {
    queue_id q = queue::none;
    bool active = true;                // in use (not retired): fences may be recorded on it
    std::uint64_t done = 0;            // newest epoch whose fence passed
    std::uint64_t unfenced_epoch = 0;  // epoch of frees not fenced yet (0: none)
    std::uint32_t unfenced = 0;        // frees not fenced yet
    std::deque<fence_entry> fences;
    std::deque<held_entry> held;
  };
  stream_state* find(queue_id q) noexcept;
  const stream_state* find(queue_id q) const noexcept;
  stream_state& state_of(queue_id q);
  bool ready(const multi_entry& m) const noexcept;
  result<void> fence_one(stream_state& s);

  storage& store_;
  bool ordered_;
  bool several_ = false;
  bool unfenced_ = false;
  bool urgent_ = false;
  std::uint64_t epoch_ = 1;
  std::vector<stream_state> streams_;
  std::vector<multi_entry> multi_;
  std::size_t held_count_ = 0;
  std::uint64_t held_bytes_ = 0;
  std::size_t pending_fences_ = 0;
  std::uint64_t waits_ = 0;
  std::uint64_t fences_ = 0;
};

}  // namespace devrt::memory
