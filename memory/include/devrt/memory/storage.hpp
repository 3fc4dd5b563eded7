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
/// graph, on CUDA devices), replayable on the device's queue.
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

/// A point in a queue's work (a CUDA event recorded on a stream), handed out by a queued backend:
/// it has *passed* once the device has done every piece of work queued before it. 0 names a point
/// that has passed already (devices without queues hand out nothing else).
using ticket = std::uint64_t;

/// Optional capabilities of a backend whose device has work queues (CUDA streams). Backends
/// without them get the defaults of `storage`: no queue, nothing to capture, every ticket passed.
///
/// - `mark(q)`: a ticket behind the work queued on `q` so far (a pooled event; never blocks).
/// - `passed(t)`: whether the device has passed `t`, without blocking; once true, the ticket's
///   completion work is done (a staged read copied out) and the ticket is gone.
/// - `wait(t)`: blocks until `t` has passed (for memory pressure and for callers that wait).
/// - `join(q, t)`: later work on `q` waits for `t` (cudaStreamWaitEvent); never blocks the host.
///   The ticket is consumed.
/// - `use_queue(q)`, `retire_queue(q)`: the streams that use the device's memory; memory goes
///   back to the driver only after the work queued on every one of them.
/// - `write_on(h, src, q)`: copies `h.size` bytes from `src` into the view, ordered on `q`; the
///   caller may reuse `src` when it returns (the bytes are staged in pinned host memory).
/// - `read_async(h, dst, q)`: copies the view into `dst` in order on `q`; `dst` holds the bytes
///   once the returned ticket has passed (`dst` must stay valid until then).
template <class S>
concept queued_backend = requires(S& s, queue_id q, ticket t, const storage_handle& h) {
  { s.native_queue() } -> std::same_as<void*>;
  { s.begin_capture() } -> std::same_as<result<void>>;
  { s.end_capture() } -> std::same_as<result<std::shared_ptr<recorded_work>>>;
  { s.synchronize() } -> std::same_as<result<void>>;
  { s.mark(q) } -> std::same_as<result<ticket>>;
  { s.passed(t) } -> std::same_as<result<bool>>;
  { s.wait(t) } -> std::same_as<result<void>>;
  { s.join(q, t) } -> std::same_as<result<void>>;
  { s.use_queue(q) } -> std::same_as<void>;
  { s.retire_queue(q) } -> std::same_as<void>;
  { s.write_on(h, static_cast<const void*>(nullptr), q) } -> std::same_as<result<void>>;
  { s.read_async(h, static_cast<void*>(nullptr), q) } -> std::same_as<result<ticket>>;
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
  /// Mappings whose unmap the device has not done yet: their addresses are still mapped, so a
  /// pool may map them again only with the same bounds. Where a backend does not say, any memory
  /// still returning counts as one.
  [[nodiscard]] std::size_t unmaps_in_flight() const { return impl_->unmaps_in_flight(); }
  [[nodiscard]] std::string name() const { return impl_->name(); }

  /// The device's work queue (a cudaStream_t on CUDA devices); nullptr when it has none.
  [[nodiscard]] void* native_queue() { return impl_->native_queue(); }
  /// Starts recording the work enqueued on the device's queue (no-op without a queue).
  result<void> begin_capture() { return impl_->begin_capture(); }
  /// Stops recording; nullptr when the device records nothing.
  result<std::shared_ptr<recorded_work>> end_capture() { return impl_->end_capture(); }
  /// Waits for the device's queue to drain.
  result<void> synchronize() { return impl_->synchronize(); }

  /// Whether the device has work queues (see `queued_backend`); without them every ticket has
  /// passed when it is handed out and streams mean nothing.
  [[nodiscard]] bool ordered() const noexcept { return ordered_; }
  result<ticket> mark(queue_id q) { return impl_->mark(q); }
  result<bool> passed(ticket t) { return t == 0 ? result<bool>(true) : impl_->passed(t); }
  result<void> wait(ticket t) { return t == 0 ? result<void>() : impl_->wait(t); }
  result<void> join(queue_id q, ticket t) { return t == 0 ? result<void>() : impl_->join(q, t); }
  void use_queue(queue_id q) { impl_->use_queue(q); }
  void retire_queue(queue_id q) { impl_->retire_queue(q); }
  /// `write`, ordered on `q` (the same as `write` on devices without queues).
  result<void> write_on(const storage_handle& h, const void* src, queue_id q) { return impl_->write_on(h, src, q); }
  /// `read`, ordered on `q`, without waiting: `dst` holds the bytes once the ticket has passed.
  result<ticket> read_async(const storage_handle& h, void* dst, queue_id q) { return impl_->read_async(h, dst, q); }

  /// Address ranges and mapping (see `mapping_backend`). Backends without the capability report
  /// `map_granularity` 0, and these calls fail with `unsupported`.
  result<storage_handle> reserve_range(std::uint64_t size, std::uint64_t unit) {
    return impl_->reserve_range(size, unit);
  }
  result<void> map(storage_id range, std::uint64_t offset, std::uint64_t size) {
    return impl_->map(range, offset, size);
  }
  void unmap(storage_id range, std::uint64_t offset, std::uint64_t size) { impl_->unmap(range, offset, size); }
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
    [[nodiscard]] virtual std::size_t unmaps_in_flight() const = 0;
    [[nodiscard]] virtual std::string name() const = 0;
    virtual void* native_queue() = 0;
    virtual result<void> begin_capture() = 0;
    virtual result<std::shared_ptr<recorded_work>> end_capture() = 0;
    virtual result<void> synchronize() = 0;
    [[nodiscard]] virtual bool ordered() const = 0;
    virtual result<ticket> mark(queue_id q) = 0;
    virtual result<bool> passed(ticket t) = 0;
    virtual result<void> wait(ticket t) = 0;
    virtual result<void> join(queue_id q, ticket t) = 0;
    virtual void use_queue(queue_id q) = 0;
    virtual void retire_queue(queue_id q) = 0;
    virtual result<void> write_on(const storage_handle& h, const void* src, queue_id q) = 0;
    virtual result<ticket> read_async(const storage_handle& h, void* dst, queue_id q) = 0;
    virtual result<storage_handle> reserve_range(std::uint64_t size, std::uint64_t unit) = 0;
    virtual result<void> map(storage_id range, std::uint64_t offset, std::uint64_t size) = 0;
    virtual void unmap(storage_id range, std::uint64_t offset, std::uint64_t size) = 0;
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
    [[nodiscard]] std::size_t unmaps_in_flight() const override {
      if constexpr (requires { backend->unmaps_in_flight(); }) {
        return backend->unmaps_in_flight();
      } else {
        return returning() != 0 ? 1 : 0;
      }
    }
    [[nodiscard]] std::string name() const override { return backend->name(); }
    void* native_queue() override {
      if constexpr (queued_backend<S>) return backend->native_queue();
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
    result<ticket> mark(queue_id q) override {
      if constexpr (queued_backend<S>) return backend->mark(q);
      return ticket{0};
    }
    result<bool> passed(ticket t) override {
      if constexpr (queued_backend<S>) return backend->passed(t);
      return true;
    }
    result<void> wait(ticket t) override {
      if constexpr (queued_backend<S>) return backend->wait(t);
      return {};
    }
    result<void> join(queue_id q, ticket t) override {
      if constexpr (queued_backend<S>) return backend->join(q, t);
      return {};
    }
    void use_queue(queue_id q) override {
      if constexpr (queued_backend<S>) backend->use_queue(q);
    }
    void retire_queue(queue_id q) override {
      if constexpr (queued_backend<S>) backend->retire_queue(q);
    }
    result<void> write_on(const storage_handle& h, const void* src, queue_id q) override {
      if constexpr (queued_backend<S>) return backend->write_on(h, src, q);
      return backend->write(h, src);
    }
    result<ticket> read_async(const storage_handle& h, void* dst, queue_id q) override {
      if constexpr (queued_backend<S>) {
        return backend->read_async(h, dst, q);
      } else {
        if (auto r = backend->read(h, dst); !r) return std::move(r).err();
        return ticket{0};
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
    void release_range(storage_id range) override {
      if constexpr (mapping_backend<S>) backend->release_range(range);
    }
    std::unique_ptr<S> backend;
  };
  std::unique_ptr<concept_t> impl_;
  bool ordered_ = false;
};

}  // namespace devrt::memory
