// Helpers shared by the runtime tests.
#pragma once

#include <gtest/gtest.h>

#include <boost/system/system_error.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "devrt/runtime/runtime.hpp"

namespace devrt_test {

/// Options independent of the environment the tests run in.
inline devrt::runtime::runtime_options quiet_options() {
  devrt::runtime::runtime_options o;
  o.use_environment = false;
  o.use_cuda = false;
  // The runtime tests count pages and rely on the largest sliced page (1 GiB on the host): they
  // use the sub-slices layout rather than the default arena.
  o.host_layout = devrt::memory::preset::sub_slices;
  o.sim_layout = devrt::memory::preset::sub_slices;
  return o;
}

/// What a future-based operation failed with: the code and the exception's what().
struct failure {
  boost::system::error_code code;
  std::string what;
  bool threw_other = false;  ///< something other than system_error was thrown
  std::string other;
};

template <class Future>
failure failure_of(Future&& f) {
  failure out;
  try {
    f.get();
  } catch (const boost::system::system_error& e) {
    out.code = e.code();
    out.what = e.what();
  } catch (const std::exception& e) {
    out.threw_other = true;
    out.other = e.what();
  }
  return out;
}

/// A byte pattern derived from an allocation's identity.
inline std::byte pattern_byte(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + i * 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 29;
  return static_cast<std::byte>(x & 0xff);
}

inline std::vector<std::byte> pattern(std::uint64_t seed, std::size_t n) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = pattern_byte(seed, i);
  return v;
}

/// Waits until `pred()` holds or `timeout` passes; returns whether it held.
template <class Pred>
bool wait_until(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace devrt_test
