// Tags: names a client gives to allocations ("weights", "kv_cache"), and the memory that sleeps.
//
// A tagged allocation is served by its tag's own arena (one address range per tag and device), so
// the memory of one tag never shares a mapping with another's. That is what lets a tag *sleep*:
// its physical memory goes back to the device while every allocation keeps its address, and a
// *wake* maps new memory at the same addresses (restoring the contents when they were kept).
// Handles, pointers, tensors and CUDA graphs captured over the memory stay valid across the two.
//
// Where the device cannot map memory into address ranges, tags only label allocations (counted in
// the statistics) and sleep fails with `unsupported`. While a capture window is open, a tagged
// reserve goes to the persistent pool like any other (the graph pins exactly what it uses); such
// memory does not sleep.
//
// States of a tag (`tag_state`), per device:
// - awake: reserves are served; the arena's mappings are all mapped.
// - asleep: the mappings under live allocations are unmapped (their addresses stay reserved);
//   reserves with the tag fail with `asleep`; frees are allowed and give the address range back to
//   the arena (no driver call); with contents kept, a host copy of every live allocation is held.
// Sleep of a sleeping tag and wake of an awake one change nothing.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "devrt/memory/error.hpp"

namespace devrt::memory {

/// A tag: at most 63 printable ASCII bytes, held inline (copying one allocates nothing). Empty: no
/// tag.
class tag_name {
 public:
  static constexpr std::size_t max_length = 63;
  constexpr tag_name() noexcept = default;
  /// Throws devrt::exception (invalid_argument) where `make` fails.
  explicit tag_name(std::string_view text);
  /// Error invalid_argument: longer than 63 bytes, or a byte outside printable ASCII (0x20-0x7e).
  static result<tag_name> make(std::string_view text);
  [[nodiscard]] std::string_view view() const noexcept { return {bytes_.data(), length_}; }
  [[nodiscard]] const char* c_str() const noexcept { return bytes_.data(); }
  [[nodiscard]] bool empty() const noexcept { return length_ == 0; }
  [[nodiscard]] std::size_t size() const noexcept { return length_; }
  friend bool operator==(const tag_name& a, const tag_name& b) noexcept {
    return a.length_ == b.length_ && std::memcmp(a.bytes_.data(), b.bytes_.data(), a.length_) == 0;
  }

 private:
  std::array<char, max_length + 1> bytes_{};
  std::uint8_t length_ = 0;
};

/// The process's number for a tag, the same on every device (0: no tag).
using tag_id = std::uint16_t;
/// Most distinct tags a process may use.
inline constexpr std::size_t max_tags = 255;
/// The number of `tag` (0 for an empty one), registered on its first use; lock-free once known.
/// Error invalid_argument when `max_tags` distinct tags are registered already.
result<tag_id> intern_tag(const tag_name& tag);
/// The tag of number `id` (empty for 0 or an unknown number). Any thread.
const tag_name& tag_of(tag_id id) noexcept;

enum class tag_state : std::uint8_t {
  awake,   ///< its memory is mapped; reserves are served
  asleep,  ///< its live allocations have no physical memory; reserves with it fail (`asleep`)
};
const char* to_string(tag_state s) noexcept;

/// What one tag holds on a device (memory_manager::tags).
struct tag_usage {
  std::string name;
  tag_state state = tag_state::awake;
  bool contents_kept = false;         ///< asleep with a host copy of its allocations
  std::uint64_t bytes_in_use = 0;     ///< requested bytes of its live allocations
  std::uint64_t allocations = 0;      ///< its live allocations
  std::uint64_t bytes_reserved = 0;   ///< memory its arena holds mapped now
  std::uint64_t bytes_sleeping = 0;   ///< memory unmapped by its sleep, mapped again by its wake
  std::uint64_t bytes_offloaded = 0;  ///< host memory holding its kept contents
  std::uint64_t sleeps = 0;           ///< sleeps done
  std::uint64_t wakes = 0;            ///< wakes done
};

}  // namespace devrt::memory
