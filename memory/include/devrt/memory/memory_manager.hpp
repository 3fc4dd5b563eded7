// The memory manager of one device: the persistent pool, the dynamic pools of the current layout,
// and the storage they take pages from.
//
// Threading: single-threaded. Every member function must be called from the manager's owner
// (a thread, or the device actor's strand). Handles it returns may be copied and dropped from any
// thread; drops reach the manager through its release queue and are processed at the start of
// the next call, so frees cost no scan of the slices.
//
// Errors are returned as `result` values; nothing on the reserve path throws or logs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "devrt/memory/arena_pool.hpp"
#include "devrt/memory/config.hpp"
#include "devrt/memory/exclusive_pool.hpp"
#include "devrt/memory/handle.hpp"
#include "devrt/memory/persistent_pool.hpp"
#include "devrt/memory/pool_context.hpp"
#include "devrt/memory/sliced_pool.hpp"
#include "devrt/memory/snapshot.hpp"
#include "devrt/memory/storage.hpp"
#include "devrt/memory/stream.hpp"
#include "devrt/memory/stream_order.hpp"
#include "devrt/memory/tag.hpp"
#include "devrt/memory/usage.hpp"

namespace devrt::memory {

/// How a manager is set up.
struct manager_options {
  std::string name = "device";
  memory_layout layout = preset::automatic;
  persistent_policy policy = persistent_policy::enabled;
  /// Initial mode; by default `persistent` under the `enforced` policy and `automatic` otherwise.
  std::optional<allocation_mode> mode;
  /// On out-of-memory, `reserve` reclaims once (waits for the streams' fences, a counted wait
  /// under memory pressure, then an explicit cleanup and a wait for memory on its way back: see
  /// `reclaim`) and retries once before it fails. The
  /// runtime's devices do; a bare manager reports the first refusal.
  bool reclaim_on_out_of_memory = false;
  /// The most the device may hold for devrt (bytes; 0: no limit but the device's own), as
  /// cudaMallocAsync's release threshold and PyTorch's per-process memory fraction: a reserve
  /// that would pass it fails with out_of_memory. It is also the budget of the pools' policy
  /// (the device's capacity without one): far from it an arena keeps free memory mapped and maps
  /// in larger units, near it it trims to 1.04 times the peak of live bytes.
  std::uint64_t memory_limit = 0;
};

/// What `configure` did.
struct configure_outcome {
  bool applied = false;
  std::uint64_t live_bytes = 0;        ///< bytes still live in the dynamic pools when kept
  std::uint64_t live_allocations = 0;  ///< allocations still live in the dynamic pools when kept
  /// Kept because memory freed from the dynamic pools is still used by streams' queued work (its
  /// fences have not passed): nothing is live, and the layout can change as soon as they pass.
  bool pending = false;
  std::uint64_t pending_bytes = 0;  ///< bytes of that memory (held slices and tagged free memory)
};

/// One dynamic pool of the current layout.
using dynamic_pool =
    std::variant<std::unique_ptr<sliced_pool>, std::unique_ptr<exclusive_pool>, std::unique_ptr<arena_pool>>;

class memory_manager {
 public:
  /// Builds the pools of `opts.layout` for the storage's device. Throws `devrt::exception` with a
  /// configuration error if the layout is invalid; `create` returns it instead.
  memory_manager(storage store, manager_options opts);
  static result<std::unique_ptr<memory_manager>> create(storage store, manager_options opts);

  memory_manager(const memory_manager&) = delete;
  memory_manager& operator=(const memory_manager&) = delete;
  /// Returns every page to the storage. Handles that outlive the manager stay safe to copy and
  /// drop; they no longer resolve.
  ~memory_manager();

  /// Largest size a reserve accepts on any device: larger sizes are buffer_too_big at once.
  static constexpr std::uint64_t max_reserve_size = std::uint64_t{1} << 62;

  /// Reserves `size` bytes. Routing: the persistent pool when the mode or policy asks for it,
  /// otherwise the first dynamic pool that accepts the size. Errors: buffer_too_big (no pool
  /// accepts), pool_capacity_exceeded (the accepting pool is capped and full; later pools are not
  /// tried), out_of_memory and device_error from the storage.
  ///
  /// `q` is the stream the memory is used on (see stream.hpp): memory freed on it may be handed
  /// out again at once; memory freed on other streams only once their fences have passed. On
  /// devices without queues it is only remembered.
  ///
  /// `tag` (memory/tag.hpp; 0: none): the memory comes from the tag's own arena on devices that map
  /// memory (outside a capture window, whatever the mode), and is counted with the tag. Error
  /// asleep: the tag is asleep on this device.
  result<memory_handle> reserve(std::uint64_t size, stream_id q = streams::device, tag_id tag = 0);
  /// The same, placing the memory straight into `handle` (a fresh identity from
  /// `memory_handle::make()`), as `reserve` then `bind` would, without a second descriptor.
  /// Errors: those of reserve, invalid_argument (empty handle), already_bound (it has memory).
  result<void> reserve_into(std::uint64_t size, const memory_handle& handle, stream_id q = streams::device,
                            tag_id tag = 0);

  /// Marks the memory of `h` as used on stream `q` as well: when it is freed, it is reused (by any
  /// stream) or returned only after the work queued on `q` and on its own stream by then. `q` may
  /// be a stream of another device (a kernel there uses this memory through peer access). Errors:
  /// not_found, invalid_argument (`q` is not a stream the device knows), device_error.
  result<void> record_stream(const memory_binding& b, stream_id q);
  /// The stream is about to be destroyed. Optional: frees are fenced when they happen, so a
  /// stream may be destroyed with work queued once its memory is freed. Retiring fences its last
  /// frees at once and forgets the stream as soon as its memory is back. Errors: device_error.
  result<void> retire_stream(stream_id q);
  /// Who ends a batch (end_batch).
  enum class batch_end {
    /// The device's own thread: queued deallocations go to the device, and the fences in flight
    /// are queried.
    device_thread,
    /// A client thread that served its own message: deallocations stay queued for the device
    /// thread (a later `end_batch` or `flush`), and the fences are queried only every
    /// `poll_in_place_every` such batches (whoever ended them), or at once while any slice is
    /// held for its fences. A query is a driver call (0.15-0.3 us on an H100 or H200 host), and
    /// while the GPU runs behind every malloc would query the same fence. An arena's reserve that
    /// would map queries first in any case (so no memory is mapped for want of a query); other
    /// pools hold their frees, and so are asked about at every batch. Until a query, what passed
    /// stays unavailable to other streams and to the driver: later, never earlier.
    in_place,
  };
  static constexpr std::uint32_t poll_in_place_every = 16;
  /// End of a batch of requests: processes frees, fences the streams freed on, frees what the
  /// device has passed (see batch_end for when it asks), and, on the device thread, pushes queued
  /// deallocations to the device. Never waits for the device.
  result<void> end_batch(batch_end by = batch_end::device_thread);
  /// Deallocations are queued for the device (driver calls a `flush` would make). Asks the
  /// storage only after the pools gave something back since it last had nothing queued.
  [[nodiscard]] bool deallocations_queued() {
    if (!ctx_.returns_queued) return false;
    if (store_.pending_deallocations() != 0) return true;
    ctx_.returns_queued = false;
    return false;
  }
  /// Makes the next `end_batch` fence every stream with unfenced frees (by default a stream is
  /// fenced only every `stream_order::fence_after` frees, or when memory is wanted).
  void want_fences() noexcept { order_.want_fences(); }
  [[nodiscard]] const stream_order& order() const noexcept { return order_; }

  /// Gives the memory of `reserved` to `assigned` (a fresh identity from `memory_handle::make()`);
  /// copies of `reserved` become stale and resolve to not_found. Errors: not_found (reserved is
  /// uninitialized, stale or from another manager), already_bound (assigned has memory).
  /// `reserved` is consumed (left empty) only on success; on failure it still holds its memory.
  result<void> bind(memory_handle&& reserved, const memory_handle& assigned, std::uint64_t cursor = 0);
  /// The same with the caller's handle kept: a copy is bound, so on success `reserved` turns stale
  /// like every other copy, and on failure it still holds the memory.
  result<void> bind(const memory_handle& reserved, const memory_handle& assigned, std::uint64_t cursor = 0) {
    return bind(memory_handle(reserved), assigned, cursor);
  }

  result<std::uint64_t> get_cursor(const memory_binding& b);
  result<std::uint64_t> get_cursor(const memory_handle& h);
  /// The storage view of the allocation: page id, offset, requested size.
  result<storage_handle> get_storage(const memory_binding& b);
  result<storage_handle> get_storage(const memory_handle& h);
  /// The resource of the allocation, optionally trimmed by `offset_start` bytes at the front and
  /// `offset_end` bytes at the back. Error invalid_argument when the trims exceed the size.
  result<resource> get_resource(const memory_binding& b, std::optional<std::uint64_t> offset_start = {},
                                std::optional<std::uint64_t> offset_end = {});
  result<resource> get_resource(const memory_handle& h, std::optional<std::uint64_t> offset_start = {},
                                std::optional<std::uint64_t> offset_end = {});

  /// Periodic (explicit = false) or full (explicit = true) return of unused pages. An explicit
  /// cleanup also flushes queued deallocations, and never waits for the device: memory freed on
  /// streams whose work is still queued goes back as soon as their fences pass (`cleanup_owed`
  /// until then, which `end_batch` completes). Nothing is freed while a capture is open.
  result<void> cleanup(bool explicit_cleanup);
  /// An explicit cleanup left memory behind fences that have not passed yet.
  [[nodiscard]] bool cleanup_owed() const noexcept { return cleanup_owed_; }
  /// Pushes queued deallocations to the device.
  result<void> flush();
  /// Sets the memory limit (manager_options::memory_limit; 0: none). Below what the device holds
  /// now, free memory is given back at once (an explicit cleanup, which never waits); live memory
  /// stays, and reserves fail until enough is freed.
  result<void> set_memory_limit(std::uint64_t bytes);
  [[nodiscard]] std::uint64_t memory_limit() const noexcept { return ctx_.limit; }
  /// After an out-of-memory error, before one retry (counted as a reclaim): waits for the streams'
  /// fences (memory pressure: a counted wait), then an explicit cleanup; where memory is still on
  /// its way back behind the device's own stream (`bytes_returning`, the cleanup's unmaps
  /// included), waits for that stream and lets the memory go, so that it no longer counts against
  /// the limit or the device (also counted in stream_waits). Errors: those of the storage's
  /// synchronize and flush.
  result<void> reclaim();

  /// Replaces the dynamic pools by those of `layout` if none of their slices is live and no memory
  /// freed from them is still used by queued work (after an explicit cleanup, which does not
  /// wait): otherwise the outcome says what is live or pending and nothing changes. The persistent
  /// pool, the mode and the policy are kept. A failed call changes nothing. Errors: any layout
  /// validation error, capture_active, device_error (queued deallocations could not be flushed;
  /// the old layout stays).
  result<configure_outcome> configure(const memory_layout& layout);

  /// Puts `tag` to sleep (memory/tag.hpp) and returns the event the device passes once it is
  /// done; then `settle_tag` completes it. In order: the device's own stream waits for the work
  /// queued on every stream the device knows (no wait here), the live allocations are copied into
  /// host memory from the storage when `keep_contents`, and every mapping of the tag's arena is
  /// unmapped (given back behind that work). A tag unknown here or asleep: event 0, nothing done.
  /// Errors: unsupported (the device cannot map memory), capture_active, out_of_memory (no host
  /// memory for the copy; nothing changed), device_error.
  result<event> sleep(tag_id tag, bool keep_contents);
  /// Wakes `tag`: maps every asleep mapping again with its bounds (reclaiming once on
  /// out-of-memory, as a reserve does), then queues the copies of the kept contents back; returns
  /// the event the device passes once they are there (then `settle_tag` frees the host copy). An
  /// awake tag: event 0. Errors: out_of_memory (explained like a reserve's; nothing changed: still
  /// asleep, the host copy kept), capture_active, device_error.
  result<event> wake(tag_id tag);
  /// After the event of a sleep or wake passed: gives the device what the sleep unmapped (a
  /// flush), or frees the host copy a wake restored.
  result<void> settle_tag(tag_id tag);
  /// What every tag used on this device holds.
  std::vector<tag_usage> tags();
  /// Frees the pinned host blocks kept for later sleeps' copies (statistics: bytes_host_cached)
  /// and returns how many bytes went back. Blocks holding a sleeping tag's contents stay. On CUDA
  /// cudaFreeHost may wait for the device's queued work.
  std::uint64_t release_host_copies();

  /// Opens a capture window: every reserve is served by the persistent pool, and the slices the
  /// window reserves or binds are recorded. A second begin keeps the first window.
  void capture_begin();
  /// Closes the window and returns handles pinning exactly the persistent slices it touched.
  /// Error no_capture without an open window.
  result<std::vector<memory_handle>> capture_end();
  [[nodiscard]] bool capturing() const noexcept { return capture_.has_value(); }

  /// Sets the allocation mode (ignored under the disabled and enforced policies; deferred to the
  /// end of an open capture window).
  void mode(allocation_mode m);
  [[nodiscard]] allocation_mode current_mode() const noexcept { return mode_; }
  [[nodiscard]] persistent_policy policy() const noexcept { return opts_.policy; }

  /// Processes the frees reported since the last call. Every other member calls it first.
  void process_releases();

  memory_usage usage();
  /// Statistics, after processing the frees reported so far.
  const memory_statistics& statistics();
  /// Sets the peaks of reserved and in-use bytes to their current values, after processing the
  /// frees reported so far (as PyTorch's reset_peak_memory_stats). Counters are kept.
  void reset_peaks();
  /// Readable report: the persistent pool, each dynamic pool with its pages, and a summary.
  std::string report();
  /// Starts (or stops) recording the trace of memory events that snapshots carry: at most
  /// `max_entries`, the oldest dropped first. Starting anew clears the trace.
  void record_history(bool on, std::size_t max_entries = default_history_entries);
  static constexpr std::size_t default_history_entries = 100'000;
  [[nodiscard]] bool recording_history() const noexcept { return history_.enabled(); }
  /// Every pool's segments, block by block, the trace recorded so far and the statistics, all at
  /// this point (snapshot.hpp). A walk over the slices and granules: not for the reserve path.
  memory_snapshot snapshot();
  /// Expensive consistency check of every pool and counter. Empty when consistent; otherwise the
  /// first violation found.
  std::string check_invariants();

  [[nodiscard]] const std::string& name() const noexcept { return opts_.name; }
  [[nodiscard]] device_properties properties() const { return props_; }
  [[nodiscard]] const std::vector<pool_options>& layout() const noexcept { return layout_; }
  [[nodiscard]] std::size_t dynamic_pool_count() const noexcept { return pools_.size(); }
  [[nodiscard]] storage& backing_storage() noexcept { return store_; }
  [[nodiscard]] std::uint64_t reserve_count() const noexcept { return reserve_count_; }

 private:
  struct capture_state {
    allocation_mode restore_mode;
  };

  memory_manager(storage store, manager_options opts, std::vector<pool_options> layout);
  void build_pools(const std::vector<pool_options>& layout);
  void release_pools();
  result<slice_view> find(const detail::descriptor* d) const;
  result<resource> resolve(const detail::descriptor* d, std::optional<std::uint64_t> offset_start,
                           std::optional<std::uint64_t> offset_end);
  result<detail::descriptor*> reserve_raw(std::uint64_t size, stream_id q, tag_id tag);
  result<detail::descriptor*> reserve_attempt(std::uint64_t size, stream_id q, tag_id tag);
  result<detail::descriptor*> reserve_persistent(std::uint64_t size);
  result<detail::descriptor*> reserve_on(std::uint64_t size, tag_id tag);

  // Pinned host memory from the storage (`alloc_host`), for a sleeping tag's kept contents.
  struct host_block {
    void* ptr = nullptr;
    std::uint64_t bytes = 0;
  };
  // One tag's memory on this device (memory/tag.hpp).
  struct saved_slice {
    storage_handle view;  // the live slice at sleep: range, offset, requested size
    std::uint64_t at;     // its bytes' offset in the host copy
  };
  struct tag_space {
    tag_id id = 0;
    dynamic_pool pool;  // the tag's arena; an empty pointer where the device cannot map memory
    tag_state state = tag_state::awake;
    // Asleep with contents kept, and after a wake until settle_tag: the host copy and what it holds
    // (in offset order). Invariants: `offload.ptr` is null exactly when `saved` is empty, and
    // `offload_bytes` (the kept contents) is at most `offload.bytes` (the pinned block).
    host_block offload;
    std::uint64_t offload_bytes = 0;
    std::vector<saved_slice> saved;
    bool restoring = false;  // a wake queued the copies back; settle_tag returns the host copy to host_cache_
    std::uint64_t bytes_in_use = 0;
    std::uint64_t allocations = 0;
    // A reserve with the tag succeeded here once. Before that the tag counts as never used (a
    // failed reserve makes the space but changes nothing): sleep does nothing.
    bool used = false;
    std::uint64_t sleeps = 0;
    std::uint64_t wakes = 0;
    [[nodiscard]] arena_pool* arena() const noexcept {
      const auto* a = std::get_if<std::unique_ptr<arena_pool>>(&pool);
      return a != nullptr ? a->get() : nullptr;
    }
  };
  /// The tag's space, made on its first use here.
  tag_space& space_of(tag_id tag);
  [[nodiscard]] tag_space* find_space(tag_id tag) noexcept {
    return tag != 0 && tag <= tags_.size() ? tags_[tag - 1].get() : nullptr;
  }
  /// The pool at a location's index: a layout pool, or a tag's arena.
  dynamic_pool& pool_at(std::uint16_t index) {
    return index >= location::first_tag_pool ? tags_[index - location::first_tag_pool]->pool : pools_[index];
  }
  [[nodiscard]] bool has_pool(std::uint16_t index) const noexcept {
    if (index < location::first_tag_pool) return index < pools_.size();
    const std::size_t t = index - location::first_tag_pool;
    return t < tags_.size() && tags_[t] != nullptr && tags_[t]->arena() != nullptr;
  }
  /// Calls `f(pool)` for every pool: the layout's, then the tags' arenas.
  template <class F>
  void for_each_pool(F&& f);
  template <class F>
  void for_each_pool(F&& f) const;
  void release_tag_spaces();
  /// A pinned block of at least `bytes` for a sleep's copy: the best fit among the cached blocks
  /// (at most twice the size), else a new one from the storage; when the storage refuses, the
  /// cached blocks are freed and it is asked once more. Error out_of_memory.
  result<host_block> take_host_block(std::uint64_t bytes);
  /// Keeps a block whose copies are done for the next sleep.
  void give_host_block(host_block b);
  void release_one(detail::descriptor* d);
  /// The trace's address of a live allocation (snapshot_address of its slice).
  std::uint64_t trace_address(const detail::descriptor* d);
  /// Adds to an out_of_memory error what explains it: the request, the device's free memory,
  /// devrt's own figures, the largest live allocations and, when it is the cause, fragmentation.
  void explain_out_of_memory(error& e, std::uint64_t size, stream_id q);
  /// Gives a slice back to its pool (the last step of a free).
  void release_to_pool(detail::descriptor* d, stream_id tag);
  /// Above the memory limit (set below what the device held then), memory freed goes back to the
  /// device at once rather than serve later reserves, so that what devrt holds never passes the
  /// limit again; not during a capture, whose memory stays as the graph saw it.
  [[nodiscard]] bool give_back_over_limit() const noexcept {
    return ctx_.limit != 0 && stats_.bytes_reserved > ctx_.limit && !capture_;
  }
  /// Frees what the fences that passed allow: held slices, and tagged arena slices; forgets the
  /// streams that are idle; and completes an owed cleanup (unless `complete_owed` is false: a
  /// pool is in the middle of a reserve).
  void harvest(bool complete_owed = true);
  /// The pools' reuse_streams (pool_context.hpp): before a pool maps memory, fences the streams
  /// with unfenced frees, polls the fences in flight and harvests what passed. Never waits.
  bool reuse_fenced();
  /// After a reserve whose pool polled the fences: what is in use and what waits for fences is
  /// all busy now (memory_statistics::peak_bytes_busy).
  void note_busy() noexcept;
  /// Publishes a new handle's address and stream (its registration with the reference the reserve
  /// took for it).
  void publish(detail::descriptor* d, std::uint64_t size, stream_id q, stream_state* reg, tag_id tag);
  /// The descriptor's memory goes back to its pool: its streams lose a reference.
  void release_streams(detail::descriptor* d);
  /// Bytes freed from the dynamic pools still waiting for fences.
  std::uint64_t pending_dynamic_bytes() const noexcept;
  memory_usage dynamic_usage() const noexcept;
  std::vector<pool_config> layout_to_configs() const;

  storage store_;
  manager_options opts_;
  device_properties props_;
  std::vector<pool_options> layout_;
  memory_statistics stats_;
  release_queue queue_;
  stream_order order_;
  pool_context ctx_;
  persistent_pool persistent_;
  std::vector<dynamic_pool> pools_;
  arena_pool* only_arena_ = nullptr;  // the pool when the layout is a single arena (reserve's fast path)
  allocation_mode mode_ = allocation_mode::automatic;
  std::optional<capture_state> capture_;
  std::uint64_t reserve_count_ = 0;
  bool cleanup_owed_ = false;
  // Device synchronizations of `reclaim` for memory on its way back (part of stream_waits).
  std::uint64_t returning_waits_ = 0;
  // Set by reuse_fenced, cleared where each reserve starts: this reserve polled the fences.
  bool busy_polled_ = false;
  // The highest in use + busy of those samples (statistics() reports it with the peak in use).
  std::uint64_t busy_peak_ = 0;
  // Batches ended in place since the fences were last queried (see batch_end::in_place).
  std::uint32_t unpolled_batches_ = 0;
  memory_history history_;
  std::vector<std::unique_ptr<tag_space>> tags_;  // by tag number - 1; null for tags not used here
  // Pinned blocks no tag holds, kept because pinning costs far more than the copy into them (about
  // 2 GB/s against 55 GB/s on an H200 host). A later sleep takes one; they go back to the storage
  // when a pinned allocation is refused, on release_host_copies() and when the manager ends.
  // Invariant: stats_.bytes_host_cached is the sum of their sizes.
  std::vector<host_block> host_cache_;
};

}  // namespace devrt::memory
