// Pool layouts: presets, explicit pool lists, their validation, and the text forms used by tools
// and configuration (human sizes such as "64MiB", layout strings, policy names).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "devrt/memory/error.hpp"
#include "devrt/memory/storage.hpp"

namespace devrt::memory {

/// Most dynamic pools a layout may have (the persistent pool uses index 255).
inline constexpr std::size_t max_dynamic_pools = 254;
/// `max_alloc_size` of a pool that takes any size.
inline constexpr std::uint64_t no_size_limit = UINT64_MAX;
/// Most pages a capped sliced pool may hold.
inline constexpr std::uint64_t max_pages_per_pool = 65535;

/// One pool of a layout as the user writes it; sizes are rounded up to the device alignment when
/// the layout is resolved.
struct exclusive_pool_config {
  std::uint64_t max_alloc_size = 0;             ///< largest size the pool accepts (0: only size 0)
  std::optional<std::uint64_t> dealloc_period;  ///< reserves between checks for unused pages
  friend bool operator==(const exclusive_pool_config&, const exclusive_pool_config&) = default;
};

struct sliced_pool_config {
  std::uint64_t page_size = 0;
  std::optional<std::uint64_t> max_slice_size;  ///< default: the page size
  std::optional<std::uint64_t> max_pool_size;   ///< cap in bytes (whole pages); default: none
  std::optional<std::uint64_t> dealloc_period;  ///< reserves between releases of idle free pages
  friend bool operator==(const sliced_pool_config&, const sliced_pool_config&) = default;
};

/// An arena: one reserved address range where allocations are placed best fit and free neighbours
/// coalesce; memory is mapped behind the range only where live allocations are, granule by granule,
/// so the holes between allocations hold no memory. Needs a device with a map granularity.
struct arena_pool_config {
  std::optional<std::uint64_t> granule;         ///< bytes mapped at a time; default: the device's granularity
  std::optional<std::uint64_t> max_alloc_size;  ///< largest request; default: no limit
  std::optional<std::uint64_t> address_space;   ///< addresses reserved; default: four times the device memory
  /// Largest mapping (a multiple of the granule); default: 32 MiB (at least one granule).
  std::optional<std::uint64_t> chunk;
  /// Free bytes kept mapped at most; default: free memory stays mapped until memory is needed
  /// elsewhere in the arena (the memory held never exceeds the peak the allocations touched).
  std::optional<std::uint64_t> slack;
  /// Largest mapping where the arena grows (a multiple of the chunk). When set, mappings at the
  /// growing end are made in units that grow with the memory mapped (from the chunk up to this),
  /// reaching past the slice into the free end of the arena, and free memory stays mapped while
  /// the memory mapped stays within 1.04 times the peak of live bytes (largest free mappings are
  /// unmapped first to stay inside it). Default: 256 MiB (at least the chunk); 0 turns it off:
  /// mappings of at most a chunk, under the slices only, and free memory unmapped, oldest first,
  /// as soon as memory is mapped elsewhere.
  std::optional<std::uint64_t> grow;
  friend bool operator==(const arena_pool_config&, const arena_pool_config&) = default;
};

using pool_config = std::variant<exclusive_pool_config, sliced_pool_config, arena_pool_config>;

/// Built-in layouts computed from the device properties.
enum class preset {
  automatic,        ///< `arena` on devices that map memory, `sub_slices` on the others (the default)
  sub_slices,       ///< a ladder of sliced pools of growing page size
  exclusive_pages,  ///< log-spaced exclusive buckets, one allocation per page
  arena             ///< a single arena pool for every size (devices that map memory only)
};

/// A layout: a preset or an explicit list of pools in routing order.
struct memory_layout {
  std::variant<preset, std::vector<pool_config>> value = preset::automatic;

  memory_layout() = default;
  memory_layout(preset p) : value(p) {}                                       // NOLINT(google-explicit-constructor)
  memory_layout(std::vector<pool_config> pools) : value(std::move(pools)) {}  // NOLINT
};

/// A validated pool, with sizes aligned to the device. This is what the pools are built from.
enum class pool_kind : std::uint8_t { sliced, exclusive, arena };

struct pool_options {
  pool_kind kind = pool_kind::sliced;
  std::uint64_t page_size = 0;                 ///< sliced: bytes per page; arena: the granule
  std::uint64_t max_alloc_size = 0;            ///< sliced: largest slice; exclusive, arena: largest allocation
  std::optional<std::uint64_t> max_pool_size;  ///< sliced: cap; arena: the address space
  std::optional<std::uint64_t> dealloc_period;
  std::optional<std::uint64_t> slack;  ///< arena: free bytes kept mapped at most (default: see arena_pool_config)
  std::optional<std::uint64_t> chunk;  ///< arena: largest mapping, a multiple of the granule
  std::optional<std::uint64_t> grow;   ///< arena: largest mapping where it grows (see arena_pool_config)
  friend bool operator==(const pool_options&, const pool_options&) = default;
};

/// Resolves a layout against a device, validating every explicit pool. Errors:
/// empty_pool_list, too_many_pools, zero_size (detail names the field), slice_larger_than_page,
/// cap_smaller_than_page, too_many_pages, mapping_unsupported (an arena, or the arena preset, on a
/// device whose map granularity is 0).
result<std::vector<pool_options>> resolve_layout(const memory_layout& layout, const device_properties& props);

/// The pools of a preset for a device.
std::vector<pool_options> preset_pools(preset p, const device_properties& props);

/// Policy for the persistent pool.
enum class persistent_policy {
  enabled,     ///< persistent only when asked for (mode or a persistent scope)
  size_match,  ///< also serve reserves whose aligned size already has a persistent slice
  disabled,    ///< mode changes are ignored (a capture still forces persistent)
  enforced     ///< everything is persistent; mode changes are ignored
};

/// Allocation mode of a manager.
enum class allocation_mode { automatic, persistent };

// ---- Text forms ----

/// Parses a size: an integer number of bytes ("4096"), or a number with a binary unit
/// (B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB, case-insensitive), fractions allowed with a unit
/// ("1.5GiB", rounded down), `_` as a digit separator, spaces around. Error: malformed_size.
result<std::uint64_t> parse_size(std::string_view text);

/// Formats bytes with a binary unit ("512 B", "1.50 KiB", "64.00 MiB").
std::string format_bytes(std::uint64_t bytes);

/// Parses a layout string:
///   "auto" | "sub-slices" | "exclusive-pages" | "arena"     a preset
///   "arena:granule=2MiB,chunk=32MiB,max=1GiB,space=256GiB,slack=64MiB,grow=256MiB"   an arena (keys optional)
///   "sliced:page=64MiB,slice=8MiB,cap=1GiB,period=1000;exclusive:max=1MiB,period=5000"
/// Pools are separated by ';' and routed in that order. Error: malformed_layout, malformed_size.
/// The result is not validated yet: pass it to resolve_layout.
result<memory_layout> parse_layout(std::string_view text);

/// The layout in the form parse_layout reads.
std::string to_string(const memory_layout& layout);

result<persistent_policy> parse_persistent_policy(std::string_view text);
const char* to_string(persistent_policy p) noexcept;
const char* to_string(preset p) noexcept;

}  // namespace devrt::memory
