#include "devrt/memory/config.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <initializer_list>
#include <optional>

#include "devrt/memory/pool_context.hpp"

namespace devrt::memory {

namespace {

constexpr std::uint64_t kib = 1024;
constexpr std::uint64_t mib = kib * 1024;
constexpr std::uint64_t gib = mib * 1024;
constexpr std::uint64_t tib = gib * 1024;

error layout_error(errc c, std::size_t pool, const char* detail = "") {
  error e = error::make(c, detail);
  e.text = fmt::format("pool {}", pool);
  return e;
}

// Sizes of a layout are at most 2^62 bytes, so that aligning them can never wrap around.
constexpr std::uint64_t max_layout_size = std::uint64_t{1} << 62;

error size_too_large(std::size_t pool, const char* field, std::uint64_t value) {
  error e = error::make(errc::malformed_size, "a size in a layout is at most 2^62 bytes");
  e.text = fmt::format("pool {}: {} = {}", pool, field, value);
  e.size = value;
  e.limit = max_layout_size;
  return e;
}

// The first size of `fields` above max_layout_size, as an error.
std::optional<error> check_sizes(std::size_t pool,
                                 std::initializer_list<std::pair<const char*, std::optional<std::uint64_t>>> fields) {
  for (const auto& [name, v] : fields) {
    if (v && *v > max_layout_size) return size_too_large(pool, name, *v);
  }
  return std::nullopt;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())) != 0) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

std::vector<pool_options> sub_slices(const device_properties& props) {
  const std::uint64_t align = std::max<std::uint64_t>(props.alignment, 1);
  // No page larger than the device: a page is allocated whole.
  const std::uint64_t largest =
      props.capacity != 0 ? std::min(props.max_page_size, props.capacity / align * align) : props.max_page_size;
  const std::uint64_t max_page = std::max(largest, align);
  std::vector<pool_options> pools;
  // Zero-size allocations get an exclusive pool of their own.
  pools.push_back(pool_options{pool_kind::exclusive, 0, 0, std::nullopt, std::nullopt});
  // A ladder of pages, each a quarter of the next, whose slices are capped at a shrinking
  // fraction of the page: small requests stay on small pages.
  std::vector<pool_options> ladder;
  std::uint64_t current = max_page;
  unsigned base = 1;
  while (current >= 32 * mib) {
    // A page can shrink no further than the alignment: a large alignment ends the ladder.
    const std::uint64_t next = align_up(current / 4, align);
    if (next >= current) break;
    current = next;
    ladder.push_back(pool_options{pool_kind::sliced, current, current >> base, std::nullopt, std::nullopt});
    ++base;
  }
  std::reverse(ladder.begin(), ladder.end());
  pools.insert(pools.end(), ladder.begin(), ladder.end());
  const std::uint64_t last = std::max(max_page / align * align, align);
  pools.push_back(pool_options{pool_kind::sliced, last, last, std::nullopt, std::nullopt});
  return pools;
}

std::vector<pool_options> exclusive_pages(const device_properties& props) {
  const std::uint64_t align = std::max<std::uint64_t>(props.alignment, 1);
  const double lo = std::log(static_cast<double>(32 * kib));
  const double hi = std::log(static_cast<double>(std::max(props.max_page_size, align)));
  constexpr int buckets = 24;
  std::vector<pool_options> pools;
  std::uint64_t previous = 0;
  for (int i = 0; i < buckets; ++i) {
    const double p = static_cast<double>(i) / static_cast<double>(buckets - 1);
    const auto raw = static_cast<std::uint64_t>(std::exp(lo + (hi - lo) * p));
    const std::uint64_t size = align_up(raw, align);
    if (i > 0 && size == previous) continue;
    previous = size;
    // Larger buckets are checked for idle pages less often.
    const auto period =
        static_cast<std::uint64_t>(5000.0 * std::round(1.0 + static_cast<double>(size) / static_cast<double>(gib)));
    pools.push_back(pool_options{pool_kind::exclusive, 0, size, std::nullopt, period});
  }
  return pools;
}

// The address space of an arena when the layout does not say: four times the device memory, so
// that fragmentation of the addresses does not limit what fits in memory (addresses cost nothing
// until memory is mapped behind them). With twice, three small long-lived allocations between
// buffers of 100 GB on an H200 left no hole for the next one; 64 GiB when the size is unknown.
std::uint64_t default_address_space(const device_properties& props, std::uint64_t granule) {
  const std::uint64_t space = props.capacity != 0 ? 4 * props.capacity : 64 * gib;
  return align_up(space, granule);
}

// Mappings of at most 32 MiB: few driver calls for big allocations, little memory held by
// mappings that later slices reuse in part (measured on the traces, see BENCHMARKS.md).
std::uint64_t default_chunk(std::uint64_t granule) { return std::max(granule, align_up(32 * mib, granule)); }
// Where the arena grows, mappings of up to 256 MiB: a mapping costs the driver about the same up to
// 128 MiB and more, and the budget of mapped memory (see arena_pool_config) bounds what they hold.
std::uint64_t default_grow(std::uint64_t chunk) { return std::max(chunk, align_up(256 * mib, chunk)); }

pool_options arena_pool(const device_properties& props) {
  const std::uint64_t granule = align_up(props.map_granularity, std::max<std::uint64_t>(props.alignment, 1));
  const std::uint64_t chunk = default_chunk(granule);
  return pool_options{pool_kind::arena, granule,      no_size_limit, default_address_space(props, granule),
                      std::nullopt,     std::nullopt, chunk,         default_grow(chunk)};
}

std::string size_text(std::uint64_t n) {
  if (n != 0 && n % tib == 0) return fmt::format("{}TiB", n / tib);
  if (n != 0 && n % gib == 0) return fmt::format("{}GiB", n / gib);
  if (n != 0 && n % mib == 0) return fmt::format("{}MiB", n / mib);
  if (n != 0 && n % kib == 0) return fmt::format("{}KiB", n / kib);
  return fmt::format("{}", n);
}

error malformed_layout(std::string_view text, const char* why) {
  error e = error::make(errc::malformed_layout, why);
  e.text = std::string(text);
  return e;
}

result<std::uint64_t> parse_count(std::string_view text, std::string_view whole) {
  text = trim(text);
  if (text.empty()) return malformed_layout(whole, "a period needs a number of reserves");
  std::uint64_t v = 0;
  for (char c : text) {
    if (c == '_') continue;
    if (c < '0' || c > '9') return malformed_layout(whole, "a period is a plain number of reserves");
    const auto digit = static_cast<std::uint64_t>(c - '0');
    if (v > (UINT64_MAX - digit) / 10) return malformed_layout(whole, "the period is too large");
    v = v * 10 + digit;
  }
  return v;
}

// The keys of an arena pool: granule, max, space, slack (all optional).
result<arena_pool_config> parse_arena(std::string_view keys) {
  arena_pool_config a;
  while (!keys.empty()) {
    const std::size_t comma = keys.find(',');
    const std::string_view kv = trim(keys.substr(0, comma));
    keys = comma == std::string_view::npos ? std::string_view() : keys.substr(comma + 1);
    if (kv.empty()) continue;
    const std::size_t eq = kv.find('=');
    if (eq == std::string_view::npos) return malformed_layout(kv, "expected key=value");
    const std::string key = lower(trim(kv.substr(0, eq)));
    std::optional<std::uint64_t>* field = nullptr;
    if (key == "granule") field = &a.granule;
    if (key == "max") field = &a.max_alloc_size;
    if (key == "space") field = &a.address_space;
    if (key == "slack") field = &a.slack;
    if (key == "chunk") field = &a.chunk;
    if (key == "grow") field = &a.grow;
    if (field == nullptr) {
      return malformed_layout(kv, "unknown key for an arena (use granule, chunk, max, space, slack, grow)");
    }
    auto size = parse_size(trim(kv.substr(eq + 1)));
    if (!size) return std::move(size).err();
    *field = *size;
  }
  return a;
}

}  // namespace

std::vector<pool_options> preset_pools(preset p, const device_properties& props) {
  switch (p) {
    case preset::automatic:
      if (props.map_granularity != 0) return {arena_pool(props)};
      return sub_slices(props);
    case preset::sub_slices: return sub_slices(props);
    case preset::exclusive_pages: return exclusive_pages(props);
    case preset::arena:
      // Validated by resolve_layout; without mapping the arena preset has no pools.
      if (props.map_granularity != 0) return {arena_pool(props)};
      return {};
  }
  return sub_slices(props);
}

result<std::vector<pool_options>> resolve_layout(const memory_layout& layout, const device_properties& props) {
  if (const auto* p = std::get_if<preset>(&layout.value)) {
    if (*p == preset::arena && props.map_granularity == 0) return error::make(errc::mapping_unsupported);
    return preset_pools(*p, props);
  }
  const auto& list = std::get<std::vector<pool_config>>(layout.value);
  if (list.empty()) return error::make(errc::empty_pool_list);
  if (list.size() > max_dynamic_pools) {
    error e = error::make(errc::too_many_pools);
    e.size = list.size();
    e.limit = max_dynamic_pools;
    return e;
  }
  const std::uint64_t align = std::max<std::uint64_t>(props.alignment, 1);
  std::vector<pool_options> out;
  out.reserve(list.size());
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (const auto* x = std::get_if<exclusive_pool_config>(&list[i])) {
      if (auto e = check_sizes(i, {{"max_alloc_size", x->max_alloc_size}})) return std::move(*e);
      if (x->dealloc_period && *x->dealloc_period == 0) return layout_error(errc::zero_size, i, "dealloc_period");
      out.push_back(
          pool_options{pool_kind::exclusive, 0, align_up(x->max_alloc_size, align), std::nullopt, x->dealloc_period});
      continue;
    }
    if (const auto* a = std::get_if<arena_pool_config>(&list[i])) {
      if (props.map_granularity == 0) return layout_error(errc::mapping_unsupported, i);
      if (auto e = check_sizes(i, {{"granule", a->granule},
                                   {"max_alloc_size", a->max_alloc_size},
                                   {"address_space", a->address_space},
                                   {"chunk", a->chunk},
                                   {"slack", a->slack},
                                   {"grow", a->grow}})) {
        return std::move(*e);
      }
      if (a->granule && *a->granule == 0) return layout_error(errc::zero_size, i, "granule");
      if (a->max_alloc_size && *a->max_alloc_size == 0) return layout_error(errc::zero_size, i, "max_alloc_size");
      if (a->address_space && *a->address_space == 0) return layout_error(errc::zero_size, i, "address_space");
      // The granule is a multiple of the device's; the address space a multiple of the granule.
      const std::uint64_t unit = align_up(props.map_granularity, align);
      const std::uint64_t granule = align_up(a->granule.value_or(unit), unit);
      const std::uint64_t space =
          a->address_space ? align_up(*a->address_space, granule) : default_address_space(props, granule);
      const std::uint64_t max = a->max_alloc_size ? align_up(*a->max_alloc_size, align) : no_size_limit;
      if (max != no_size_limit && max > space) {
        error e = layout_error(errc::slice_larger_than_page, i, "max_alloc_size");
        e.size = max;
        e.limit = space;
        return e;
      }
      if (a->chunk && *a->chunk == 0) return layout_error(errc::zero_size, i, "chunk");
      const std::uint64_t chunk = a->chunk ? align_up(*a->chunk, granule) : default_chunk(granule);
      // grow=0 turns the growth policy off; without the key it is on.
      std::optional<std::uint64_t> grow;
      if (!a->grow) {
        grow = default_grow(chunk);
      } else if (*a->grow != 0) {
        grow = std::max(chunk, align_up(*a->grow, chunk));
      }
      out.push_back(pool_options{pool_kind::arena, granule, max, space, std::nullopt, a->slack, chunk, grow});
      continue;
    }
    const auto& s = std::get<sliced_pool_config>(list[i]);
    if (auto e = check_sizes(
            i,
            {{"page_size", s.page_size}, {"max_slice_size", s.max_slice_size}, {"max_pool_size", s.max_pool_size}})) {
      return std::move(*e);
    }
    if (s.page_size == 0) return layout_error(errc::zero_size, i, "page_size");
    const std::uint64_t page = align_up(s.page_size, align);
    if (s.max_slice_size && *s.max_slice_size == 0) return layout_error(errc::zero_size, i, "max_slice_size");
    const std::uint64_t slice = s.max_slice_size ? align_up(*s.max_slice_size, align) : page;
    if (slice > page) {
      error e = layout_error(errc::slice_larger_than_page, i);
      e.size = slice;
      e.limit = page;
      return e;
    }
    if (s.max_pool_size) {
      const std::uint64_t cap = *s.max_pool_size;
      if (cap == 0) return layout_error(errc::zero_size, i, "max_pool_size");
      if (cap < page) {
        error e = layout_error(errc::cap_smaller_than_page, i);
        e.size = cap;
        e.limit = page;
        return e;
      }
      if (cap / page > max_pages_per_pool) {
        error e = layout_error(errc::too_many_pages, i);
        e.size = cap / page;
        e.limit = max_pages_per_pool;
        return e;
      }
    }
    if (s.dealloc_period && *s.dealloc_period == 0) return layout_error(errc::zero_size, i, "dealloc_period");
    // A page is allocated whole: one larger than the device could never be, and every reserve of
    // the pool would fail as out of memory.
    if (props.capacity != 0 && page > props.capacity) {
      error e = layout_error(errc::slice_larger_than_page, i, "page_size");
      e.size = page;
      e.limit = props.capacity;
      return e;
    }
    out.push_back(pool_options{pool_kind::sliced, page, slice, s.max_pool_size, s.dealloc_period, std::nullopt});
  }
  return out;
}

result<std::uint64_t> parse_size(std::string_view text) {
  const std::string_view whole = text;
  auto fail = [&](const char* why) {
    error e = error::make(errc::malformed_size, why);
    e.text = std::string(whole);
    return e;
  };
  text = trim(text);
  if (text.empty()) return fail("the size is empty");
  std::uint64_t integer = 0;
  std::size_t i = 0;
  bool digits = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '_') continue;
    if (c < '0' || c > '9') break;
    digits = true;
    const auto digit = static_cast<std::uint64_t>(c - '0');
    if (integer > (UINT64_MAX - digit) / 10) return fail("the number is too large");
    integer = integer * 10 + digit;
  }
  if (!digits) {
    if (!text.empty() && text[0] == '-') return fail("a size cannot be negative");
    return fail("it does not start with a number");
  }
  // The fraction as an exact decimal, fraction / denominator, of its first 18 digits. Later digits
  // add less than 10^-18 of the unit (under 2^-19 bytes even for TiB): the floor below can differ
  // only for a fraction that close above a whole byte.
  std::uint64_t fraction = 0;
  std::uint64_t denominator = 1;
  bool has_fraction = false;
  if (i < text.size() && text[i] == '.') {
    has_fraction = true;
    ++i;
    bool fraction_digits = false;
    for (; i < text.size() && ((text[i] >= '0' && text[i] <= '9') || text[i] == '_'); ++i) {
      if (text[i] == '_') continue;
      fraction_digits = true;
      if (denominator >= 1'000'000'000'000'000'000ULL) continue;
      fraction = fraction * 10 + static_cast<std::uint64_t>(text[i] - '0');
      denominator *= 10;
    }
    if (!fraction_digits) return fail("a digit must follow the decimal point");
  }
  const std::string unit = lower(trim(text.substr(i)));
  std::uint64_t mult = 0;
  if (unit.empty() || unit == "b") {
    mult = 1;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    mult = kib;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    mult = mib;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    mult = gib;
  } else if (unit == "t" || unit == "tb" || unit == "tib") {
    mult = tib;
  } else {
    return fail("unknown unit (use B, KiB, MiB, GiB or TiB)");
  }
  if (has_fraction && mult == 1) return fail("a fraction of a byte is not a size");
  if (integer > UINT64_MAX / mult) return fail("the size does not fit in 64 bits");
  const std::uint64_t base = integer * mult;
  // floor(fraction * mult / denominator), exactly: mult is a power of two, so one bit of the
  // quotient per doubling (fraction < denominator <= 10^18, so 2 * fraction never overflows).
  std::uint64_t extra = 0;
  for (std::uint64_t bit = mult; bit > 1; bit >>= 1) {
    fraction *= 2;
    extra *= 2;
    if (fraction >= denominator) {
      fraction -= denominator;
      extra += 1;
    }
  }
  if (extra > UINT64_MAX - base) return fail("the size does not fit in 64 bits");
  return base + extra;
}

std::string format_bytes(std::uint64_t bytes) {
  if (bytes < kib) return fmt::format("{} B", bytes);
  static constexpr const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  auto value = static_cast<double>(bytes) / 1024.0;
  std::size_t u = 0;
  while (value >= 1024.0 && u + 1 < std::size(units)) {
    value /= 1024.0;
    ++u;
  }
  return fmt::format("{:.2f} {}", value, units[u]);
}

result<memory_layout> parse_layout(std::string_view text) {
  const std::string_view whole = trim(text);
  if (whole.empty()) return malformed_layout(text, "the layout is empty; use a preset or a list of pools");
  const std::string name = lower(whole);
  if (name == "auto" || name == "automatic" || name == "default") return memory_layout(preset::automatic);
  if (name == "arena") return memory_layout(preset::arena);
  if (name == "sub-slices" || name == "subslices" || name == "sub_slices") return memory_layout(preset::sub_slices);
  if (name == "exclusive-pages" || name == "exclusive_pages" || name == "exclusivepages") {
    return memory_layout(preset::exclusive_pages);
  }
  std::vector<pool_config> pools;
  std::string_view rest = whole;
  while (!rest.empty()) {
    const std::size_t semi = rest.find(';');
    const std::string_view part = trim(rest.substr(0, semi));
    rest = semi == std::string_view::npos ? std::string_view() : rest.substr(semi + 1);
    if (part.empty()) continue;
    const std::size_t colon = part.find(':');
    if (colon == std::string_view::npos && lower(part) == "arena") {
      pools.emplace_back(arena_pool_config{});
      continue;
    }
    if (colon == std::string_view::npos) {
      return malformed_layout(part,
                              "expected 'sliced:key=value,...', 'exclusive:key=value,...', 'arena:key=value,...' "
                              "or a preset (auto, sub-slices, exclusive-pages, arena)");
    }
    const std::string kind = lower(trim(part.substr(0, colon)));
    if (kind == "arena") {
      auto a = parse_arena(part.substr(colon + 1));
      if (!a) return std::move(a).err();
      pools.emplace_back(*a);
      continue;
    }
    const bool sliced = kind == "sliced";
    if (!sliced && kind != "exclusive") {
      return malformed_layout(part, "unknown pool kind (use sliced, exclusive or arena)");
    }
    sliced_pool_config s;
    exclusive_pool_config x;
    bool has_main = false;
    std::string_view keys = part.substr(colon + 1);
    while (!keys.empty()) {
      const std::size_t comma = keys.find(',');
      const std::string_view kv = trim(keys.substr(0, comma));
      keys = comma == std::string_view::npos ? std::string_view() : keys.substr(comma + 1);
      if (kv.empty()) continue;
      const std::size_t eq = kv.find('=');
      if (eq == std::string_view::npos) return malformed_layout(kv, "expected key=value");
      const std::string key = lower(trim(kv.substr(0, eq)));
      const std::string_view val = trim(kv.substr(eq + 1));
      if (key == "period") {
        auto p = parse_count(val, kv);
        if (!p) return std::move(p).err();
        (sliced ? s.dealloc_period : x.dealloc_period) = *p;
        continue;
      }
      const bool known = sliced ? (key == "page" || key == "slice" || key == "cap") : key == "max";
      if (!known) {
        return malformed_layout(kv, sliced ? "unknown key for a sliced pool (use page, slice, cap, period)"
                                           : "unknown key for an exclusive pool (use max, period)");
      }
      auto size = parse_size(val);
      if (!size) return std::move(size).err();
      if (sliced && key == "page") {
        s.page_size = *size;
        has_main = true;
      } else if (sliced && key == "slice") {
        s.max_slice_size = *size;
      } else if (sliced && key == "cap") {
        s.max_pool_size = *size;
      } else if (!sliced && key == "max") {
        x.max_alloc_size = *size;
        has_main = true;
      } else {
        return malformed_layout(kv, sliced ? "unknown key for a sliced pool (use page, slice, cap, period)"
                                           : "unknown key for an exclusive pool (use max, period)");
      }
    }
    if (!has_main)
      return malformed_layout(part, sliced ? "a sliced pool needs page=SIZE" : "an exclusive pool needs max=SIZE");
    if (sliced) {
      pools.emplace_back(s);
    } else {
      pools.emplace_back(x);
    }
  }
  if (pools.empty()) return malformed_layout(text, "no pool given");
  return memory_layout(std::move(pools));
}

std::string to_string(const memory_layout& layout) {
  if (const auto* p = std::get_if<preset>(&layout.value)) return to_string(*p);
  std::string out;
  for (const auto& pc : std::get<std::vector<pool_config>>(layout.value)) {
    if (!out.empty()) out += ';';
    if (const auto* x = std::get_if<exclusive_pool_config>(&pc)) {
      out += fmt::format("exclusive:max={}", size_text(x->max_alloc_size));
      if (x->dealloc_period) out += fmt::format(",period={}", *x->dealloc_period);
    } else if (const auto* a = std::get_if<arena_pool_config>(&pc)) {
      std::string keys;
      auto key = [&](const char* name, const std::optional<std::uint64_t>& v) {
        if (!v) return;
        keys += keys.empty() ? ":" : ",";
        keys += fmt::format("{}={}", name, size_text(*v));
      };
      key("granule", a->granule);
      key("chunk", a->chunk);
      key("max", a->max_alloc_size);
      key("space", a->address_space);
      key("slack", a->slack);
      key("grow", a->grow);
      out += "arena" + keys;
    } else {
      const auto& s = std::get<sliced_pool_config>(pc);
      out += fmt::format("sliced:page={}", size_text(s.page_size));
      if (s.max_slice_size) out += fmt::format(",slice={}", size_text(*s.max_slice_size));
      if (s.max_pool_size) out += fmt::format(",cap={}", size_text(*s.max_pool_size));
      if (s.dealloc_period) out += fmt::format(",period={}", *s.dealloc_period);
    }
  }
  return out;
}

result<persistent_policy> parse_persistent_policy(std::string_view text) {
  const std::string v = lower(trim(text));
  if (v == "enabled") return persistent_policy::enabled;
  if (v == "size-match" || v == "size_match") return persistent_policy::size_match;
  if (v == "disabled") return persistent_policy::disabled;
  if (v == "enforced") return persistent_policy::enforced;
  error e = error::make(errc::malformed_config,
                        "the persistent memory policy is one of enabled, size-match, "
                        "disabled, enforced");
  e.text = std::string(text);
  return e;
}

const char* to_string(persistent_policy p) noexcept {
  switch (p) {
    case persistent_policy::enabled: return "enabled";
    case persistent_policy::size_match: return "size-match";
    case persistent_policy::disabled: return "disabled";
    case persistent_policy::enforced: return "enforced";
  }
  return "enabled";
}

const char* to_string(preset p) noexcept {
  switch (p) {
    case preset::automatic: return "auto";
    case preset::sub_slices: return "sub-slices";
    case preset::exclusive_pages: return "exclusive-pages";
    case preset::arena: return "arena";
  }
  return "auto";
}

}  // namespace devrt::memory
