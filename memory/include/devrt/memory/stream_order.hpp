// Stream order: when memory freed on one stream may be used again, by whom, and when it may go
// back to the driver; and the one registry of the streams that use a device's memory.
//
// The contract (PyTorch's caching allocator and cudaMallocAsync keep it, devrt keeps it on every
// path): memory whose last handle was dropped is free *in stream order*. Work queued on a stream
// runs in order, so memory that only its own stream used may be reused at once by later
// allocations on that stream. Any other reuse, an unmap, or a return to the driver waits until a
// fence behind the work queued on every stream that used the memory, by the time of the free, has
// passed.
//
// Streams. Every stream a reserve or `record_stream` names gets a *registration* (`stream_state`),
// its identity in devrt. A native stream (one a client created) is identified by the device
// (`storage::identify`, cudaStreamGetId), not by its handle: the driver hands a destroyed stream's
// handle to the next stream created, and that stream is a new registration, which never gets the
// old one's memory without its fences. A registration lives while memory refers to it (live
// allocations, or frees whose fences have not passed) and is forgotten once its memory is back;
// the registry never grows with streams that are gone. The device's own stream, the legacy and the
// per-thread default stream have one registration each for the life of the device.
//
// Fences. A fence is an event of the storage's, never one per free:
// - on a native stream it is recorded *at the free*, by the thread whose drop frees the memory,
//   while the stream is known to exist (`free_fence`, one event moved forward by every free), so
//   devrt never records on a client's stream later and a stream destroyed with work still queued
//   is safe; the owner takes that event at the end of a batch;
// - on the device's own stream, the legacy and the per-thread default stream (which live as long
//   as the device) it is recorded by the owner at the end of a batch (for the per-thread stream, on
//   the legacy stream, which orders every blocking stream).
// Either way at most one fence per stream is in flight, a new one is taken after `fence_after`
// unfenced frees or when memory is wanted, and fences are queried without blocking after every
// batch on the owner's thread (a client serving its request in place asks every few batches, or
// at once while memory is held: memory_manager::batch_end). `done` of a registration is the
// newest epoch whose fence *passed*; nothing else ever advances it, except a device-wide
// synchronization under memory pressure or at teardown.
//
// Frees. While the device's memory has been used on one stream only, and that stream is the
// device's own or the legacy stream (neither is ever destroyed), frees are immediate: every later
// allocation is on that stream too. When another stream first comes, a fence is recorded on the
// first one, and every stream registered until it passes waits for it (`stream_wait_event`), so
// none sees memory freed before while that work still runs. From then on frees carry their stream:
// a free on its own stream goes back to its pool *tagged* with the registration (the arena keeps
// tagged free memory apart and hands it only to the same registration) until its fence passes;
// other frees (the per-thread default stream, memory `record_stream` named more streams for,
// pools without tags) are *held*: the slice stays live in its pool until the fences of every
// stream it used have passed.
//
// Waiting. The owner never waits for the device on the normal path. Only under memory pressure (a
// reserve that would fail, `wait_all`) does it wait for fences, and each such wait is counted
// (`waits`); a stream whose fence could not be recorded (a record or query failed) is covered
// then by a synchronization of the whole device.
//
// On devices without streams (host, sim without streams) nothing here does anything: frees are
// immediate.
//
// Owner: the memory manager; single-threaded like it, except `detail::record_free_fences`, which
// any thread calls.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "devrt/memory/handle.hpp"
#include "devrt/memory/storage.hpp"
#include "devrt/memory/stream.hpp"

namespace devrt::memory {

/// What kind of stream a registration is.
enum class stream_kind : std::uint8_t {
  device,      ///< the device's own stream (devrt's)
  legacy,      ///< CUDA's legacy default stream
  per_thread,  ///< a thread's per-thread default stream: frees are held, fenced on the legacy stream
  native,      ///< a stream a client created: fenced at every free, may be destroyed at any time
};

/// One registration of a stream (see the top of the file). Owned by `stream_order`; its address
/// is stable, and descriptors that refer to it keep it alive.
class stream_state {
 public:
  // ---- Identity, fixed at registration ----
  stream_id handle = streams::none;  ///< what work is ordered on (native: the cudaStream_t)
  stream_kind kind = stream_kind::device;
  std::uint64_t uid = 0;     ///< native: the device's id of the stream (storage::identify)
  int device = 0;            ///< native: the device the stream runs on
  bool foreign = false;      ///< native: another device's stream (record_stream only)
  std::uint64_t serial = 0;  ///< devrt's name of this registration, never reused (arena tags)
  /// Native: recorded by the thread of every free of memory used on the stream (any thread).
  std::unique_ptr<free_fence> fence;

  // ---- Lifecycle (owner thread) ----
  /// Descriptors whose memory is used on it (its own stream, or added by record_stream). While
  /// nonzero the registration stays.
  std::uint64_t refs = 0;
  /// retire_stream was called: forgotten as soon as its memory is back.
  bool retired = false;
  /// A fence could not be recorded or queried: its frees are fenced only by a synchronization of
  /// the whole device (memory pressure, teardown).
  bool broken = false;
  /// On the owner's list of registrations to forget once idle.
  bool candidate = false;
  /// Its place in the owner's list of registrations.
  std::size_t slot = 0;

  // ---- Fences (owner thread) ----
  // Invariants: `fences` are in epoch order, every epoch newer than `done`; `unfenced_epoch` is
  // newer than every fence when set (0: no unfenced free); `held` is in epoch order;
  // `last_free_epoch` is the newest epoch of any free on it, so its memory is all back once
  // `done` reaches it.
  struct fence_entry {
    event e;
    std::uint64_t epoch;
  };
  struct held_entry {
    detail::descriptor* d;
    std::uint64_t epoch;
    std::uint64_t bytes;
  };
  std::uint64_t done = 0;
  std::uint64_t unfenced_epoch = 0;
  std::uint32_t unfenced = 0;
  std::uint64_t last_free_epoch = 0;
  std::deque<fence_entry> fences;
  std::deque<held_entry> held;
  bool on_unfenced_list = false;
  bool on_pending_list = false;
  bool advanced = false;  // `done` moved since the last release_ready
};

class stream_order {
 public:
  explicit stream_order(storage& store);
  stream_order(const stream_order&) = delete;
  stream_order& operator=(const stream_order&) = delete;
  ~stream_order();

  /// Whether the device has streams at all.
  [[nodiscard]] bool ordered() const noexcept { return ordered_; }
  /// Whether frees carry their stream (more than one stream, or a native or per-thread one, has
  /// used the device's memory). False until then: frees are immediate.
  [[nodiscard]] bool tagged() const noexcept { return tagged_; }
  /// Whether the memory the pools hold free for every stream is out of reach of all queued work:
  /// frees carry their stream, so such memory is either freed on a stream whose fence has passed
  /// since or held until every fence passed, and the first stream's transition fence (covering
  /// what was freed at once before) has passed too. Its unmaps need not wait behind the device.
  [[nodiscard]] bool frees_fenced() const noexcept { return tagged_ && transition_ == 0; }
  /// The epoch a free made now belongs to.
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }

  /// The registration of stream `s` for a reserve or a record_stream, made on its first use (a
  /// native stream is identified by the device). The first stream after the first makes frees
  /// carry their stream, and waits for the work queued on the first. Errors: invalid_argument (a
  /// handle the device does not know as a stream), capture_active (a new stream while the device's
  /// stream records a capture and its first use cannot be ordered), device_error.
  result<stream_state*> enter(stream_id s);
  /// The stream is about to be destroyed: its frees so far are fenced now (no later record on it),
  /// and its registration is forgotten once its memory is back. Optional: frees are fenced when
  /// they happen. The device's own, legacy and per-thread streams are never destroyed: nothing
  /// happens for them. Errors: device_error.
  result<void> retire(stream_id s);

  /// One more (one less) descriptor refers to `s`.
  void ref(stream_state& s) noexcept { ++s.refs; }
  void unref(stream_state& s);
  /// A free on `s` of the current epoch that needs its fence (a tagged free, or one of a hold).
  void freed_on(stream_state& s);
  /// Keeps `d` (still attached to its slice) until the fences of its stream and of those
  /// record_stream added, for the current epoch, have passed.
  void hold(detail::descriptor* d);
  [[nodiscard]] bool holding() const noexcept { return held_count_ > 0; }
  [[nodiscard]] std::uint64_t held_bytes() const noexcept { return held_bytes_; }
  [[nodiscard]] std::size_t held_count() const noexcept { return held_count_; }

  /// End of a batch: takes or records a fence for the streams freed on, and opens the next epoch.
  /// A stream has at most one fence in flight, and gets a new one only once `fence_after` frees
  /// are unfenced on it, or when memory is wanted (`want_fences`), or when slices are held: so a
  /// stream that reuses its own memory costs no event at all. Errors: device_error (those frees
  /// stay unfenced; a native stream's record that failed leaves it broken).
  result<void> fence();
  /// Memory is wanted by another stream (or held): the next `fence` fences every stream with
  /// unfenced frees.
  void want_fences() noexcept { urgent_ = true; }
  /// Frees unfenced on a stream before it gets a fence without being asked.
  static constexpr std::uint32_t fence_after = 64;
  /// Queries the oldest fences without blocking; true when some stream's `done` advanced. A
  /// query that fails leaves its stream broken (its memory waits for a device synchronization).
  bool poll();
  /// Memory pressure: fences what is unfenced and waits for every fence, and synchronizes the
  /// whole device for broken streams (counted in `waits`). False when nothing was pending.
  bool wait_all();
  /// The device's own stream waits (stream_wait_event; no wait here) for the work queued so far on
  /// every stream registered, for what must follow whatever may still use the device's memory (a
  /// tag's sleep). Unfenced frees get their fences first. A native stream destroyed since
  /// (`identify` no longer names it) is covered by its newest fence when no live memory refers to
  /// it; otherwise, and for another device's stream or a broken one, the whole device is
  /// synchronized instead (counted in `waits`). Errors: capture_active, device_error.
  result<void> order_device_after_all();
  /// Whether any fence is in flight or any free unfenced (broken streams aside).
  [[nodiscard]] bool pending() const noexcept { return pending_fences_ > 0 || unfenced_; }
  /// Whether memory waits for fences that the device may pass, or for a synchronization.
  [[nodiscard]] bool reclaimable() const noexcept { return pending() || broken_ > 0; }

  /// The newest epoch whose fence passed on the registration of serial `serial` (every free on it
  /// of that epoch or before is safe for every stream); 0 for an unknown serial.
  [[nodiscard]] std::uint64_t done(std::uint64_t serial) const noexcept;
  /// Whether every stream `d` was used on has passed `epoch`.
  [[nodiscard]] bool ready(const detail::descriptor* d, std::uint64_t epoch) const noexcept;

  /// Calls `release(d)` for every held descriptor whose fences have all passed, and forgets it.
  template <class F>
  void release_ready(F&& release) {
    if (held_count_ == 0) {
      for (stream_state* s : advanced_) s->advanced = false;
      advanced_.clear();
      return;
    }
    const bool any = !advanced_.empty();
    for (stream_state* s : advanced_) {
      s->advanced = false;
      while (!s->held.empty() && s->held.front().epoch <= s->done) {
        const stream_state::held_entry h = s->held.front();
        s->held.pop_front();
        forget_held(h.bytes);
        release(h.d);
      }
    }
    advanced_.clear();
    if (!any) return;
    for (std::size_t i = 0; i < multi_.size();) {
      if (!ready(multi_[i].d, multi_[i].epoch)) {
        ++i;
        continue;
      }
      const stream_state::held_entry h = multi_[i];
      multi_[i] = multi_.back();
      multi_.pop_back();
      forget_held(h.bytes);
      release(h.d);
    }
  }
  /// Every held descriptor, ready or not (the manager's teardown: the storage drains the device
  /// before it gives the memory back).
  template <class F>
  void release_all(F&& release) {
    for (auto& s : registrations_) {
      for (auto& h : s->held) release(h.d);
      s->held.clear();
    }
    for (auto& m : multi_) release(m.d);
    multi_.clear();
    held_count_ = 0;
    held_bytes_ = 0;
  }
  /// Calls `f(d, bytes)` for every held descriptor.
  template <class F>
  void for_each_held(F&& f) const {
    for (const auto& s : registrations_) {
      for (const auto& h : s->held) f(h.d, h.bytes);
    }
    for (const auto& m : multi_) f(m.d, m.bytes);
  }
  /// Forgets the registrations that are idle (nothing refers to them, their memory is back). Call
  /// it after the pools have freed what the fences allow.
  void collect();

  /// Waits for fences under memory pressure (counted).
  [[nodiscard]] std::uint64_t waits() const noexcept { return waits_; }
  /// Fences taken or recorded.
  [[nodiscard]] std::uint64_t fences() const noexcept { return fences_; }
  /// Registrations alive (streams whose memory devrt still tracks).
  [[nodiscard]] std::size_t stream_count() const noexcept { return registrations_.size(); }
  /// Registrations made so far (every new stream, and every new stream behind a reused handle).
  [[nodiscard]] std::uint64_t registrations_made() const noexcept { return next_serial_ - 1; }
  /// Whether some registration's `done` moved since the pools last freed what fences allow.
  [[nodiscard]] bool advanced() const noexcept { return !advanced_.empty(); }
  /// Registrations whose fences could not be recorded or queried.
  [[nodiscard]] std::size_t broken_streams() const noexcept { return broken_; }
  /// One line per registration (kind, serial, references, fences, held slices, epochs), for
  /// reports and failing tests.
  [[nodiscard]] std::string describe() const;
  /// The registration of `s` if it has one now (native: looked up by the device's identity).
  [[nodiscard]] stream_state* find(stream_id s);

 private:
  stream_state* fixed(stream_kind k) noexcept { return fixed_[static_cast<std::size_t>(k)]; }
  result<stream_state*> make(stream_id s, stream_kind k, const stream_identity& id);
  result<void> fence_one(stream_state& s);
  void mark_broken(stream_state& s) noexcept;
  void advance(stream_state& s, std::uint64_t epoch) noexcept;
  void note_pending(stream_state& s);
  void forget_held(std::uint64_t bytes) noexcept {
    --held_count_;
    held_bytes_ -= bytes;
  }
  void candidate(stream_state& s);

  storage& store_;
  bool ordered_;
  bool tagged_ = false;
  bool unfenced_ = false;
  bool urgent_ = false;
  std::uint64_t epoch_ = 1;
  std::uint64_t next_serial_ = 1;
  /// The first stream while frees are immediate (the device's own or the legacy stream).
  stream_state* first_ = nullptr;
  /// The fence on the first stream that every new registration waits for, until it passes.
  event transition_ = 0;
  std::vector<std::unique_ptr<stream_state>> registrations_;
  stream_state* fixed_[3] = {nullptr, nullptr, nullptr};  // device, legacy, per_thread
  std::unordered_map<std::uint64_t, stream_state*> by_uid_;
  std::unordered_map<std::uint64_t, stream_state*> by_serial_;
  std::vector<stream_state*> unfenced_list_;     // registrations with unfenced frees
  std::vector<stream_state*> pending_list_;      // registrations with fences in flight
  std::vector<stream_state*> advanced_;          // registrations whose `done` moved
  std::vector<stream_state*> candidates_;        // registrations that may be idle
  std::vector<stream_state::held_entry> multi_;  // held for several streams
  std::size_t held_count_ = 0;
  std::uint64_t held_bytes_ = 0;
  std::size_t pending_fences_ = 0;
  std::size_t broken_ = 0;
  std::uint64_t waits_ = 0;
  std::uint64_t fences_ = 0;
};

}  // namespace devrt::memory
