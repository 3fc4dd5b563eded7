// The default completion of the compute client: a future that polls for a few microseconds
// before it sleeps, with no lock per operation, and no allocation once warm (its state comes from a
// few blocks each thread keeps).
//
// A memory message is served in well under a microsecond once the device thread has it, while a
// thread asleep in the kernel takes several microseconds to be woken (more on servers whose idle
// cores sleep deeply). So `get()` and the waits poll the result for up to `future_spin` (yielding
// the core between polls after the first 8 µs, so that threads outnumbering cores still make
// progress) and only then block. Whoever runs the message completes the future directly: one
// atomic exchange, and a wake-up only when the client already sleeps. A request that finds the
// device idle is served on the calling thread before the call returns (device_actor::run_or_post),
// so its future is ready at once and `get()` neither polls nor sleeps.
//
// It behaves as a std::future (valid, get, wait, wait_for, wait_until; get throws
// devrt::runtime::system_error, a boost::system::system_error holding devrt's error with its
// values) and converts to one by moving:
//
//     devrt::runtime::future<memory_handle> f = client.reserve(1 << 20);   // the default token
//     std::future<memory_handle> g = client.reserve(1 << 20);              // converts
//     auto h = client.reserve(1 << 20, boost::asio::use_future).get();     // Asio's std::future
//
// Waiting on the device's own thread: a function given to `submit` runs on the device thread, and
// a request of the same device is served by that thread only after the function returns. So
// `get` and `wait` there, on a future of that device that is not ready, throw system_error with
// errc::would_deadlock at once instead of hanging every client of the device; a timed wait
// returns `timeout` at once. (A std::future converted from it, or Asio's use_future, cannot be
// checked: do not block on those on a device thread.)
#pragma once

#include <atomic>
#include <boost/asio/async_result.hpp>
#include <boost/system/error_code.hpp>
#include <boost/system/system_error.hpp>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

#include "devrt/runtime/error.hpp"
#include "devrt/runtime/spin.hpp"

namespace devrt::runtime {

/// The completion token that makes an operation return a `devrt::runtime::future`.
struct use_future_t {};
inline constexpr use_future_t use_future{};

/// How long `future::get` and the waits poll before they block.
inline constexpr std::chrono::microseconds future_spin{20};

namespace detail {

/// The device whose actor the calling thread runs now: set by the device thread when it starts,
/// and by a client thread while it serves a message in place; else nullptr. Identifies the device
/// only; never dereferenced.
inline thread_local const void* current_device = nullptr;

/// Blocks while `word` holds `expected`, for at most `timeout` when given (spurious returns
/// allowed). Linux futex.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                const std::chrono::nanoseconds* timeout) noexcept;
/// Wakes every thread blocked on `word`.
void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept;

struct no_value {};

/// The blocks of one size kept for future states, so that the futures allocate nothing once warm.
/// A state is taken from the cache of the thread that makes it and goes back to that of the
/// thread that drops it last; when a thread's cache is full (a device thread that completes
/// other threads' futures), the block goes to a shared stock of spares, from which a thread whose
/// cache is empty takes before it allocates. The thread caches are plain thread-local data (never
/// destroyed); a guard frees a cache's blocks when its thread ends, and a state dropped after
/// that goes to the spares or is freed.
template <std::size_t Size>
class state_blocks {
 public:
  static void* take() {
    slots& c = cache;
    if (c.count > 0) return c.block[--c.count];
    if (void* p = spares.pop()) return p;
    return ::operator new(Size);
  }
  static void give(void* p) noexcept {
    slots& c = cache;
    if (c.count >= 0 && c.count < kept) {
      if (c.count == 0) guard.arm();  // so that the blocks go when the thread ends
      c.block[c.count++] = p;
      return;
    }
    if (!spares.push(p)) ::operator delete(p);
  }

 private:
  static constexpr int kept = 8;
  struct slots {
    void* block[kept];
    int count;  // -1 once the thread's guard ran: keep nothing more
  };
  struct reaper {
    bool armed = false;
    void arm() noexcept { armed = true; }  // touching it registers the destructor
    ~reaper() {
      slots& c = cache;
      for (int i = 0; i < c.count; ++i) ::operator delete(c.block[i]);
      c.count = -1;
    }
  };
  /// The shared spares: at most `capacity` blocks under a spin lock held for a push or a pop.
  /// Never destroyed (states may be dropped during static destruction); what it holds at exit
  /// stays allocated, as reachable memory.
  struct spare_blocks {
    static constexpr int capacity = 256;
    spin_lock lock;
    int count = 0;
    void* block[capacity];
    void* pop() noexcept {
      const std::lock_guard<spin_lock> g(lock);
      return count > 0 ? block[--count] : nullptr;
    }
    bool push(void* p) noexcept {
      const std::lock_guard<spin_lock> g(lock);
      if (count == capacity) return false;
      block[count++] = p;
      return true;
    }
  };
  static inline thread_local constinit slots cache{{}, 0};
  static inline thread_local reaper guard;
  static inline constinit spare_blocks spares{};
};

/// The state a future shares with its completion handler.
template <class T>
class future_state {
 public:
  static constexpr std::uint32_t ready = 1;    // the outcome is written
  static constexpr std::uint32_t waiter = 2;   // a thread sleeps (or is about to) on `status`
  static constexpr std::uint32_t forward = 4;  // the outcome goes to `promise` (converted)

  std::atomic<std::uint32_t> status{0};

  static void* operator new(std::size_t n) {
    static_assert(alignof(future_state) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
    (void)n;  // always sizeof(future_state)
    return state_blocks<sizeof(future_state)>::take();
  }
  static void operator delete(void* p) noexcept { state_blocks<sizeof(future_state)>::give(p); }

  /// Writes the outcome (the value only on success) and publishes it.
  template <class... V>
  void complete(boost::system::error_code ec, V&&... v) {
    ec_ = ec;
    if constexpr (!std::is_void_v<T>) {
      if (!ec) value_.emplace(std::forward<V>(v)...);
    }
    publish();
  }
  /// Writes a failure with its values and publishes it.
  void fail(error e) {
    ec_ = to_error_code(e);
    error_ = std::make_unique<error>(std::move(e));
    publish();
  }
  /// The device that completes this future: waiting for it on that device's thread would never
  /// end.
  void completed_by(const void* device) noexcept { device_ = device; }
  /// The handler went away without completing: the future reports a broken promise.
  void abandon() noexcept {
    broken_ = true;
    publish();
  }
  /// Drops one of the two references (the future's, the handler's).
  void release() noexcept {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  [[nodiscard]] bool is_ready() const noexcept { return (status.load(std::memory_order_acquire) & ready) != 0; }

  /// Blocks until ready: polls first, then sleeps; with a timeout, false when it passed.
  bool wait(const std::chrono::nanoseconds* timeout) {
    if (is_ready()) return true;
    if (timeout != nullptr && timeout->count() <= 0) return false;  // a poll: no waiter announced
    if (device_ != nullptr && device_ == current_device) {
      // Only this thread can complete the future, and it would be asleep waiting for it.
      if (timeout != nullptr) return false;
      throw system_error(
          error::make(errc::would_deadlock, "a request of this device was waited for on the device's own thread"));
    }
    const auto start = std::chrono::steady_clock::now();
    const auto spin = timeout != nullptr
                          ? std::min<std::chrono::microseconds>(
                                future_spin, std::chrono::duration_cast<std::chrono::microseconds>(*timeout))
                          : future_spin;
    if (spin.count() > 0 && spin_until([this] { return is_ready(); }, spin)) return true;
    for (;;) {
      const std::uint32_t s = status.fetch_or(waiter, std::memory_order_acq_rel);
      if ((s & ready) != 0) return true;
      if (timeout == nullptr) {
        futex_wait(status, s | waiter, nullptr);
        continue;
      }
      const auto left = *timeout - (std::chrono::steady_clock::now() - start);
      if (left <= std::chrono::nanoseconds(0)) return is_ready();
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left);
      futex_wait(status, s | waiter, &ns);
    }
  }

  /// The outcome, once ready: the value, or throws what the operation failed with.
  T take() {
    if (broken_) throw std::future_error(std::future_errc::broken_promise);
    if (error_) throw system_error(*error_);
    if (ec_) throw boost::system::system_error(ec_);
    if constexpr (!std::is_void_v<T>) return std::move(*value_);
  }

  /// Hands the outcome to a std::promise, now or when it is published.
  void forward_to(std::promise<T> p) {
    promise_ = std::make_unique<std::promise<T>>(std::move(p));
    if ((status.fetch_or(forward, std::memory_order_acq_rel) & ready) != 0) deliver();
  }

 private:
  void publish() noexcept {
    const std::uint32_t s = status.fetch_or(ready, std::memory_order_acq_rel);
    if ((s & forward) != 0) deliver();
    if ((s & waiter) != 0) futex_wake_all(status);
  }
  void deliver() noexcept {
    try {
      if (broken_) {
        promise_->set_exception(std::make_exception_ptr(std::future_error(std::future_errc::broken_promise)));
      } else if (error_) {
        promise_->set_exception(std::make_exception_ptr(system_error(*error_)));
      } else if (ec_) {
        promise_->set_exception(std::make_exception_ptr(boost::system::system_error(ec_)));
      } else if constexpr (std::is_void_v<T>) {
        promise_->set_value();
      } else {
        promise_->set_value(std::move(*value_));
      }
    } catch (...) {
      // set_* throws only when the promise was satisfied already, which cannot happen here.
    }
  }

  std::atomic<std::uint32_t> refs_{2};
  boost::system::error_code ec_;
  std::unique_ptr<error> error_;  // a failure's values; allocated only on failure
  const void* device_ = nullptr;
  bool broken_ = false;
  std::optional<std::conditional_t<std::is_void_v<T>, no_value, T>> value_;
  std::unique_ptr<std::promise<T>> promise_;
};

/// The completion handler of a devrt future; the compute client calls it where the message runs
/// (the device thread, or the caller serving it in place).
template <class T>
class future_handler {
 public:
  explicit future_handler(future_state<T>* s) noexcept : s_(s) {}
  future_handler(future_handler&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  future_handler& operator=(future_handler&&) = delete;
  future_handler(const future_handler&) = delete;
  future_handler& operator=(const future_handler&) = delete;
  ~future_handler() {
    if (s_ != nullptr) {
      s_->abandon();
      s_->release();
    }
  }

  template <class... V>
  void operator()(boost::system::error_code ec, V&&... v) {
    future_state<T>* s = std::exchange(s_, nullptr);
    s->complete(ec, std::forward<V>(v)...);
    s->release();
  }
  /// Completes with a failure and its values (what the future's get throws).
  void fail(error e) {
    future_state<T>* s = std::exchange(s_, nullptr);
    s->fail(std::move(e));
    s->release();
  }
  void completed_by(const void* device) noexcept { s_->completed_by(device); }

 private:
  future_state<T>* s_;
};

template <class H>
struct is_future_handler : std::false_type {};
template <class T>
struct is_future_handler<future_handler<T>> : std::true_type {};
template <class H>
inline constexpr bool is_future_handler_v = is_future_handler<std::decay_t<H>>::value;

}  // namespace detail

/// The result of an operation completed with `use_future`. Move-only, like std::future.
template <class T>
class future {
 public:
  future() noexcept = default;
  /// Internal: adopts one reference to `s`.
  explicit future(detail::future_state<T>* s) noexcept : s_(s) {}
  future(future&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  future& operator=(future&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  future(const future&) = delete;
  future& operator=(const future&) = delete;
  ~future() { reset(); }

  /// Whether the future refers to a result (false after get and after a move).
  [[nodiscard]] bool valid() const noexcept { return s_ != nullptr; }

  /// Waits for the result (polling first) and returns it, or throws what the operation failed
  /// with (devrt::runtime::system_error carrying devrt's error). The future is then invalid.
  /// Throws std::future_error (no_state) on an invalid future.
  T get() {
    state().wait(nullptr);
    std::unique_ptr<detail::future_state<T>, releaser> s(std::exchange(s_, nullptr));
    return s->take();
  }
  /// Waits for the result, polling first.
  void wait() const { (void)state().wait(nullptr); }
  template <class Rep, class Period>
  std::future_status wait_for(const std::chrono::duration<Rep, Period>& rel) const {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(rel);
    return state().wait(&ns) ? std::future_status::ready : std::future_status::timeout;
  }
  template <class Clock, class Duration>
  std::future_status wait_until(const std::chrono::time_point<Clock, Duration>& at) const {
    return wait_for(at - Clock::now());
  }

  /// A std::future of the same result; this future becomes invalid.
  operator std::future<T>() && {  // NOLINT(google-explicit-constructor): as std::future is used
    if (s_ == nullptr) return {};
    std::promise<T> p;
    std::future<T> f = p.get_future();
    std::unique_ptr<detail::future_state<T>, releaser> s(std::exchange(s_, nullptr));
    s->forward_to(std::move(p));
    return f;
  }

 private:
  struct releaser {
    void operator()(detail::future_state<T>* s) const noexcept { s->release(); }
  };
  detail::future_state<T>& state() const {
    if (s_ == nullptr) throw std::future_error(std::future_errc::no_state);
    return *s_;
  }
  void reset() noexcept {
    if (s_ != nullptr) std::exchange(s_, nullptr)->release();
  }

  detail::future_state<T>* s_ = nullptr;
};

namespace detail {
template <class... Args>
struct future_value {
  using type = void;
};
template <class A>
struct future_value<A> {
  using type = std::decay_t<A>;
};
}  // namespace detail

}  // namespace devrt::runtime

template <class... Args>
struct boost::asio::async_result<devrt::runtime::use_future_t, void(boost::system::error_code, Args...)> {
  using value_type = typename devrt::runtime::detail::future_value<Args...>::type;

  template <class Initiation, class... InitArgs>
  static devrt::runtime::future<value_type> initiate(Initiation&& init, devrt::runtime::use_future_t /*token*/,
                                                     InitArgs&&... args) {
    auto* s = new devrt::runtime::detail::future_state<value_type>();
    devrt::runtime::future<value_type> f(s);
    std::forward<Initiation>(init)(devrt::runtime::detail::future_handler<value_type>(s),
                                   std::forward<InitArgs>(args)...);
    return f;
  }
};
