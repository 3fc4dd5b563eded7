// The client of one device: cheap to copy, safe to use from any thread.
//
// Every asynchronous operation takes an Asio completion token (default: devrt's `use_future`, a
// future that polls briefly before it sleeps and converts to std::future; see future.hpp) and
// completes with `boost::system::error_code` first:
//
//     auto h = client.reserve(1 << 20).get();                       // future; throws system_error
//     client.reserve(1 << 20, [](error_code ec, memory_handle h) {...});   // callback
//     auto h = co_await client.reserve(1 << 20, asio::use_awaitable);      // coroutine
//
// Ordering: messages posted by one thread run on the device strand in the order posted, so
// `create(size)` returns a handle at once and later operations from the same thread that use it
// see it bound. Completions run on the handler's associated executor (a future's, a coroutine's,
// or else the runtime's completion threads), never inline in the caller and never on the strand.
//
// Handles returned are reference-counted; dropping the last copy (from any thread) frees the
// memory without a message.
#pragma once

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/execution/outstanding_work.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/prefer.hpp>
#include <boost/asio/use_future.hpp>
#include <cstddef>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "devrt/memory/config.hpp"
#include "devrt/memory/handle.hpp"
#include "devrt/memory/storage.hpp"
#include "devrt/memory/stream.hpp"
#include "devrt/memory/tag.hpp"
#include "devrt/memory/usage.hpp"
#include "devrt/runtime/device_actor.hpp"
#include "devrt/runtime/error.hpp"
#include "devrt/runtime/future.hpp"
#include "devrt/runtime/tag.hpp"

namespace devrt::runtime {

using boost::system::error_code;
using memory::memory_binding;
using memory::memory_handle;

/// What a function given to `submit` receives, on the device strand.
struct submit_context {
  const device_info& device;
  std::span<const memory::resource> resources;  ///< one per binding given, in order
  /// The device's own stream: a cudaStream_t on CUDA devices (launch kernels on it), nullptr on
  /// devices without one. The strand's thread is bound to the device.
  void* stream = nullptr;
};

class compute_client;

/// The result of a capture window: handles pinning the persistent memory the window touched and,
/// on devices with streams, the recorded work (a CUDA graph). Copies share the graph; when the
/// last copy is dropped, the device waits for its replays and then releases the pins.
class device_graph {
 public:
  device_graph() = default;
  device_graph(std::shared_ptr<device_actor> actor, std::vector<memory_handle> pins,
               std::shared_ptr<memory::recorded_work> work)
      : state_(std::make_shared<state>(std::move(actor), std::move(pins), std::move(work))) {}

  /// The pinned handles (one per persistent slice the window touched).
  [[nodiscard]] const std::vector<memory_handle>& pins() const {
    static const std::vector<memory_handle> none;
    return state_ ? state_->pins : none;
  }
  /// Whether device work was recorded (CUDA devices).
  [[nodiscard]] bool recorded() const noexcept { return state_ && state_->work != nullptr; }
  [[nodiscard]] const std::shared_ptr<memory::recorded_work>& work() const noexcept {
    static const std::shared_ptr<memory::recorded_work> none;
    return state_ ? state_->work : none;
  }
  [[nodiscard]] const std::shared_ptr<device_actor>& actor() const noexcept {
    static const std::shared_ptr<device_actor> none;
    return state_ ? state_->actor : none;
  }

 private:
  struct state {
    state(std::shared_ptr<device_actor> a, std::vector<memory_handle> p, std::shared_ptr<memory::recorded_work> w)
        : actor(std::move(a)), pins(std::move(p)), work(std::move(w)) {}
    state(const state&) = delete;
    state& operator=(const state&) = delete;
    ~state() {
      if (!actor) return;
      // Release on the strand once the device has passed the replays already enqueued: the pins
      // hold the graph's memory until then, without the device thread waiting for the GPU. If the
      // actor has stopped, its storage drained the device first, and both simply go.
      actor->post(message([p = std::move(pins), w = std::move(work)](actor_core* core, const error*) mutable {
        if (core == nullptr || !w) {
          w.reset();
          p.clear();
          return;
        }
        auto t = core->manager().backing_storage().record_event(memory::streams::device);
        if (!t) (void)w->wait();  // no event to wait on (the device failed): fall back to waiting
        core->park(t ? *t : memory::event{0},
                   message([p = std::move(p), w = std::move(w)](actor_core*, const error*) mutable {
                     w.reset();
                     p.clear();
                   }));
      }));
    }
    std::shared_ptr<device_actor> actor;
    std::vector<memory_handle> pins;
    std::shared_ptr<memory::recorded_work> work;
  };
  std::shared_ptr<state> state_;
};

namespace detail {

/// The value of an operation that completes with no value.
struct nothing {};

template <class R>
struct signature {
  using type = void(error_code, R);
};
template <>
struct signature<void> {
  using type = void(error_code);
};

template <class R, class Body>
result<R> invoke_body(Body& body, actor_core& core) noexcept {
  try {
    return body(core);
  } catch (const devrt::exception& e) {
    return e.err();
  } catch (const std::exception& e) {
    error x = error::make(errc::task_failed, "the function threw");
    x.text = e.what();
    return x;
  } catch (...) {
    return error::make(errc::task_failed, "the function threw a non-standard exception");
  }
}

/// The same, then `after()` (which drops what the body holds) before the result is handed on.
template <class R, class Body, class After>
result<R> invoke_body(Body& body, actor_core& core, After&& after) noexcept {
  result<R> r = invoke_body<R>(body, core);
  after();
  return r;
}

/// Completes `handler` with `r` here and now (devrt's future, whose completion only publishes).
template <class R, class Handler>
void complete_now(Handler& handler, result<R> r) {
  if (!r) {
    handler.fail(std::move(r).err());  // the future keeps the error's values
  } else if constexpr (std::is_void_v<R>) {
    std::move(handler)(error_code());
  } else {
    std::move(handler)(error_code(), std::move(*r));
  }
}

/// Completes `handler` with `r` on its executor (kept busy by `work` until then).
template <class R, class Handler, class Work>
void complete(Handler& handler, Work& work, result<R> r) {
  const error_code ec = r ? error_code() : to_error_code(r.err());
  if constexpr (std::is_void_v<R>) {
    boost::asio::dispatch(work, [h = std::move(handler), ec]() mutable { std::move(h)(ec); });
  } else {
    R value = r ? std::move(*r) : R{};
    boost::asio::dispatch(
        work, [h = std::move(handler), ec, v = std::move(value)]() mutable { std::move(h)(ec, std::move(v)); });
  }
}

}  // namespace detail

class persistent_scope;

class compute_client {
 public:
  using default_token = use_future_t;

  /// A client of no device: every operation on it throws devrt::exception (invalid_argument);
  /// get one from `runtime::client`.
  compute_client() = default;
  explicit compute_client(std::shared_ptr<device_actor> actor) : actor_(std::move(actor)) {}

  [[nodiscard]] const device_info& device() const { return require()->info(); }
  [[nodiscard]] bool valid() const noexcept { return actor_ != nullptr; }
  [[nodiscard]] const std::shared_ptr<device_actor>& actor() const noexcept { return actor_; }

  /// Where a message may run: in place on the calling thread when the actor is idle (devrt's own
  /// operations), or only on the device thread (`submit`, which runs the caller's function).
  enum class placement { in_place_when_idle, device_thread };

  /// Runs `body(actor_core&) -> result<R>` on the actor and completes the token with its result.
  /// The building block of every operation below.
  template <class R, class Token, class Body>
  auto async_run(Body&& body, Token&& token, placement where = placement::in_place_when_idle) const {
    return async_run_raw<R>(
        [b = std::optional<std::decay_t<Body>>(std::forward<Body>(body))](actor_core& core, auto finish) mutable {
          // What the body holds (bindings) goes before the caller hears back: a binding that is
          // the last reference frees its memory now, in order with the caller's next steps (a
          // stream destroyed after the call returns was not yet destroyed at the free).
          finish(detail::invoke_body<R>(*b, core, [&b] { b.reset(); }));
        },
        std::forward<Token>(token), where);
  }

  /// Like `async_run`, for bodies that complete later: `body(actor_core&, finish)` calls
  /// `finish(result<R>)` exactly once, by the actor, now or from work parked on an event.
  template <class R, class Token, class Body>
  auto async_run_raw(Body&& body, Token&& token, placement where = placement::in_place_when_idle) const {
    (void)require();
    return boost::asio::async_initiate<Token, typename detail::signature<R>::type>(
        [](auto handler, const std::shared_ptr<device_actor>& actor, std::decay_t<Body> b, placement w) {
          auto send = [&actor, w](message m) {
            if (w == placement::in_place_when_idle) {
              actor->run_or_post(std::move(m));
            } else {
              actor->post(std::move(m));
            }
          };
          if constexpr (detail::is_future_handler_v<decltype(handler)>) {
            // devrt's future is completed by the actor itself: no executor, no hop (it may be
            // ready when this returns, served in place). A wait for it on the device's own thread
            // fails at once rather than hang (see future.hpp).
            handler.completed_by(actor.get());
            send(message([h = std::move(handler), b = std::move(b)](actor_core* core, const error* e) mutable {
              auto finish = [h = std::move(h)](result<R> r) mutable { detail::complete_now<R>(h, std::move(r)); };
              if (core == nullptr) {
                finish(result<R>(*e));
              } else {
                b(*core, std::move(finish));
              }
            }));
            return;
          }
          // Other tokens complete through their executor, never inside the actor's run.
          auto ex = boost::asio::get_associated_executor(handler, actor->completion_executor());
          auto work = boost::asio::prefer(ex, boost::asio::execution::outstanding_work.tracked);
          send(message([h = std::move(handler), b = std::move(b), wk = std::move(work)](actor_core* core,
                                                                                        const error* e) mutable {
            auto finish = [h = std::move(h), wk = std::move(wk)](result<R> r) mutable {
              detail::complete<R>(h, wk, std::move(r));
            };
            if (core == nullptr) {
              finish(result<R>(*e));
            } else {
              b(*core, std::move(finish));
            }
          }));
        },
        token, actor_, std::forward<Body>(body), where);
  }

  /// Completes the token with an error without visiting the strand (validation on the caller's
  /// side). Completes through the handler's executor, never inline.
  template <class R, class Token>
  auto async_fail(error e, Token&& token) const {
    (void)require();
    return boost::asio::async_initiate<Token, typename detail::signature<R>::type>(
        [](auto handler, const std::shared_ptr<device_actor>& actor, const error& err) {
          if constexpr (detail::is_future_handler_v<decltype(handler)>) {
            detail::complete_now<R>(handler, result<R>(err));  // the future is simply ready
            return;
          }
          auto ex = boost::asio::get_associated_executor(handler, actor->completion_executor());
          auto work = boost::asio::prefer(ex, boost::asio::execution::outstanding_work.tracked);
          const error_code ec = to_error_code(err);
          boost::asio::post(work, [h = std::move(handler), ec]() mutable {
            if constexpr (std::is_void_v<R>) {
              std::move(h)(ec);
            } else {
              std::move(h)(ec, R{});
            }
          });
        },
        token, actor_, std::move(e));
  }

  /// Runs `body(actor_core&) -> result<pair<event, V>>` on the strand and completes the token
  /// with the V once the device has passed the event (R is V, or void with V = detail::nothing).
  template <class R, class Token, class Body>
  auto async_device(Body&& body, Token&& token) const {
    using V = std::conditional_t<std::is_void_v<R>, detail::nothing, R>;
    return async_run_raw<R>(
        [b = std::forward<Body>(body)](actor_core& c, auto finish) mutable {
          result<std::pair<memory::event, V>> r = detail::invoke_body<std::pair<memory::event, V>>(b, c);
          if (!r) {
            finish(result<R>(std::move(r).err()));
            return;
          }
          c.park(r->first,
                 message([f = std::move(finish), v = std::move(r->second)](actor_core* core, const error* e) mutable {
                   if (core == nullptr) {
                     f(result<R>(*e));
                   } else if constexpr (std::is_void_v<R>) {
                     f(result<R>());
                   } else {
                     f(result<R>(std::move(v)));
                   }
                 }));
        },
        std::forward<Token>(token));
  }

  /// Reserves `size` bytes for use on the device's own stream; on out-of-memory the actor
  /// reclaims once and retries. The handle's `ptr()` is the memory's address as soon as it
  /// completes.
  template <class Token = default_token>
  auto reserve(std::uint64_t size, Token&& token = {}) const {
    return reserve(size, memory::stream(), std::forward<Token>(token));
  }
  /// Reserves `size` bytes for use on stream `s` (see "Threading and stream order" in the
  /// README): memory freed on `s` may come back at once, memory freed on other streams only once
  /// their work on it is done.
  template <class Token = default_token>
  requires(!std::is_convertible_v<Token, const memory::tag_name&>) auto reserve(std::uint64_t size, memory::stream s,
                                                                                Token&& token = {}) const {
    return async_run<memory_handle>(
        [size, q = s.id(), t = current_tag_id()](actor_core& c) { return c.reserve(size, q, t); },
        std::forward<Token>(token));
  }
  /// Reserves `size` bytes tagged `tag` (devrt/memory/tag.hpp), whatever this thread's tag.
  template <class Token = default_token>
  auto reserve(std::uint64_t size, memory::stream s, const memory::tag_name& tag, Token&& token = {}) const {
    auto id = memory::intern_tag(tag);
    if (!id) return async_fail<memory_handle>(std::move(id).err(), std::forward<Token>(token));
    return async_run<memory_handle>([size, q = s.id(), t = *id](actor_core& c) { return c.reserve(size, q, t); },
                                    std::forward<Token>(token));
  }

  /// A handle at once; its memory is reserved (for stream `s`) and bound on the strand, in order
  /// with this thread's later messages. If that fails, later operations on the handle report the
  /// failure.
  [[nodiscard]] memory_handle create(std::uint64_t size, memory::stream s = {}) const {
    return create_tagged(size, s, current_tag_id());
  }
  /// The same, tagged `tag` whatever this thread's tag. Throws devrt::exception (invalid_argument)
  /// when the process has `memory::max_tags` tags already.
  [[nodiscard]] memory_handle create(std::uint64_t size, memory::stream s, const memory::tag_name& tag) const {
    auto id = memory::intern_tag(tag);
    if (!id) throw exception(std::move(id).err());
    return create_tagged(size, s, *id);
  }

  /// Tags this thread's later reserves and creates (those that name no tag) until the scope ends
  /// (runtime/tag.hpp). Throws devrt::exception (invalid_argument) for a malformed tag.
  [[nodiscard]] static tag_scope tag(std::string_view name) { return tag_scope(name); }

  /// Puts the memory tagged `tag` on this device to sleep (devrt/memory/tag.hpp): in stream order
  /// after the work queued on the device's streams, copies every live allocation of the tag to
  /// pinned host memory when `keep_contents`, unmaps and releases its physical memory, keeping
  /// the addresses. Completes once the device has the memory back; the device thread does not wait
  /// for the GPU meanwhile. A tag unknown here or already asleep: completes at once. Errors:
  /// invalid_argument (a malformed tag), unsupported (a device that cannot map memory),
  /// capture_active, out_of_memory (no host memory for the copy: nothing changed), device_error.
  template <class Token = default_token>
  auto sleep(std::string_view tag, bool keep_contents, Token&& token = {}) const {
    auto id = lookup_tag(tag);
    if (!id) return async_fail<void>(std::move(id).err(), std::forward<Token>(token));
    return async_run_raw<void>(
        [t = *id, keep_contents](actor_core& c, auto finish) { c.sleep_tag(t, keep_contents, std::move(finish)); },
        std::forward<Token>(token));
  }
  /// Wakes `tag`: maps new physical memory at the same addresses (with the device's peer access)
  /// and restores the kept contents; completes once they are back. An awake tag: at once. Errors:
  /// out_of_memory (nothing changed: the tag stays asleep, its kept copy too), invalid_argument,
  /// capture_active, device_error.
  template <class Token = default_token>
  auto wake(std::string_view tag, Token&& token = {}) const {
    auto id = lookup_tag(tag);
    if (!id) return async_fail<void>(std::move(id).err(), std::forward<Token>(token));
    return async_run_raw<void>([t = *id](actor_core& c, auto finish) { c.wake_tag(t, std::move(finish)); },
                               std::forward<Token>(token));
  }
  /// Frees the pinned host memory kept after wakes for later sleeps' copies (statistics:
  /// bytes_host_cached; pinning costs far more than the copy, so it is kept until this call or the
  /// device's end). Copies holding a sleeping tag's contents stay. Completes with the bytes freed.
  /// On CUDA, cudaFreeHost may wait for the device's queued work.
  template <class Token = default_token>
  auto release_host_copies(Token&& token = {}) const {
    return async_run<std::uint64_t>(
        [](actor_core& c) -> result<std::uint64_t> { return c.manager().release_host_copies(); },
        std::forward<Token>(token));
  }
  /// What every tag used on this device holds (state, bytes in use, reserved, sleeping, offloaded).
  template <class Token = default_token>
  auto tags(Token&& token = {}) const {
    return async_run<std::vector<memory::tag_usage>>(
        [](actor_core& c) -> result<std::vector<memory::tag_usage>> { return c.manager().tags(); },
        std::forward<Token>(token));
  }

  /// Marks the memory as used on stream `s` too (as PyTorch's `record_stream`): when its last
  /// handle is dropped, no other allocation gets it, and it does not go back to the driver, before
  /// the work queued on `s` by then is done. `s` may be another GPU's stream (a kernel there uses
  /// this memory through peer access). Ordered before a drop that follows it in this thread; keep
  /// `s` alive until the memory is freed. Completes with the error if devrt cannot track `s`
  /// (invalid_argument: not a live stream; device_error); the memory is then not marked.
  template <class Token = default_token>
  auto record_stream(const memory_handle& h, memory::stream s, Token&& token = {}) const {
    return record_stream(h.binding(), s, std::forward<Token>(token));
  }
  template <class Token = default_token>
  auto record_stream(memory_binding b, memory::stream s, Token&& token = {}) const {
    return async_run<void>([b = std::move(b), q = s.id()](actor_core& c) { return c.manager().record_stream(b, q); },
                           std::forward<Token>(token));
  }

  /// Tells the device that stream `s` is about to be destroyed. Optional: memory freed on a stream
  /// is fenced at the free, so a stream may be destroyed once its memory is freed, with work still
  /// queued. Retiring fences its last frees at once and lets devrt forget the stream as soon as its
  /// memory is back.
  template <class Token = default_token>
  auto retire_stream(memory::stream s, Token&& token = {}) const {
    return async_run<void>([q = s.id()](actor_core& c) { return c.manager().retire_stream(q); },
                           std::forward<Token>(token));
  }

  /// Gives the memory of `reserved` to `assigned` (a fresh `memory_handle::make()`). The message
  /// binds a copy and the caller keeps `reserved` (even when passed with std::move): on success
  /// it turns stale like every copy of a bound handle (drop it), and on failure it still holds
  /// the memory, so nothing is lost to a failed bind.
  template <class Token = default_token>
  auto bind(const memory_handle& reserved, memory_handle assigned, Token&& token = {}) const {
    return async_run<void>(
        [r = reserved, a = std::move(assigned)](actor_core& c) mutable { return c.manager().bind(std::move(r), a); },
        std::forward<Token>(token));
  }

  /// The resource (pointer, size) of an allocation.
  template <class Token = default_token>
  requires(!std::is_convertible_v<Token, std::optional<std::uint64_t>>) auto get_resource(memory_binding b,
                                                                                          Token&& token = {}) const {
    return get_resource(std::move(b), std::nullopt, std::nullopt, std::forward<Token>(token));
  }
  /// The resource of an allocation trimmed at either end (the token last, as in Asio).
  template <class Token = default_token>
  auto get_resource(memory_binding b, std::optional<std::uint64_t> offset_start,
                    std::optional<std::uint64_t> offset_end = {}, Token&& token = {}) const {
    return async_run<memory::resource>([b = std::move(b), offset_start, offset_end](
                                           actor_core& c) { return c.get_resource(b, offset_start, offset_end); },
                                       std::forward<Token>(token));
  }

  /// Copies `bytes` into the start of the allocation (stream-ordered on CUDA).
  template <class Token = default_token>
  auto write(memory_binding b, std::vector<std::byte> bytes, Token&& token = {}) const {
    return async_run<void>(
        [b = std::move(b), data = std::move(bytes)](actor_core& c) { return c.write(b, data.data(), data.size()); },
        std::forward<Token>(token));
  }

  /// The bytes of the allocation, copied in order on its stream after the work queued there;
  /// completes when the device has done the copy (the device thread does not wait for it).
  template <class Token = default_token>
  auto read(memory_binding b, Token&& token = {}) const {
    return async_device<std::vector<std::byte>>(
        [b = std::move(b)](actor_core& c) -> result<std::pair<memory::event, std::vector<std::byte>>> {
          auto size = c.size_of(b);
          if (!size) return std::move(size).err();
          std::vector<std::byte> out(*size);
          auto t = c.read_async(b, out.data(), out.size());
          if (!t) return std::move(t).err();
          return std::make_pair(*t, std::move(out));  // the buffer does not move with the vector
        },
        std::forward<Token>(token));
  }

  /// Runs `fn(submit_context&)` on the device thread (never in place on the caller's) with the
  /// bindings resolved to resources, and completes with its return value (which must be
  /// default-constructible, or void). An exception from `fn` completes the operation with
  /// errc::task_failed.
  template <class F, class Token = default_token>
  auto submit(std::vector<memory_binding> bindings, F fn, Token&& token = {}) const {
    using R = std::invoke_result_t<F&, submit_context&>;
    return async_run<R>(
        [bs = std::move(bindings), f = std::move(fn)](actor_core& c) mutable -> result<R> {
          std::vector<memory::resource> resources;
          resources.reserve(bs.size());
          for (const auto& b : bs) {
            auto r = c.get_resource(b);
            if (!r) return std::move(r).err();
            resources.push_back(*r);
            // Kernels of `fn` run on the device's stream: memory of other streams is used there too.
            if (auto u = c.use_on_device_stream(b); !u) return std::move(u).err();
          }
          submit_context ctx{c.info(), resources, c.manager().backing_storage().native_stream()};
          if constexpr (std::is_void_v<R>) {
            f(ctx);
            return {};
          } else {
            return f(ctx);
          }
        },
        std::forward<Token>(token), placement::device_thread);
  }

  /// Sets the most this device may hold for devrt (bytes; 0: no limit), as cudaMallocAsync's
  /// release threshold and PyTorch's per-process memory fraction: reserves that would pass it
  /// fail with out_of_memory. Below what the device holds now, free memory goes back at once;
  /// live memory stays. It is also the budget of the pools' policy (memory_manager.hpp).
  template <class Token = default_token>
  auto set_memory_limit(std::uint64_t bytes, Token&& token = {}) const {
    return async_run<void>([bytes](actor_core& c) { return c.manager().set_memory_limit(bytes); },
                           std::forward<Token>(token));
  }
  /// The device's memory limit (0: none).
  template <class Token = default_token>
  auto memory_limit(Token&& token = {}) const {
    return async_run<std::uint64_t>([](actor_core& c) { return result<std::uint64_t>(c.manager().memory_limit()); },
                                    std::forward<Token>(token));
  }

  /// Explicit cleanup: returns unused pages to the device and flushes.
  template <class Token = default_token>
  auto cleanup(Token&& token = {}) const {
    return async_run<void>([](actor_core& c) { return c.manager().cleanup(true); }, std::forward<Token>(token));
  }

  /// Replaces the dynamic pools when none of their memory is live. The layout is validated here,
  /// on the caller's side: an invalid layout fails at once with the validation error. Memory freed
  /// on streams whose work is still queued is not live, but it cannot go back before its fences
  /// pass: the operation then completes once they have (the device thread does not wait
  /// meanwhile), applied unless something became live again.
  template <class Token = default_token>
  auto configure(const memory::memory_layout& layout, Token&& token = {}) const {
    auto resolved = memory::resolve_layout(layout, require()->info().properties);
    if (!resolved) return async_fail<memory::configure_outcome>(std::move(resolved).err(), std::forward<Token>(token));
    return async_run_raw<memory::configure_outcome>(
        [layout](actor_core& c, auto finish) { configure_when_quiet(c, layout, std::move(finish)); },
        std::forward<Token>(token));
  }

  template <class Token = default_token>
  auto memory_usage(Token&& token = {}) const {
    return async_run<memory::memory_usage>(
        [](actor_core& c) { return result<memory::memory_usage>(c.manager().usage()); }, std::forward<Token>(token));
  }

  template <class Token = default_token>
  auto statistics(Token&& token = {}) const {
    return async_run<memory::memory_statistics>(
        [](actor_core& c) {
          c.manager().process_releases();
          return result<memory::memory_statistics>(c.manager().statistics());
        },
        std::forward<Token>(token));
  }

  /// Sets the peak reserved and in-use bytes to their current values (after the frees so far).
  template <class Token = default_token>
  auto reset_peak_statistics(Token&& token = {}) const {
    return async_run<void>(
        [](actor_core& c) {
          c.manager().reset_peaks();
          return result<void>();
        },
        std::forward<Token>(token));
  }

  /// The manager's readable report.
  template <class Token = default_token>
  auto report(Token&& token = {}) const {
    return async_run<std::string>([](actor_core& c) { return result<std::string>(c.manager().report()); },
                                  std::forward<Token>(token));
  }

  /// The device's pools block by block, with the trace recorded so far (memory/snapshot.hpp):
  /// what `torch.cuda.memory._snapshot()` gives, for one device.
  template <class Token = default_token>
  auto snapshot(Token&& token = {}) const {
    return async_run<memory::memory_snapshot>(
        [](actor_core& c) { return result<memory::memory_snapshot>(c.manager().snapshot()); },
        std::forward<Token>(token));
  }

  /// Starts (or stops) recording this device's trace of memory events for snapshots: at most
  /// `max_entries`, oldest dropped first; starting anew clears it. Off by default; while on, each
  /// allocation, free and mapping adds an entry.
  template <class Token = default_token>
  auto record_memory_history(bool enabled, std::size_t max_entries = memory::memory_manager::default_history_entries,
                             Token&& token = {}) const {
    return async_run<void>(
        [enabled, max_entries](actor_core& c) {
          c.manager().record_history(enabled, max_entries);
          return result<void>();
        },
        std::forward<Token>(token));
  }

  /// The manager's consistency check: empty when consistent.
  template <class Token = default_token>
  auto check_invariants(Token&& token = {}) const {
    return async_run<std::string>([](actor_core& c) { return result<std::string>(c.manager().check_invariants()); },
                                  std::forward<Token>(token));
  }

  /// Opens a capture window: reserves go to the persistent pool (warm it first, by running the
  /// work once), and on CUDA devices the work submitted until `capture_end` is recorded into a
  /// graph instead of running.
  template <class Token = default_token>
  auto capture_begin(Token&& token = {}) const {
    // On the device thread always: CUDA ends a capture only on the thread that began it.
    return async_run<void>([](actor_core& c) { return c.capture_begin(); }, std::forward<Token>(token),
                           placement::device_thread);
  }

  /// Closes the capture window. The graph pins exactly the persistent memory the window touched
  /// and, on CUDA devices, holds the recorded work for `replay`.
  template <class Token = default_token>
  auto capture_end(Token&& token = {}) const {
    return async_run<device_graph>(
        [actor = actor_](actor_core& c) -> result<device_graph> {
          auto r = c.capture_end();
          if (!r) return std::move(r).err();
          return device_graph(actor, std::move(r->first), std::move(r->second));
        },
        std::forward<Token>(token), placement::device_thread);  // where the capture began
  }

  /// Enqueues one replay of a captured graph on the device's queue.
  template <class Token = default_token>
  auto replay(const device_graph& g, Token&& token = {}) const {
    return async_run<void>(
        [w = g.work()](actor_core&) -> result<void> {
          if (!w) return error::make(errc::invalid_argument, "the graph recorded no device work to replay");
          return w->launch();
        },
        std::forward<Token>(token));
  }

  /// Completes once the work queued so far on stream `s` (default: the device's own) is done;
  /// immediate on devices without queues. The device thread does not wait meanwhile.
  template <class Token = default_token>
  auto synchronize(Token&& token = {}) const {
    return synchronize(memory::stream(), std::forward<Token>(token));
  }
  template <class Token = default_token>
  auto synchronize(memory::stream s, Token&& token = {}) const {
    return async_device<void>(
        [q = s.id()](actor_core& c) -> result<std::pair<memory::event, detail::nothing>> {
          auto t = c.manager().backing_storage().record_event(q);
          if (!t) return std::move(t).err();
          return std::make_pair(*t, detail::nothing{});
        },
        std::forward<Token>(token));
  }

  /// Opens a persistent allocation scope: reserves and creates posted while it is open (from any
  /// thread) go to the persistent pool. Scopes nest.
  [[nodiscard]] persistent_scope persistent() const;

 private:
  friend class persistent_scope;
  template <class Finish>
  static void configure_when_quiet(actor_core& c, const memory::memory_layout& layout, Finish finish) {
    auto r = c.manager().configure(layout);
    if (!r || !r->pending) {
      finish(std::move(r));
      return;
    }
    c.park_until_fences(message([layout, f = std::move(finish)](actor_core* core, const error* e) mutable {
      if (core == nullptr) {
        f(result<memory::configure_outcome>(*e));
        return;
      }
      configure_when_quiet(*core, layout, std::move(f));
    }));
  }
  /// The actor, or throws for a default-constructed client (which refers to no device).
  [[nodiscard]] memory_handle create_tagged(std::uint64_t size, memory::stream s, memory::tag_id tag) const {
    const auto& actor = require();
    memory_handle h = memory_handle::make();
    actor->run_or_post(message([size, h, q = s.id(), tag](actor_core* core, const error*) {
      if (core != nullptr) core->create(size, h, q, tag);
    }));
    return h;
  }
  static result<memory::tag_id> lookup_tag(std::string_view tag) {
    auto name = memory::tag_name::make(tag);
    if (!name) return std::move(name).err();
    if (name->empty()) return error::make(errc::invalid_argument, "sleep and wake need a tag (the name is empty)");
    return memory::intern_tag(*name);
  }

  const std::shared_ptr<device_actor>& require() const {
    if (actor_ == nullptr) {
      throw exception(error::make(errc::invalid_argument,
                                  "this compute_client refers to no device (default-constructed); get one "
                                  "from runtime::client, host(), sim() or cuda()"));
    }
    return actor_;
  }
  std::shared_ptr<device_actor> actor_;
};

/// RAII persistent allocation scope; see `compute_client::persistent`.
class persistent_scope {
 public:
  explicit persistent_scope(std::shared_ptr<device_actor> actor) : actor_(std::move(actor)) {
    actor_->run_or_post(message([](actor_core* c, const error*) {
      if (c != nullptr) c->enter_persistent();
    }));
  }
  persistent_scope(persistent_scope&& o) noexcept = default;
  persistent_scope& operator=(persistent_scope&&) = delete;
  persistent_scope(const persistent_scope&) = delete;
  persistent_scope& operator=(const persistent_scope&) = delete;
  ~persistent_scope() {
    if (actor_ == nullptr) return;
    actor_->run_or_post(message([](actor_core* c, const error*) {
      if (c != nullptr) c->exit_persistent();
    }));
  }

 private:
  std::shared_ptr<device_actor> actor_;
};

inline persistent_scope compute_client::persistent() const { return persistent_scope(require()); }

}  // namespace devrt::runtime
