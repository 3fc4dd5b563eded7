// What devrt-inspect knows: which request sizes each pool of a resolved layout serves, how a pool
// is described, and what to change when a layout or a config file is invalid.
//
// Everything that depends on the kind of a pool lives in `describe_pool` (one switch over
// `pool_kind`); the tables, the JSON and the range computations work on its result only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "devrt/memory/config.hpp"
#include "devrt/memory/error.hpp"
#include "devrt/memory/storage.hpp"

namespace devrt::inspect {

/// Request sizes `lo` to `hi`, both included.
struct size_range {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;
  friend bool operator==(const size_range&, const size_range&) = default;
};

/// A set of sizes: sorted, disjoint ranges that do not touch.
using size_set = std::vector<size_range>;

/// The sizes in `a` that are not in `b`.
size_set subtract(const size_set& a, const size_set& b);
/// The sizes in `a` or in `b`.
size_set unite(const size_set& a, const size_set& b);

/// One pool as the tool shows it.
struct pool_description {
  std::string kind;                        ///< "sliced", "exclusive", or "kind N" for a kind the tool does not know
  std::optional<std::uint64_t> page_size;  ///< bytes per page, when the pool has fixed pages
  std::uint64_t max_size = 0;              ///< largest slice (sliced) or allocation (exclusive)
  std::optional<std::uint64_t> cap;        ///< most bytes the pool holds
  std::optional<std::uint64_t> max_pages;  ///< pages the cap allows
  std::optional<std::uint64_t> dealloc_period;  ///< reserves between releases of idle pages
  std::optional<size_set> accepts;              ///< sizes the pool accepts; empty optional: not known
  std::string note;                             ///< what else the pool does with a request
};

/// How a pool of `kind` is described. Add a case here for a new pool kind.
pool_description describe_pool(const memory::pool_options& pool);

/// How much free memory an arena pool keeps mapped, in the words of the arena's own report
/// (`memory_manager::report`, "free memory kept ..."): "up to SLACK" with a slack, "within 1.04x
/// the peak of live bytes" with the growth policy (the default), "until needed elsewhere" with
/// `grow=0`.
std::string arena_free_memory_rule(const memory::pool_options& pool);

/// Largest request the device accepts at all (its capacity when known).
std::uint64_t largest_request(const memory::device_properties& props);

/// A resolved layout with what each pool serves in routing order.
struct layout_report {
  std::vector<memory::pool_options> pools;
  std::vector<pool_description> described;
  /// Sizes each pool serves: those it accepts that no earlier pool accepts, up to largest_request.
  /// Empty optional where the pool's accepted sizes are not known.
  std::vector<std::optional<size_set>> serves;
  size_set unserved;                  ///< sizes up to largest_request that no pool accepts
  std::uint64_t largest_request = 0;  ///< larger requests are refused before routing
  bool exact = true;                  ///< false when a pool of an unknown kind was left out
};

layout_report report_layout(const std::vector<memory::pool_options>& pools, const memory::device_properties& props);

/// What to change to fix the error, or "" when there is nothing more to say than its message.
/// `pool` is the pool the error is about (for values taken from it), when known.
std::string fix_hint(const error& e, const memory::device_properties& props,
                     const std::optional<memory::pool_config>& pool = std::nullopt);

/// The index of the pool a layout validation error is about ("pool 3" in its text).
std::optional<std::size_t> error_pool_index(const error& e);

/// A size in the form layout strings take ("64MiB", "4096").
std::string layout_size(std::uint64_t bytes);

/// A size for people: "64 MiB" when exact, "34.95 GiB" otherwise, "512 B" below 1 KiB; with
/// `exact_bytes`, the number of bytes.
std::string size_text(std::uint64_t bytes, bool exact_bytes = false);

/// A range of sizes: "8 MiB", "[0 B, 8 MiB]" or "(8 MiB, 32 MiB]".
std::string range_text(const size_range& r, bool exact_bytes = false);

}  // namespace devrt::inspect
