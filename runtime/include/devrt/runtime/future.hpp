// The default completion of the compute client: a std::future whose wait first polls for a few
// microseconds before it sleeps.
//
// A memory message is served in well under a microsecond once the device thread has it, while a
// thread asleep on a futex takes several microseconds to be woken (more on servers whose idle
// cores sleep deeply). So `get()` and `wait()` poll the shared state for up to `future_spin`
// (yielding the core between polls after the first 8 µs, so that threads outnumbering
// cores still make progress) and only then block.
//
//     devrt::runtime::future<memory_handle> f = client.reserve(1 << 20);   // the default token
//     std::future<memory_handle> g = client.reserve(1 << 20);              // converts to std::future
//     auto h = client.reserve(1 << 20, boost::asio::use_future).get();     // Asio's, blocks at once
#pragma once

#include <boost/asio/async_result.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/system/error_code.hpp>
#include <chrono>
#include <future>
#include <utility>

#include "devrt/runtime/spin.hpp"

namespace devrt::runtime {

/// The completion token that makes an operation return a `devrt::runtime::future`.
struct use_future_t {};
inline constexpr use_future_t use_future{};

/// How long `future::get` and `future::wait` poll before they block.
inline constexpr std::chrono::microseconds future_spin{20};

/// A std::future that polls briefly before it blocks. Converts to std::future (moving).
template <class T>
class future : public std::future<T> {
 public:
  future() noexcept = default;
  explicit future(std::future<T>&& f) noexcept : std::future<T>(std::move(f)) {}

  /// Waits for the result (polling first) and returns it, or throws what the operation failed
  /// with (boost::system::system_error carrying devrt's error).
  decltype(auto) get() {
    spin();
    return std::future<T>::get();
  }
  /// Waits for the result, polling first.
  void wait() const {
    spin();
    std::future<T>::wait();
  }

 private:
  void spin() const {
    if (!this->valid()) return;  // std::future reports the error
    detail::spin_until([this] { return this->wait_for(std::chrono::seconds(0)) == std::future_status::ready; },
                       future_spin);
  }
};

namespace detail {
template <class T>
future<T> wrap_future(std::future<T>&& f) noexcept {
  return future<T>(std::move(f));
}
}  // namespace detail

}  // namespace devrt::runtime

template <class... Args>
struct boost::asio::async_result<devrt::runtime::use_future_t, void(boost::system::error_code, Args...)> {
  template <class Initiation, class... InitArgs>
  static auto initiate(Initiation&& init, devrt::runtime::use_future_t /*token*/, InitArgs&&... args) {
    return devrt::runtime::detail::wrap_future(
        boost::asio::async_initiate<const boost::asio::use_future_t<>&, void(boost::system::error_code, Args...)>(
            std::forward<Initiation>(init), boost::asio::use_future, std::forward<InitArgs>(args)...));
  }
};
