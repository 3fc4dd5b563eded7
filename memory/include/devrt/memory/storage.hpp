// The storage contract: what a device backend (host, sim, cuda) provides to the pools.
//
// A backend hands out whole pages (`alloc`), takes them back through a queue (`dealloc` only
// records the id; `flush` returns queued pages to the driver), and resolves a view of a page to a
// resource (`get`). Backends satisfy the `storage_backend` concept; the memory manager holds them
// behind `storage`, a type-erased wrapper, so the core is compiled once for every backend.
//
// Threading: a storage object belongs to the thread or strand that owns its memory manager.
#pragma once

#include <concepts>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "devrt/memory/error.hpp"
#include "devrt/memory/stream.hpp"

namespace devrt::memory {

/// Identity of one page allocated by a storage backend. 0 is never a valid id.
using storage_id = std::uint64_t;

/// A view `[offset, offset + size)` of the page `id`.
struct storage_handle {
  storage_id id = 0;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;

  /// The view with its start moved forward by `n` bytes (`n <= size`).
  [[nodiscard]] constexpr storage_handle offset_start(std::uint64_t n) const noexcept {
    return {id, offset + n, size - n};
  }
  /// The view with `n` bytes trimmed off its end (`n <= size`).
  [[nodiscard]] constexpr storage_handle offset_end(std::uint64_t n) const noexcept { return {id, offset, size - n}; }
  friend constexpr bool operator==(const storage_handle&, const storage_handle&) = default;
};

/// What a resolved view gives to the code that uses the memory.
struct resource {
  void* ptr = nullptr;     ///< address of the first byte (nullptr on the sim device)
  std::uint64_t size = 0;  ///< bytes in the view
  storage_handle handle;   ///< the view itself
};

/// Device work recorded between `storage::begin_capture` and `storage::end_capture` (a CUDA
/// graph, on CUDA devices), replayable on the device's stream.
class recorded_work {
 public:
  virtual ~recorded_work() = default;
  /// Enqueues one replay on the device's queue.
  virtual result<void> launch() = 0;
  /// Waits until every replay enqueued so far has finished.
  virtual result<void> wait() = 0;
};

/// Properties of a device that the pool layouts are computed from.
struct device_properties {
  std::uint64_t max_page_size = 0;  ///< largest single page the layouts may ask for
  std::uint64_t alignment = 1;      ///< every slice offset and size is a multiple of this
  std::uint64_t capacity = 0;       ///< bytes of memory on the device (0: unknown)
  /// Unit in which the device maps memory into a reserved address range (0: it cannot; see
  /// `mapping_backend`).
  std::uint64_t map_granularity = 0;
};

/// The contract of a storage backend.
template <class S>
concept storage_backend = requires(S& s, const S& cs, std::uint64_t n, storage_id id, const storage_handle& h) {
  { cs.alignment() } -> std::convertible_to<std::uint64_t>;
  { cs.properties() } -> std::same_as<device_properties>;
  { s.alloc(n) } -> std::same_as<result<storage_handle>>;
  { s.dealloc(id) } -> std::same_as<void>;
  { s.flush() } -> std::same_as<result<void>>;
  { s.get(h) } -> std::same_as<result<resource>>;
  { s.write(h, static_cast<const void*>(nullptr)) } -> std::same_as<result<void>>;
  { s.read(h, static_cast<void*>(nullptr)) } -> std::same_as<result<void>>;
  { cs.pending_deallocations() } -> std::convertible_to<std::size_t>;
  { cs.name() } -> std::convertible_to<std::string>;
};

/// An event recorded on a stream (a pooled CUDA event), handed out by a backend with streams: it
/// has *passed* once the device has done every piece of work queued on the stream before it. 0
/// names an event that has passed already (devices without streams hand out nothing else).
using event = std::uint64_t;

/// What the device says of a native stream: who it is and on which device it runs.
struct stream_identity {
  /// The device's id of the stream (cudaStreamGetId): unique among the streams of the process for
  /// as long as the process runs, so a handle the driver gives to a new stream after destroying
  /// an old one has another id.
  std::uint64_t uid = 0;
  /// The index of the device the stream belongs to (CUDA's numbering).
  int device = 0;
  /// Whether that is another device than the storage's: its work may use the memory (peer
  /// access), but the memory cannot be reserved for it.
  bool foreign = false;
};

/// Free-time fences of one native stream. Memory freed on a stream a user created may be reused
/// by other streams only after the work queued on that stream before the free: so the point the
/// stream has reached is recorded at the free itself, by the thread that frees, while the stream
/// is known to exist (as cudaFreeAsync and PyTorch's record_stream do). Every record moves one
/// event forward; the owner takes it when it wants a fence, and a fresh event takes its place.
///
/// Threading: `record` from any thread, concurrently; `take` and destruction on the owner's
/// thread only.
class free_fence {
 public:
  virtual ~free_fence() = default;
  /// A free of memory used on the stream: the event now stands behind the work queued on the
  /// stream so far. Never blocks; a failure (the stream was destroyed) is kept for `take`.
  virtual void record() noexcept = 0;
  /// The event of the newest record since the last take, as an event of the storage's (query it
  /// with `storage::query_event`); 0 when nothing was recorded since. Error: device_error when a
  /// record failed since the last take (the frees it was for are not fenced).
  virtual result<event> take() = 0;
};

/// Optional capabilities of a backend whose device has streams (CUDA). Backends without them get
/// the defaults of `storage`: no stream, nothing to capture, every event passed.
///
/// - `record_event(s)`: an event behind the work queued on `s` so far (a pooled event; never
///   blocks). Only for streams that live as long as the device (its own, the legacy and the
///   per-thread default stream) or that the caller knows alive.
/// - `query_event(e)`: whether the device has passed `e`, without blocking; once true, the event's
///   completion work is done (a staged read copied out) and the event is gone.
/// - `wait_event(e)`: blocks until `e` has passed (memory pressure, teardown).
/// - `stream_wait_event(s, e)`: later work on `s` waits for `e` (cudaStreamWaitEvent); never
///   blocks the host. The event stays the caller's.
/// - `release_event(e)`: the caller no longer needs `e` (whether it passed or not).
/// - `identify(s)`: who a native stream is (see stream_identity). Errors: invalid_argument (not a
///   stream, or destroyed), device_error.
/// - `make_free_fence(s, id)`: the free-time fences of native stream `s` (see free_fence); for a
///   stream of another device, with events of that device.
/// - `synchronize_device()`: blocks until every stream of the device has done the work queued so
///   far, streams already destroyed included (memory pressure when a fence could not be recorded,
///   teardown).
/// - `return_after(s)`: memory given back to the driver (unmaps, page frees) waits for the work
///   queued on `s` too, besides the device's own stream (the legacy stream, once frees on it are
///   reused without fences).
/// - `write_on(h, src, s)`: copies `h.size` bytes from `src` into the view, ordered on `s`; the
///   caller may reuse `src` when it returns (the bytes are staged in pinned host memory).
/// - `read_async(h, dst, s)`: copies the view into `dst` in order on `s`; `dst` holds the bytes
///   once the returned event has passed (`dst` must stay valid until then).
template <class S>
concept queued_backend = requires(S& s, stream_id q, event t, const storage_handle& h, const stream_identity& id) {
  { s.native_stream() } -> std::same_as<void*>;
  { s.begin_capture() } -> std::same_as<result<void>>;
  { s.end_capture() } -> std::same_as<result<std::shared_ptr<recorded_work>>>;
  { s.synchronize() } -> std::same_as<result<void>>;
  { s.record_event(q) } -> std::same_as<result<event>>;
  { s.query_event(t) } -> std::same_as<result<bool>>;
  { s.wait_event(t) } -> std::same_as<result<void>>;
  { s.stream_wait_event(q, t) } -> std::same_as<result<void>>;
  { s.release_event(t) } -> std::same_as<void>;
  { s.identify(q) } -> std::same_as<result<stream_identity>>;
  { s.make_free_fence(q, id) } -> std::same_as<result<std::unique_ptr<free_fence>>>;
  { s.synchronize_device() } -> std::same_as<result<void>>;
  { s.return_after(q) } -> std::same_as<void>;
  { s.write_on(h, static_cast<const void*>(nullptr), q) } -> std::same_as<result<void>>;
  { s.read_async(h, static_cast<void*>(nullptr), q) } -> std::same_as<result<event>>;
};

/// Optional capability of a backend that separates addresses from memory (CUDA's virtual memory
/// management, mmap on the host): a range of addresses is reserved once, and memory is mapped into
/// it and unmapped from it in units of `properties().map_granularity`.
///
/// - `reserve_range(size, unit)`: `size` bytes of addresses with no memory behind them, mapped and
///   unmapped in whole units of `unit` bytes (a multiple of the granularity; `size` a multiple of
///   it); the handle's id names the range in the other calls and in views given to `get`.
/// - `map(range, offset, size)`: puts memory behind `[offset, offset + size)` (whole units, not
///   mapped yet). Errors: out_of_memory, device_error.
/// - `unmap(range, offset, size)`: gives that memory back, after the work already queued on the
///   device (on CUDA, at a flush once the stream reached it). The same bytes may be mapped again
///   at once.
/// - `release_range(range)`: unmaps what is left and frees the addresses, after queued work.
template <class S>
concept mapping_backend = requires(S& s, std::uint64_t n, storage_id id) {
  { s.reserve_range(n, n) } -> std::same_as<result<storage_handle>>;
  { s.map(id, n, n) } -> std::same_as<result<void>>;
  { s.unmap(id, n, n) } -> std::same_as<void>;
  { s.release_range(id) } -> std::same_as<void>;
};

/// Optional, with mapping: `unmap_idle(range, offset, size)` gives back memory that the caller
/// knows no queued work can reach (every stream that used it has passed a fence since) at once,
/// not behind the device's queued work: it never counts as memory on its way back beside a new
/// mapping. Backends without it: `unmap`.
template <class S>
concept idle_unmap_backend = mapping_backend<S> && requires(S& s, std::uint64_t n, storage_id id) {
  { s.unmap_idle(id, n, n) } -> std::same_as<void>;
};

/// Type-erased storage used by the memory manager. Owns the backend.
class storage {
 public:
  template <storage_backend S>
  explicit storage(std::unique_ptr<S> backend)
      : impl_(std::make_unique<model<S>>(std::move(backend))), ordered_(impl_->ordered()) {}

  template <storage_backend S, class... Args>
  static storage make(Args&&... args) {
    return storage(std::make_unique<S>(std::forward<Args>(args)...));
  }

  [[nodiscard]] std::uint64_t alignment() const { return impl_->alignment(); }
  [[nodiscard]] device_properties properties() const { return impl_->properties(); }
  result<storage_handle> alloc(std::uint64_t size) { return impl_->alloc(size); }
  void dealloc(storage_id id) { impl_->dealloc(id); }
  result<void> flush() { return impl_->flush(); }
  /// Lets the unmaps requested so far reach the device before the maps that follow (a pool that
  /// unmaps free memory to map memory elsewhere). A backend may keep physical memory the device
  /// takes back at once for those maps until the next flush (counted as returning); elsewhere
  /// the same as `flush`.
  result<void> settle() { return impl_->settle(); }
  [[nodiscard]] result<resource> get(const storage_handle& h) { return impl_->get(h); }
  /// Copies `h.size` bytes from `src` into the view (stream-ordered on devices with streams).
  result<void> write(const storage_handle& h, const void* src) { return impl_->write(h, src); }
  /// Copies the view's bytes into `dst`; complete when it returns.
  result<void> read(const storage_handle& h, void* dst) { return impl_->read(h, dst); }
  [[nodiscard]] std::size_t pending_deallocations() const { return impl_->pending(); }
  /// Bytes given back to the device that it has not taken back yet (queued deallocations, unmaps
  /// waiting behind queued work): still held, so still counted as reserved. 0 where a backend does
  /// not say.
  [[nodiscard]] std::uint64_t returning_bytes() const { return impl_->returning(); }
  /// The part of returning_bytes that a device which unmaps in order keeps from completed unmaps
  /// for the maps that follow: a map takes a kept allocation of its size or gives the others back
  /// before it takes new memory, so a map never holds them beside its own. 0 where a backend does
  /// not say.
  [[nodiscard]] std::uint64_t kept_bytes() const { return impl_->kept(); }
  /// Mappings whose unmap the device has not done yet: their addresses are still mapped, so a
  /// pool may map them again only with the same bounds. Where a backend does not say, any memory
  /// still returning counts as one.
  [[nodiscard]] std::size_t unmaps_in_flight() const { return impl_->unmaps_in_flight(); }
  [[nodiscard]] std::string name() const { return impl_->name(); }
  /// The device's free memory, as its driver counts it (cudaMemGetInfo on CUDA); for the
  /// out-of-memory report, not the reserve path. Absent where a backend does not say.
  [[nodiscard]] std::optional<std::uint64_t> device_free() { return impl_->device_free(); }

  /// The device's calls are about to run on the calling thread (the device thread as it starts, or
  /// a client serving its request in place): sets what they need on this thread (on CUDA the
  /// current device, and a stream-capture mode that permits them while a client captures a stream
  /// in global mode) and returns what `return_thread` puts back. Optional for backends (`borrow_thread() -> uint64_t`,
  /// `return_thread(uint64_t)`).
  [[nodiscard]] std::uint64_t borrow_thread() { return impl_->borrow_thread(); }
  void return_thread(std::uint64_t saved) { impl_->return_thread(saved); }

  /// The device's own stream (a cudaStream_t on CUDA devices); nullptr when it has none.
  [[nodiscard]] void* native_stream() { return impl_->native_stream(); }
  /// Starts recording the work enqueued on the device's queue (no-op without a queue).
  result<void> begin_capture() { return impl_->begin_capture(); }
  /// Stops recording; nullptr when the device records nothing.
  result<std::shared_ptr<recorded_work>> end_capture() { return impl_->end_capture(); }
  /// Waits for the device's own stream to drain.
  result<void> synchronize() { return impl_->synchronize(); }

  /// Whether the device has work queues (see `queued_backend`); without them every event has
  /// passed when it is handed out and streams mean nothing.
  [[nodiscard]] bool ordered() const noexcept { return ordered_; }
  result<event> record_event(stream_id s) { return impl_->record_event(s); }
  result<bool> query_event(event e) { return e == 0 ? result<bool>(true) : impl_->query_event(e); }
  result<void> wait_event(event e) { return e == 0 ? result<void>() : impl_->wait_event(e); }
  result<void> stream_wait_event(stream_id s, event e) {
    return e == 0 ? result<void>() : impl_->stream_wait_event(s, e);
  }
  void release_event(event e) {
    if (e != 0) impl_->release_event(e);
  }
  result<stream_identity> identify(stream_id s) { return impl_->identify(s); }
  result<std::unique_ptr<free_fence>> make_free_fence(stream_id s, const stream_identity& id) {
    return impl_->make_free_fence(s, id);
  }
  result<void> synchronize_device() { return impl_->synchronize_device(); }
  void return_after(stream_id s) { impl_->return_after(s); }
  /// `write`, ordered on `q` (the same as `write` on devices without queues).
  result<void> write_on(const storage_handle& h, const void* src, stream_id q) { return impl_->write_on(h, src, q); }
  /// `read`, ordered on `q`, without waiting: `dst` holds the bytes once the event has passed.
  result<event> read_async(const storage_handle& h, void* dst, stream_id q) { return impl_->read_async(h, dst, q); }

  /// Host memory for the contents a sleeping tag keeps (memory/tag.hpp): pinned where the device
  /// copies faster from it (cudaHostAlloc on CUDA), plain memory elsewhere. Optional for backends
  /// (`alloc_host(size) -> result<void*>`, `free_host(ptr, size)`). Error out_of_memory.
  result<void*> alloc_host(std::uint64_t size) { return impl_->alloc_host(size); }
  /// Frees what alloc_host gave, once no queued copy uses it.
  void free_host(void* p, std::uint64_t size) { impl_->free_host(p, size); }
  /// Copies the view's bytes into host memory `dst` in order on the device's own stream, without
  /// waiting (done once an event recorded after it has passed); at once on devices without queues.
  /// Optional for backends (`copy_to_host`, `copy_from_host`); the default is `read` and `write`.
  result<void> copy_to_host(const storage_handle& h, void* dst) { return impl_->copy_to_host(h, dst); }
  /// Copies `h.size` bytes of host memory `src` into the view, in order on the device's own stream.
  result<void> copy_from_host(const storage_handle& h, const void* src) { return impl_->copy_from_host(h, src); }

  /// Address ranges and mapping (see `mapping_backend`). Backends without the capability report
  /// `map_granularity` 0, and these calls fail with `unsupported`.
  result<storage_handle> reserve_range(std::uint64_t size, std::uint64_t unit) {
    return impl_->reserve_range(size, unit);
  }
  result<void> map(storage_id range, std::uint64_t offset, std::uint64_t size) {
    return impl_->map(range, offset, size);
  }
  void unmap(storage_id range, std::uint64_t offset, std::uint64_t size) { impl_->unmap(range, offset, size); }
  void unmap_idle(storage_id range, std::uint64_t offset, std::uint64_t size) {
    impl_->unmap_idle(range, offset, size);
  }
  void release_range(storage_id range) { impl_->release_range(range); }

  /// The backend, for callers that know its type (tests, device-specific code).
  template <storage_backend S>
  [[nodiscard]] S* backend() noexcept {
    auto* m = dynamic_cast<model<S>*>(impl_.get());
    return m != nullptr ? m->backend.get() : nullptr;
  }

 private:
  struct concept_t {
    virtual ~concept_t() = default;
    [[nodiscard]] virtual std::uint64_t alignment() const = 0;
    [[nodiscard]] virtual device_properties properties() const = 0;
    virtual result<storage_handle> alloc(std::uint64_t size) = 0;
    virtual void dealloc(storage_id id) = 0;
    virtual result<void> flush() = 0;
    virtual result<void> settle() = 0;
    virtual result<resource> get(const storage_handle& h) = 0;
    virtual result<void> write(const storage_handle& h, const void* src) = 0;
    virtual result<void> read(const storage_handle& h, void* dst) = 0;
    [[nodiscard]] virtual std::size_t pending() const = 0;
    [[nodiscard]] virtual std::uint64_t returning() const = 0;
    [[nodiscard]] virtual std::uint64_t kept() const = 0;
    [[nodiscard]] virtual std::size_t unmaps_in_flight() const = 0;
    [[nodiscard]] virtual std::string name() const = 0;
    [[nodiscard]] virtual std::optional<std::uint64_t> device_free() = 0;
    virtual std::uint64_t borrow_thread() = 0;
    virtual void return_thread(std::uint64_t saved) = 0;
    virtual void* native_stream() = 0;
    virtual result<void> begin_capture() = 0;
    virtual result<std::shared_ptr<recorded_work>> end_capture() = 0;
    virtual result<void> synchronize() = 0;
    [[nodiscard]] virtual bool ordered() const = 0;
    virtual result<event> record_event(stream_id s) = 0;
    virtual result<bool> query_event(event e) = 0;
    virtual result<void> wait_event(event e) = 0;
    virtual result<void> stream_wait_event(stream_id s, event e) = 0;
    virtual void release_event(event e) = 0;
    virtual result<stream_identity> identify(stream_id s) = 0;
    virtual result<std::unique_ptr<free_fence>> make_free_fence(stream_id s, const stream_identity& id) = 0;
    virtual result<void> synchronize_device() = 0;
    virtual void return_after(stream_id s) = 0;
    virtual result<void> write_on(const storage_handle& h, const void* src, stream_id q) = 0;
    virtual result<event> read_async(const storage_handle& h, void* dst, stream_id q) = 0;
    virtual result<void*> alloc_host(std::uint64_t size) = 0;
    virtual void free_host(void* p, std::uint64_t size) = 0;
    virtual result<void> copy_to_host(const storage_handle& h, void* dst) = 0;
    virtual result<void> copy_from_host(const storage_handle& h, const void* src) = 0;
    virtual result<storage_handle> reserve_range(std::uint64_t size, std::uint64_t unit) = 0;
    virtual result<void> map(storage_id range, std::uint64_t offset, std::uint64_t size) = 0;
    virtual void unmap(storage_id range, std::uint64_t offset, std::uint64_t size) = 0;
    virtual void unmap_idle(storage_id range, std::uint64_t offset, std::uint64_t size) = 0;
    virtual void release_range(storage_id range) = 0;
  };
  template <class S>
  struct model final : concept_t {
    explicit model(std::unique_ptr<S> b) : backend(std::move(b)) {}
    [[nodiscard]] std::uint64_t alignment() const override { return backend->alignment(); }
    [[nodiscard]] device_properties properties() const override { return backend->properties(); }
    result<storage_handle> alloc(std::uint64_t size) override { return backend->alloc(size); }
    void dealloc(storage_id id) override { backend->dealloc(id); }
    result<void> flush() override { return backend->flush(); }
    result<void> settle() override {
      if constexpr (requires { backend->settle(); }) {
        return backend->settle();
      } else {
        return backend->flush();
      }
    }
    result<resource> get(const storage_handle& h) override { return backend->get(h); }
    result<void> write(const storage_handle& h, const void* src) override { return backend->write(h, src); }
    result<void> read(const storage_handle& h, void* dst) override { return backend->read(h, dst); }
    [[nodiscard]] std::size_t pending() const override { return backend->pending_deallocations(); }
    [[nodiscard]] std::uint64_t returning() const override {
      if constexpr (requires { backend->returning_bytes(); }) {
        return backend->returning_bytes();
      } else {
        return 0;
      }
    }
    [[nodiscard]] std::uint64_t kept() const override {
      if constexpr (requires { backend->kept_bytes(); }) {
        return backend->kept_bytes();
      } else {
        return 0;
      }
    }
    [[nodiscard]] std::optional<std::uint64_t> device_free() override {
      if constexpr (requires { backend->device_free(); }) {
        return backend->device_free();
      } else {
        return std::nullopt;
      }
    }
    [[nodiscard]] std::size_t unmaps_in_flight() const override {
      if constexpr (requires { backend->unmaps_in_flight(); }) {
        return backend->unmaps_in_flight();
      } else {
        return returning() != 0 ? 1 : 0;
      }
    }
    [[nodiscard]] std::string name() const override { return backend->name(); }
    std::uint64_t borrow_thread() override {
      if constexpr (requires { backend->borrow_thread(); }) {
        return backend->borrow_thread();
      } else {
        return 0;
      }
    }
    void return_thread(std::uint64_t saved) override {
      if constexpr (requires { backend->return_thread(saved); }) backend->return_thread(saved);
    }
    void* native_stream() override {
      if constexpr (queued_backend<S>) return backend->native_stream();
      return nullptr;
    }
    result<void> begin_capture() override {
      if constexpr (queued_backend<S>) return backend->begin_capture();
      return {};
    }
    result<std::shared_ptr<recorded_work>> end_capture() override {
      if constexpr (queued_backend<S>) return backend->end_capture();
      return std::shared_ptr<recorded_work>();
    }
    result<void> synchronize() override {
      if constexpr (queued_backend<S>) return backend->synchronize();
      return {};
    }
    [[nodiscard]] bool ordered() const override {
      if constexpr (!queued_backend<S>) {
        return false;
      } else if constexpr (requires { backend->ordered(); }) {
        return backend->ordered();  // a backend that has queues only in some configurations (sim)
      } else {
        return true;
      }
    }
    result<event> record_event(stream_id s) override {
      if constexpr (queued_backend<S>) return backend->record_event(s);
      return event{0};
    }
    result<bool> query_event(event e) override {
      if constexpr (queued_backend<S>) return backend->query_event(e);
      return true;
    }
    result<void> wait_event(event e) override {
      if constexpr (queued_backend<S>) return backend->wait_event(e);
      return {};
    }
    result<void> stream_wait_event(stream_id s, event e) override {
      if constexpr (queued_backend<S>) return backend->stream_wait_event(s, e);
      return {};
    }
    void release_event(event e) override {
      if constexpr (queued_backend<S>) backend->release_event(e);
    }
    result<stream_identity> identify(stream_id s) override {
      if constexpr (queued_backend<S>) return backend->identify(s);
      return stream_identity{s, 0};
    }
    result<std::unique_ptr<free_fence>> make_free_fence(stream_id s, const stream_identity& id) override {
      if constexpr (queued_backend<S>) return backend->make_free_fence(s, id);
      return std::unique_ptr<free_fence>();
    }
    result<void> synchronize_device() override {
      if constexpr (queued_backend<S>) return backend->synchronize_device();
      return {};
    }
    void return_after(stream_id s) override {
      if constexpr (queued_backend<S>) backend->return_after(s);
    }
    result<void> write_on(const storage_handle& h, const void* src, stream_id q) override {
      if constexpr (queued_backend<S>) return backend->write_on(h, src, q);
      return backend->write(h, src);
    }
    result<event> read_async(const storage_handle& h, void* dst, stream_id q) override {
      if constexpr (queued_backend<S>) {
        return backend->read_async(h, dst, q);
      } else {
        if (auto r = backend->read(h, dst); !r) return std::move(r).err();
        return event{0};
      }
    }
    result<void*> alloc_host(std::uint64_t size) override {
      if constexpr (requires { backend->alloc_host(size); }) {
        return backend->alloc_host(size);
      } else {
        void* p = ::operator new (static_cast<std::size_t>(size == 0 ? 1 : size), std::align_val_t{64}, std::nothrow);
        if (p == nullptr) {
          error e = error::make(errc::out_of_memory, "no host memory for the contents of a sleeping tag");
          e.size = size;
          return e;
        }
        return p;
      }
    }
    void free_host(void* p, std::uint64_t size) override {
      if constexpr (requires { backend->free_host(p, size); }) {
        backend->free_host(p, size);
      } else {
        ::operator delete (p, std::align_val_t{64});
      }
    }
    result<void> copy_to_host(const storage_handle& h, void* dst) override {
      if constexpr (requires { backend->copy_to_host(h, dst); }) {
        return backend->copy_to_host(h, dst);
      } else {
        return backend->read(h, dst);
      }
    }
    result<void> copy_from_host(const storage_handle& h, const void* src) override {
      if constexpr (requires { backend->copy_from_host(h, src); }) {
        return backend->copy_from_host(h, src);
      } else {
        return backend->write(h, src);
      }
    }
    result<storage_handle> reserve_range(std::uint64_t size, std::uint64_t unit) override {
      if constexpr (mapping_backend<S>) return backend->reserve_range(size, unit);
      return error::make(errc::unsupported, "the device cannot reserve address ranges");
    }
    result<void> map(storage_id range, std::uint64_t offset, std::uint64_t size) override {
      if constexpr (mapping_backend<S>) return backend->map(range, offset, size);
      return error::make(errc::unsupported, "the device cannot map memory");
    }
    void unmap(storage_id range, std::uint64_t offset, std::uint64_t size) override {
      if constexpr (mapping_backend<S>) backend->unmap(range, offset, size);
    }
    void unmap_idle(storage_id range, std::uint64_t offset, std::uint64_t size) override {
      if constexpr (idle_unmap_backend<S>) {
        backend->unmap_idle(range, offset, size);
      } else if constexpr (mapping_backend<S>) {
        backend->unmap(range, offset, size);
      }
    }
    void release_range(storage_id range) override {
      if constexpr (mapping_backend<S>) backend->release_range(range);
    }
    std::unique_ptr<S> backend;
  };
  std::unique_ptr<concept_t> impl_;
  bool ordered_ = false;
};

}  // namespace devrt::memory
