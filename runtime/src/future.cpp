#include "devrt/runtime/future.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ctime>

namespace devrt::runtime::detail {

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) &&
                  std::atomic<std::uint32_t>::is_always_lock_free,
              "a futex word is a plain 32-bit integer");

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                const std::chrono::nanoseconds* timeout) noexcept {
  timespec ts{};
  if (timeout != nullptr) {
    ts.tv_sec = static_cast<std::time_t>(timeout->count() / 1'000'000'000);
    ts.tv_nsec = static_cast<long>(timeout->count() % 1'000'000'000);
  }
  // A relative timeout; EAGAIN (the word changed), EINTR and ETIMEDOUT all return to the caller,
  // which checks the word again.
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-vararg)
  (void)syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected,
                timeout != nullptr ? &ts : nullptr, nullptr, 0);
}

void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept {
  // NOLINTNEXTLINE(cppcoreguidelines-pro-type-vararg)
  (void)syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

}  // namespace devrt::runtime::detail
