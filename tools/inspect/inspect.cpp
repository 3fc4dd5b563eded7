#include "inspect/inspect.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <string_view>
#include <variant>

#include "devrt/memory/memory_manager.hpp"

namespace devrt::inspect {

namespace {

constexpr std::uint64_t kib = 1024;

std::uint64_t round_up(std::uint64_t n, std::uint64_t align) {
  if (align <= 1) return n;
  const std::uint64_t r = n % align;
  return r == 0 ? n : n + (align - r);
}

/// Sorts the ranges and merges those that overlap or touch.
size_set normalized(size_set s) {
  std::sort(s.begin(), s.end(), [](const size_range& a, const size_range& b) { return a.lo < b.lo; });
  size_set out;
  for (const size_range& r : s) {
    if (r.lo > r.hi) continue;
    if (!out.empty()) {
      size_range& last = out.back();
      // Overlapping, or adjacent (written so that hi == UINT64_MAX cannot overflow).
      if (r.lo <= last.hi || r.lo - last.hi == 1) {
        last.hi = std::max(last.hi, r.hi);
        continue;
      }
    }
    out.push_back(r);
  }
  return out;
}

/// The layout-string name of a field that a zero_size error names.
std::string_view layout_key(std::string_view field) {
  if (field == "page_size") return "page";
  if (field == "max_slice_size") return "slice";
  if (field == "max_pool_size") return "cap";
  if (field == "dealloc_period") return "period";
  if (field == "max_alloc_size") return "max";
  return field;
}

}  // namespace

size_set subtract(const size_set& a, const size_set& b) {
  const size_set cut = normalized(b);
  size_set out;
  for (const size_range& r : normalized(a)) {
    std::uint64_t lo = r.lo;
    bool consumed = false;
    for (const size_range& c : cut) {
      if (c.hi < lo) continue;
      if (c.lo > r.hi) break;
      if (c.lo > lo) out.push_back({lo, c.lo - 1});
      if (c.hi >= r.hi) {
        consumed = true;
        break;
      }
      lo = c.hi + 1;
    }
    if (!consumed) out.push_back({lo, r.hi});
  }
  return out;
}

size_set unite(const size_set& a, const size_set& b) {
  size_set all = a;
  all.insert(all.end(), b.begin(), b.end());
  return normalized(std::move(all));
}

pool_description describe_pool(const memory::pool_options& pool) {
  pool_description d;
  d.max_size = pool.max_alloc_size;
  d.dealloc_period = pool.dealloc_period;
  switch (pool.kind) {
    case memory::pool_kind::sliced: {
      // As the sliced pool reads its options: a slice is at most a page, 0 means a whole page.
      const std::uint64_t page = pool.page_size;
      const std::uint64_t slice = std::min(pool.max_alloc_size == 0 ? page : pool.max_alloc_size, page);
      d.kind = "sliced";
      d.page_size = page;
      d.max_size = slice;
      d.cap = pool.max_pool_size;
      if (pool.max_pool_size && page != 0) {
        d.max_pages = std::min(*pool.max_pool_size / page, memory::max_pages_per_pool);
      }
      size_set accepts{{0, slice}};
      if (!pool.max_pool_size && page > slice) {
        // (page - size) * 5 < page: the request fills more than four fifths of a page.
        accepts = unite(accepts, {{page - (page - 1) / 5, page}});
        d.note =
            "an uncapped sliced pool also accepts a request larger than its max slice when the request fills more "
            "than four fifths of a page";
      }
      d.accepts = accepts;
      break;
    }
    case memory::pool_kind::exclusive:
      d.kind = "exclusive";
      d.accepts = size_set{{0, pool.max_alloc_size}};
      d.note = "an exclusive pool gives each allocation a page of its own, sized from the requests it has seen";
      break;
    case memory::pool_kind::arena: {
      const std::uint64_t space = pool.max_pool_size.value_or(0);
      d.kind = "arena";
      d.page_size = pool.page_size;  // the granule
      d.max_size = std::min(pool.max_alloc_size, space);
      d.cap = space;
      d.accepts = size_set{{0, d.max_size}};
      // What happens to free memory, as arena_pool.cpp does it: with `grow` (the default) a reserve
      // that must map memory first unmaps free mappings, largest first, past the budget; with
      // grow=0 as many free mappings as it maps, oldest first; a slack unmaps, oldest first, what
      // is free beyond it as soon as it is freed; an explicit cleanup unmaps every free mapping.
      std::string when_mapping =
          pool.grow ? "a reserve that must map memory first unmaps free mappings, largest first, until the memory "
                      "mapped fits the budget"
                    : "a reserve that must map memory first unmaps as much free memory elsewhere, oldest first";
      if (pool.slack) {
        when_mapping += fmt::format("; free memory beyond {} is unmapped, oldest first, as soon as it is freed",
                                    memory::format_bytes(*pool.slack));
      }
      d.note = fmt::format(
          "an arena places every allocation best fit in one address range of {} and maps memory only under live "
          "allocations, in granules of {} and mappings of at most {}; free memory stays mapped {} ({}); an "
          "explicit cleanup unmaps all of it",
          memory::format_bytes(space), memory::format_bytes(pool.page_size),
          memory::format_bytes(pool.chunk.value_or(pool.page_size)), arena_free_memory_rule(pool), when_mapping);
      break;
    }
    default:
      // A kind this tool does not describe yet: its sizes are shown as they are and what it
      // accepts is left unknown.
      d.kind = fmt::format("kind {}", static_cast<unsigned>(pool.kind));
      if (pool.page_size != 0) d.page_size = pool.page_size;
      d.cap = pool.max_pool_size;
      break;
  }
  return d;
}

std::string arena_free_memory_rule(const memory::pool_options& pool) {
  // The order of arena_pool::report: a slack first, then the growth policy.
  if (pool.slack) return "up to " + memory::format_bytes(*pool.slack);
  if (pool.grow) {
    return "within 1.10x the peak of live bytes (up to 2.00x where the workload churns) or the most it held far from "
           "the budget, 1.04x near it";
  }
  return "until needed elsewhere";
}

std::uint64_t largest_request(const memory::device_properties& props) {
  return props.capacity != 0 ? props.capacity : memory::memory_manager::max_reserve_size;
}

layout_report report_layout(const std::vector<memory::pool_options>& pools, const memory::device_properties& props) {
  layout_report r;
  r.pools = pools;
  r.largest_request = largest_request(props);
  const size_set requests{{0, r.largest_request}};
  size_set taken;
  for (const memory::pool_options& p : pools) {
    pool_description d = describe_pool(p);
    if (d.accepts) {
      r.serves.emplace_back(subtract(subtract(*d.accepts, taken), subtract({{0, UINT64_MAX}}, requests)));
      taken = unite(taken, *d.accepts);
    } else {
      r.serves.emplace_back(std::nullopt);
      r.exact = false;
    }
    r.described.push_back(std::move(d));
  }
  r.unserved = subtract(requests, taken);
  return r;
}

std::optional<std::size_t> error_pool_index(const error& e) {
  constexpr std::string_view prefix = "pool ";
  const std::string_view t = e.text;
  if (!t.starts_with(prefix)) return std::nullopt;
  std::size_t index = 0;
  const char* first = t.data() + prefix.size();
  const char* last = t.data() + t.size();
  const auto [p, ec] = std::from_chars(first, last, index);
  if (ec != std::errc() || p != last || p == first) return std::nullopt;
  return index;
}

std::string fix_hint(const error& e, const memory::device_properties& props,
                     const std::optional<memory::pool_config>& pool) {
  const std::uint64_t align = std::max<std::uint64_t>(props.alignment, 1);
  const auto* sliced = pool ? std::get_if<memory::sliced_pool_config>(&*pool) : nullptr;
  switch (e.code) {
    case errc::empty_pool_list:
      return "give at least one pool, such as sliced:page=64MiB, or name a preset such as sub-slices";
    case errc::too_many_pools:
      return fmt::format("a layout has at most {} pools: merge pools of similar sizes, or use a preset", e.limit);
    case errc::zero_size: {
      const std::string_view key = layout_key(e.detail);
      if (key == "page") return "give the pool a page size above zero, such as page=64MiB";
      return fmt::format("set {0}= above zero, or leave {0}= out (it is optional)", key);
    }
    case errc::slice_larger_than_page:
      if (e.detail[0] == '\0' || std::string_view(e.detail) == "max_slice_size") {
        return fmt::format(
            "slice larger than page: make max slice <= page size (slice={} or less) or raise the page size "
            "(page={} or more)",
            layout_size(e.limit), layout_size(e.size));
      }
      if (std::string_view(e.detail) == "page_size") {
        return fmt::format("a page is allocated whole: make it no larger than the device (page={} or less)",
                           layout_size(e.limit));
      }
      return fmt::format("lower {} to at most {} bytes, or raise the limit it is checked against", e.detail, e.limit);
    case errc::cap_smaller_than_page: {
      const std::uint64_t page_fits = e.size / align * align;
      std::string hint = fmt::format(
          "a capped pool holds whole pages: raise the cap to at least one page (cap={} or more)", layout_size(e.limit));
      if (page_fits != 0)
        hint += fmt::format(" or lower the page size to the cap (page={} or less)", layout_size(page_fits));
      return hint;
    }
    case errc::too_many_pages:
      if (sliced != nullptr && sliced->max_pool_size && e.limit != 0) {
        const std::uint64_t cap = *sliced->max_pool_size;
        const std::uint64_t page = round_up(sliced->page_size, align);
        // The smallest page for which cap / page <= limit, and a rounder one when it is not round.
        const std::uint64_t min_page = round_up(cap / (e.limit + 1) + 1, align);
        std::string page_text = fmt::format("page={} or more", layout_size(min_page));
        if (layout_size(min_page) == std::to_string(min_page)) {
          page_text += fmt::format(", such as page={}", layout_size(std::bit_ceil(min_page)));
        }
        return fmt::format(
            "a capped pool holds at most {} pages: raise the page size ({}) or lower the cap (cap={} or less)", e.limit,
            page_text, layout_size(page * e.limit));
      }
      return fmt::format("a capped pool holds at most {} pages: raise the page size or lower the cap", e.limit);
    case errc::malformed_size:
      return "write a size as a number of bytes or a number with a binary unit: 4096, 64MiB, 1.5GiB";
    case errc::malformed_layout:
      return "write pools as KIND:key=value,... separated by ';' (such as sliced:page=64MiB,slice=8MiB;"
             "exclusive:max=1MiB), or name a preset such as sub-slices";
    case errc::malformed_config:
      return "a config file has one `key = value` per line: persistent_memory = enabled | size-match | disabled | "
             "enforced, log_level = disabled | basic | full; '#' starts a comment";
    default: return {};
  }
}

std::string layout_size(std::uint64_t bytes) {
  static constexpr const char* units[] = {"TiB", "GiB", "MiB", "KiB"};
  std::uint64_t unit = kib * kib * kib * kib;
  for (const char* name : units) {
    if (bytes != 0 && bytes % unit == 0) return fmt::format("{}{}", bytes / unit, name);
    unit /= kib;
  }
  return std::to_string(bytes);
}

std::string size_text(std::uint64_t bytes, bool exact_bytes) {
  if (exact_bytes) return std::to_string(bytes);
  if (bytes < kib) return fmt::format("{} B", bytes);
  static constexpr const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::uint64_t unit = kib;
  std::size_t u = 0;
  while (u + 1 < std::size(units) && bytes / unit >= kib) {
    unit *= kib;
    ++u;
  }
  if (bytes % unit == 0) return fmt::format("{} {}", bytes / unit, units[u]);
  return fmt::format("{:.2f} {}", static_cast<double>(bytes) / static_cast<double>(unit), units[u]);
}

std::string range_text(const size_range& r, bool exact_bytes) {
  if (r.lo == r.hi) return size_text(r.lo, exact_bytes);
  if (r.lo == 0) return fmt::format("[{}, {}]", size_text(0, exact_bytes), size_text(r.hi, exact_bytes));
  return fmt::format("({}, {}]", size_text(r.lo - 1, exact_bytes), size_text(r.hi, exact_bytes));
}

}  // namespace devrt::inspect
