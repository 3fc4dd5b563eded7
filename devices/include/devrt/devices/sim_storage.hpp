// Simulated storage: pages are ids and sizes only, with no memory behind them. It has the
// properties and capacity of any device (an H200's by `sim_options::h200()`), so traces larger than
// this machine can be replayed, and it fails on request: the N-th allocation, the next flush, the
// next event record or query, the next identification of a stream. With a map granularity it also
// reserves address ranges and maps granules into them.
//
// With `sim_options::streams` it simulates what a GPU's streams do to memory, exactly and under the
// test's control: streams that clients create and destroy (the driver hands a destroyed stream's
// handle to the next stream created, as CUDA does, and a record on a destroyed stream fails),
// events that pass only when the test lets a stream progress, waits of one stream for another's
// event that hold it back until that event passes, free-time fences recorded from any thread,
// streams of another device, and unmaps that take effect behind the work queued before them.
//
// Threading: owned by one memory manager and called from its owner thread; free-time fences
// (`free_fence::record`) and the test's progress calls may come from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "devrt/memory/storage.hpp"

namespace devrt::devices {

struct sim_options {
  memory::device_properties props{1ULL << 30, 512, 0};  ///< capacity 0: no limit
  std::string name = "sim";
  /// Simulate streams: events pass only when the test lets the simulated device progress
  /// (`sim_storage::progress`), so stream-ordered reuse can be checked without a GPU.
  bool streams = false;
  /// The simulated device's index (streams of other indices are another device's).
  int device = 0;
  /// With `streams`: an unmap takes effect as on a GPU, behind the work queued before it. A flush
  /// gives the memory back at once when no event of any stream is outstanding (the device has
  /// nothing left to run), otherwise behind an event on the device's stream, given back by the first
  /// flush or map after that event has passed. Until then the memory is returning
  /// (`returning_bytes`); the same bounds mapped again keep it; other bounds over it wait (counted
  /// in `waits()`).
  bool deferred_unmaps = false;
  /// With `streams`: work queued on a stream also runs by itself, as a GPU runs it without the
  /// host's help: an event passes once this long has gone by since it was recorded (0: only when
  /// the test lets the device progress). Events pass in the order they were recorded, so a stream's
  /// order and its waits (which point back in time) hold. A model of kernel time that does not
  /// depend on a thread of the host getting the CPU.
  std::chrono::nanoseconds runs_after{0};

  /// An NVIDIA H200: 512-byte alignment, 150,109,880,320 bytes, pages up to a quarter of that,
  /// memory mapped in 2 MiB granules.
  static sim_options h200();
};

class vmm;

class sim_storage {
 public:
  explicit sim_storage(sim_options opts = {});
  ~sim_storage();
  sim_storage(const sim_storage&) = delete;
  sim_storage& operator=(const sim_storage&) = delete;

  [[nodiscard]] std::uint64_t alignment() const noexcept { return opts_.props.alignment; }
  [[nodiscard]] memory::device_properties properties() const noexcept { return opts_.props; }
  /// Errors: out_of_memory when the capacity would be exceeded or a failure was injected.
  result<memory::storage_handle> alloc(std::uint64_t size);
  void dealloc(memory::storage_id id);
  /// Bytes of queued pages (released at the next flush).
  [[nodiscard]] std::uint64_t returning_bytes() const noexcept;
  /// Unmaps deferred behind queued work and not done yet.
  [[nodiscard]] std::size_t unmaps_in_flight() const noexcept;
  /// Releases queued pages (with streams: behind the work queued on the device's stream, as
  /// cudaFreeAsync). Error device_error when a failure was injected; the queue is kept.
  result<void> flush();
  /// A resource with no pointer. Errors: not_found, invalid_argument.
  [[nodiscard]] result<memory::resource> get(const memory::storage_handle& h);
  result<void> write(const memory::storage_handle& h, const void* src);
  result<void> read(const memory::storage_handle& h, void* dst);
  /// A sleeping tag's contents: the simulated device holds no bytes, so there is nothing to copy
  /// (the view must still exist). Error invalid_argument for a view the device does not know.
  result<void> copy_to_host(const memory::storage_handle& h, void* dst);
  result<void> copy_from_host(const memory::storage_handle& h, const void* src);
  [[nodiscard]] std::size_t pending_deallocations() const noexcept;
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
  /// Memory no queued work reaches: unmapped at once even with `deferred_unmaps`, its physical
  /// memory kept for the next map of its size until the next flush.
  void unmap_idle(memory::storage_id range, std::uint64_t offset, std::uint64_t size);
  void release_range(memory::storage_id range);
  /// With `deferred_unmaps`: the unmaps requested so far are recorded (done at once when nothing is
  /// left to run), their memory kept for the maps that follow until the next flush.
  result<void> settle();

  // ---- Simulated streams (sim_options::streams) ----
  [[nodiscard]] bool ordered() const noexcept { return opts_.streams; }
  [[nodiscard]] void* native_stream() noexcept { return nullptr; }
  result<void> begin_capture();
  result<std::shared_ptr<memory::recorded_work>> end_capture();
  result<void> synchronize() {
    progress();
    return {};
  }
  /// An event that passes when the simulated device progresses past it on stream `s`. Errors:
  /// device_error (injected, or `s` a destroyed stream), capture_active (the device's stream
  /// during a capture).
  result<memory::event> record_event(memory::stream_id s);
  result<bool> query_event(memory::event e);
  /// Lets the event's stream run up to `e` (counted in waits()).
  result<void> wait_event(memory::event e);
  /// Later work on `s` waits for `e` (it cannot pass before `e` has).
  result<void> stream_wait_event(memory::stream_id s, memory::event e);
  void release_event(memory::event) noexcept {}
  result<memory::stream_identity> identify(memory::stream_id s);
  result<std::unique_ptr<memory::free_fence>> make_free_fence(memory::stream_id s, const memory::stream_identity& id);
  /// Every stream, destroyed ones included, finishes its work (counted in waits()).
  result<void> synchronize_device();
  void return_after(memory::stream_id s);
  result<void> write_on(const memory::storage_handle& h, const void* src, memory::stream_id) { return write(h, src); }
  result<memory::event> read_async(const memory::storage_handle& h, void* dst, memory::stream_id s);

  /// A stream a client creates: a new handle, or (as CUDA does) the handle of the stream destroyed
  /// last, now naming a new stream. `device`: the device it runs on (default: this one).
  memory::stream_id create_stream(int device = -1);
  /// Destroys the stream: its handle names no stream until a create reuses it, records on it
  /// fail, and its queued work still runs (progress_uid).
  void destroy_stream(memory::stream_id s);
  /// The simulated device's id of the stream a handle names now (0: none). A handle never created
  /// is a stream of its own from its first use (so tests may name streams by any value).
  [[nodiscard]] std::uint64_t stream_uid(memory::stream_id s);
  /// The simulated device finishes every piece of work queued so far, on every stream.
  void progress() noexcept;
  /// Stream `s` (the one its handle names now) finishes what it can of the work queued on it so
  /// far: up to the first wait for an event that has not passed.
  void progress_stream(memory::stream_id s) noexcept;
  /// The same for a stream by id (a destroyed stream's work).
  void progress_uid(std::uint64_t uid) noexcept;
  /// The stream of `e` runs up to it (and what it waits for first); not counted as a wait.
  void run_until(memory::event e) noexcept;
  /// A client's wait for stream `s`, as a host thread waits for a GPU stream: returns once the
  /// work queued on `s` so far has run. With `runs_after` the calling thread sleeps until that work
  /// is due (the simulated kernels take their time), otherwise the stream runs at once. Not counted
  /// in `waits()`, which counts the memory manager's waits. Errors: those of `record_event`
  /// (device_error for a destroyed stream, capture_active for the device's stream in a capture).
  result<void> synchronize_stream(memory::stream_id s);
  /// Events handed out so far (each new event is the next number).
  [[nodiscard]] memory::event issued_events() const noexcept;
  /// The newest event of stream `s` that has passed (0: none).
  [[nodiscard]] memory::event passed_on(memory::stream_id s);
  /// Whether `e` has passed.
  [[nodiscard]] bool has_passed(memory::event e) const noexcept;
  /// Whether work queued on stream uid `uid` from now on runs after `e` (e passed, `e` is on that
  /// stream, or the stream waits for an event that is ordered after it).
  [[nodiscard]] bool ordered_after(std::uint64_t uid, memory::event e) const noexcept;
  /// The stream id (uid) an event was recorded on.
  [[nodiscard]] std::uint64_t uid_of(memory::event e) const noexcept;
  [[nodiscard]] std::uint64_t waits() const noexcept { return waits_; }
  /// Event queries made so far (query_event): what a GPU's driver would be asked.
  [[nodiscard]] std::uint64_t queries() const noexcept;
  [[nodiscard]] std::uint64_t joins() const noexcept { return joins_; }
  [[nodiscard]] std::uint64_t free_records() const noexcept;
  /// The streams `return_after` named.
  [[nodiscard]] const std::vector<memory::stream_id>& returns_after() const noexcept { return return_after_; }
  /// Memory the simulated driver took back: pages, mappings (range, offset, size; page: offset 0),
  /// and address ranges. Called by the owner thread at the moment it happens (tests check that no
  /// stream may still use it).
  struct given_back {
    memory::storage_id id;
    std::uint64_t offset;
    std::uint64_t size;
  };
  std::function<void(const given_back&)> on_give_back;

  // ---- Fault injection and introspection ----
  /// Makes the n-th allocation from now (1 = the next one) fail with out_of_memory.
  void fail_allocation(std::uint64_t n) noexcept { fail_at_ = alloc_calls_ + n; }
  /// Makes the next flush fail with device_error.
  void fail_next_flush() noexcept { fail_flush_ = true; }
  /// The threads that made flushes with deallocations queued (each once, in order of first use).
  [[nodiscard]] const std::vector<std::thread::id>& flush_threads() const noexcept { return flush_threads_; }
  /// Makes the next event record of the owner (record_event) fail with device_error.
  void fail_next_record() noexcept { fail_record_ = true; }
  /// Makes the next free-time record (free_fence::record) fail.
  void fail_next_free_record() noexcept;
  /// Makes the next event query fail with device_error (the event is gone with it).
  void fail_next_query() noexcept { fail_query_ = true; }
  /// Makes the next identification of a stream fail with device_error.
  void fail_next_identify() noexcept { fail_identify_ = true; }
  void set_capacity(std::uint64_t bytes) noexcept { opts_.props.capacity = bytes; }
  [[nodiscard]] std::uint64_t allocated_bytes() const noexcept { return allocated_; }
  /// Bytes under the capacity it does not hold (the capacity less what it holds; absent without a
  /// capacity).
  [[nodiscard]] std::optional<std::uint64_t> device_free() const noexcept {
    const std::uint64_t cap = opts_.props.capacity;
    if (cap == 0) return std::nullopt;
    return cap - std::min(allocated_, cap);
  }
  [[nodiscard]] std::uint64_t peak_allocated_bytes() const noexcept { return peak_; }
  [[nodiscard]] std::size_t page_count() const noexcept { return pages_.size(); }
  [[nodiscard]] std::uint64_t alloc_calls() const noexcept { return alloc_calls_; }
  [[nodiscard]] std::uint64_t allocations() const noexcept { return allocations_; }
  [[nodiscard]] std::uint64_t frees() const noexcept { return frees_; }
  /// Makes the next map fail with device_error after its physical memory was created (which is
  /// then given back).
  void fail_next_map() noexcept { fail_map_ = true; }
  /// Bytes mapped into address ranges (unmaps not yet done included).
  [[nodiscard]] std::uint64_t mapped_bytes() const noexcept;
  [[nodiscard]] std::size_t range_count() const noexcept;
  /// Calls that broke the contract (unmapping what is not mapped, unknown ranges).
  [[nodiscard]] std::uint64_t misuses() const noexcept;
  /// Physical allocations kept after an unmap done at once, for the next map of their size, and
  /// their bytes (part of returning_bytes).
  [[nodiscard]] std::size_t kept_allocations() const noexcept;
  [[nodiscard]] std::uint64_t kept_bytes() const noexcept;
  /// Maps that took a kept physical allocation instead of creating one.
  [[nodiscard]] std::uint64_t reused_allocations() const noexcept;

 private:
  /// Counts an allocation call (pages and mappings alike) and refuses it on an injected fault or
  /// when the capacity would be passed: out_of_memory with the size, the bytes held and the capacity.
  result<void> admit(std::uint64_t size);
  /// Books `size` bytes as held.
  void charge(std::uint64_t size) noexcept;

  sim_options opts_;
  // A page given back behind the device's stream (with streams): freed once `after` has passed (0:
  // at once).
  struct freeing {
    memory::storage_id id;
    memory::event after;
  };
  void free_now(memory::storage_id id);
  class driver_impl;
  /// An event behind the device's stream after it waited for the streams returns wait for; 0 when
  /// nothing is left to run anywhere.
  result<memory::event> behind_device();

  std::unordered_map<memory::storage_id, std::uint64_t> pages_;
  std::vector<memory::storage_id> pending_;
  std::vector<freeing> freeing_;
  std::unique_ptr<driver_impl> driver_;
  std::unique_ptr<vmm> vmm_;  // address ranges and mappings (the CUDA storage's state machine)
  std::map<std::uint64_t, memory::storage_id> range_at_;  // base address -> range
  std::uint64_t next_base_ = std::uint64_t{1} << 40;
  std::uint64_t misuses_ = 0;
  bool fail_map_ = false;
  std::uint64_t allocated_ = 0;
  std::uint64_t peak_ = 0;
  std::uint64_t alloc_calls_ = 0;
  std::uint64_t allocations_ = 0;
  std::uint64_t frees_ = 0;
  std::optional<std::uint64_t> fail_at_;
  bool fail_flush_ = false;
  std::vector<std::thread::id> flush_threads_;
  memory::storage_id next_id_ = 1;
  // ---- Streams (under mutex_: free-time fences record from any thread) ----
  struct sim_stream {
    int device = 0;
    bool alive = true;
    // Waits of this stream: (events issued before the wait, the event waited for). Work queued
    // after the wait passes only once that event has.
    std::vector<std::pair<memory::event, memory::event>> waits;
  };
  class fence_impl;
  memory::event record_locked(std::uint64_t uid);
  std::uint64_t uid_locked(memory::stream_id s);
  void progress_locked(std::uint64_t uid) noexcept;
  void run_until_locked(memory::event e) noexcept;
  bool ordered_after_locked(std::uint64_t uid, memory::event e, int depth) const noexcept;
  void pass_locked(memory::event e) noexcept;
  /// runs_after: passes the events recorded at least that long ago.
  void expire_locked() const noexcept;

  mutable std::mutex mutex_;
  memory::event issued_ = 0;
  // Mutable: with runs_after, time passes events in const queries too (under the mutex).
  mutable std::map<memory::event, std::uint64_t> unpassed_;  // event -> stream uid
  // runs_after: the events not yet expired and when they were recorded, oldest first.
  mutable std::deque<std::pair<memory::event, std::chrono::steady_clock::time_point>> recorded_at_;
  std::unordered_map<memory::event, std::uint64_t> of_;  // every event -> stream uid
  mutable std::unordered_map<std::uint64_t, memory::event> passed_on_;
  std::unordered_map<std::uint64_t, sim_stream> streams_;      // by uid
  std::unordered_map<memory::stream_id, std::uint64_t> live_;  // handle -> uid
  std::vector<memory::stream_id> recycled_;                    // destroyed handles, newest last
  std::unordered_map<memory::stream_id, bool> destroyed_;      // destroyed and not reused
  std::uint64_t next_uid_ = 16;
  memory::stream_id next_handle_ = 0x100000;
  std::uint64_t waits_ = 0;
  std::uint64_t queries_ = 0;  // under mutex_
  std::uint64_t joins_ = 0;
  std::uint64_t free_records_ = 0;
  bool fail_record_ = false;
  bool fail_free_record_ = false;
  bool fail_query_ = false;
  bool fail_identify_ = false;
  bool capturing_ = false;
  std::vector<memory::stream_id> return_after_;
};

static_assert(memory::storage_backend<sim_storage>);
static_assert(memory::queued_backend<sim_storage>);

}  // namespace devrt::devices
