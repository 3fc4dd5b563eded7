// Short waits without sleeping: polling with a deadline, and a lock for tiny critical sections.
//
// Both give the core away (std::this_thread::yield) once a wait lasts more than a few
// microseconds, so that threads outnumbering cores, as on small CI machines, still progress.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>

namespace devrt::runtime {

namespace detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// How long `spin_until` polls before it starts giving the core away between polls: a
/// sched_yield is a system call, too slow a step while an answer is due within a few microseconds.
inline constexpr std::chrono::microseconds pure_spin{8};

/// Polls `ready()` until it returns true (then returns true) or `limit` has passed (false).
/// Yields the core between polls after the first `pure_spin`.
template <class Ready>
bool spin_until(Ready&& ready, std::chrono::microseconds limit) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  for (unsigned i = 0;; ++i) {
    if (ready()) return true;
    if ((i & 15U) != 15U) {
      cpu_relax();
      continue;
    }
    const auto waited = clock::now() - start;
    if (waited >= limit) return false;
    if (waited >= pure_spin) std::this_thread::yield();
  }
}

}  // namespace detail

/// A test-and-test-and-set lock for critical sections of a few dozen instructions: under many
/// threads it hands over in a cache-line transfer where a mutex would put them to sleep.
class spin_lock {
 public:
  void lock() noexcept {
    for (unsigned i = 0;; ++i) {
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
      while (locked_.load(std::memory_order_relaxed)) {
        if (++i < 64) {
          detail::cpu_relax();
        } else {
          std::this_thread::yield();
        }
      }
    }
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace devrt::runtime
