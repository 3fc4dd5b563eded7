// libFuzzer target: layout strings through parse_layout, to_string and resolve_layout, then a
// memory manager built from each layout that resolves.
//
// Checks, aborting on a violation:
// - parse errors are malformed_layout or malformed_size, with a message;
// - a parsed layout prints with to_string to a text that parses back to an equivalent layout (the
//   same pools on every device) and prints the same again (round trip);
// - against each of a few devices, resolve_layout either fails with a configuration error that
//   memory_manager::create reports too, or gives pools that keep the documented bounds (sliced:
//   aligned non-zero page, slice no larger than the page, cap no smaller than a page and at most
//   max_pages_per_pool pages; at most max_dynamic_pools pools);
// - no resolved size is smaller than the one written (no alignment wraps around 2^64);
// - a manager over that layout (sim storage) serves a few reserves with check_invariants() empty and
//   gives every page and mapping back after an explicit cleanup.

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <variant>
#include <vector>

#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/config.hpp"
#include "devrt/memory/memory_manager.hpp"

namespace {

using devrt::errc;
namespace mem = devrt::memory;

[[noreturn]] void fail(const std::string& input, const std::string& what) {
  std::fprintf(stderr, "fuzz_layout: %s\ninput: '%s'\n", what.c_str(), input.c_str());
  std::abort();
}

mem::device_properties device(std::uint64_t max_page, std::uint64_t alignment, std::uint64_t capacity) {
  mem::device_properties p;
  p.max_page_size = max_page;
  p.alignment = alignment;
  p.capacity = capacity;
  return p;
}

const std::vector<mem::device_properties>& devices() {
  static const std::vector<mem::device_properties> all{
      device(128ULL << 20, 32, 0),
      device(1ULL << 30, 512, 0),
      device(1ULL << 20, 1, 64ULL << 20),
      devrt::devices::sim_options::h200().props,
  };
  return all;
}

/// Whether two layouts resolve to the same pools (or fail the same way) on every device.
bool equivalent(const mem::memory_layout& a, const mem::memory_layout& b) {
  for (const auto& props : devices()) {
    auto ra = mem::resolve_layout(a, props);
    auto rb = mem::resolve_layout(b, props);
    if (ra.has_value() != rb.has_value()) return false;
    if (ra ? *ra != *rb : ra.code() != rb.code()) return false;
  }
  return true;
}

/// The size written for pool `i` of an explicit layout (the one resolve must not shrink).
void check_not_shrunk(const std::string& input, const mem::memory_layout& layout,
                      const std::vector<mem::pool_options>& pools) {
  const auto* list = std::get_if<std::vector<mem::pool_config>>(&layout.value);
  if (list == nullptr || list->size() != pools.size()) return;
  for (std::size_t i = 0; i < pools.size(); ++i) {
    if (const auto* s = std::get_if<mem::sliced_pool_config>(&(*list)[i])) {
      if (pools[i].page_size < s->page_size) {
        fail(input, "pool " + std::to_string(i) + ": page_size " + std::to_string(s->page_size) + " resolved to " +
                        std::to_string(pools[i].page_size));
      }
      if (s->max_slice_size && pools[i].max_alloc_size < *s->max_slice_size) {
        fail(input, "pool " + std::to_string(i) + ": max_slice_size " + std::to_string(*s->max_slice_size) +
                        " resolved to " + std::to_string(pools[i].max_alloc_size));
      }
    } else if (const auto* x = std::get_if<mem::exclusive_pool_config>(&(*list)[i])) {
      if (pools[i].max_alloc_size < x->max_alloc_size) {
        fail(input, "pool " + std::to_string(i) + ": max_alloc_size " + std::to_string(x->max_alloc_size) +
                        " resolved to " + std::to_string(pools[i].max_alloc_size));
      }
    }
  }
}

void check_pools(const std::string& input, const mem::device_properties& props,
                 const std::vector<mem::pool_options>& pools) {
  const std::uint64_t align = props.alignment == 0 ? 1 : props.alignment;
  if (pools.size() > mem::max_dynamic_pools) fail(input, "more pools than max_dynamic_pools");
  for (std::size_t i = 0; i < pools.size(); ++i) {
    const auto& p = pools[i];
    const std::string where = "pool " + std::to_string(i) + ": ";
    if (p.dealloc_period && *p.dealloc_period == 0) fail(input, where + "a zero dealloc_period was accepted");
    if (p.kind == mem::pool_kind::exclusive) {
      if (p.max_alloc_size % align != 0) fail(input, where + "exclusive max_alloc_size not aligned");
    } else if (p.kind == mem::pool_kind::sliced) {
      if (p.page_size % align != 0) fail(input, where + "page not aligned");
      if (p.max_alloc_size > p.page_size) fail(input, where + "slice larger than the page");
      if (p.max_pool_size) {
        if (*p.max_pool_size == 0) fail(input, where + "a zero cap was accepted");
        if (p.page_size != 0 && *p.max_pool_size < p.page_size) fail(input, where + "cap smaller than the page");
        if (p.page_size != 0 && *p.max_pool_size / p.page_size > mem::max_pages_per_pool) {
          fail(input, where + "cap allows more than max_pages_per_pool pages");
        }
      }
      if (p.page_size == 0) fail(input, where + "page_size resolved to 0");
    }
  }
}

void exercise(const std::string& input, const mem::device_properties& props, const mem::memory_layout& layout) {
  devrt::devices::sim_options o;
  o.props = props;
  mem::manager_options opts;
  opts.name = "fuzz";
  opts.layout = layout;
  auto created = mem::memory_manager::create(mem::storage::make<devrt::devices::sim_storage>(o), opts);
  if (!created) fail(input, "resolve_layout accepted the layout, the manager refused it: " + created.err().message());
  mem::memory_manager& m = **created;
  auto* sim = m.backing_storage().backend<devrt::devices::sim_storage>();
  {
    std::vector<mem::memory_handle> live;
    for (const std::uint64_t size : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{4096}, std::uint64_t{1} << 20}) {
      auto r = m.reserve(size);
      if (r) {
        live.push_back(std::move(*r));
      } else if (r.code() != errc::buffer_too_big && r.code() != errc::pool_capacity_exceeded &&
                 r.code() != errc::out_of_memory) {
        fail(input, "reserve(" + std::to_string(size) + "): unexpected " + r.err().message());
      }
      if (const std::string p = m.check_invariants(); !p.empty()) fail(input, "after a reserve: " + p);
    }
  }
  if (auto c = m.cleanup(true); !c) fail(input, "cleanup: " + c.err().message());
  if (const std::string p = m.check_invariants(); !p.empty()) fail(input, "after cleanup: " + p);
  if (m.usage().bytes_reserved != 0 || sim->allocated_bytes() != 0 || sim->mapped_bytes() != 0) {
    fail(input, "pages left after dropping everything and an explicit cleanup");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);  // NOLINT
  auto parsed = mem::parse_layout(input);
  if (!parsed) {
    if (parsed.code() != errc::malformed_layout && parsed.code() != errc::malformed_size) {
      fail(input, "parse error code " + std::string(to_string(parsed.code())));
    }
    if (parsed.err().message().empty()) fail(input, "an error without a message");
    return 0;
  }
  const std::string text = mem::to_string(*parsed);
  auto again = mem::parse_layout(text);
  if (!again) fail(input, "to_string gave '" + text + "', which does not parse: " + again.err().message());
  // The text may name the same pools another way (a one-pool list that is also a preset): it must
  // resolve to the same pools on every device.
  if (!equivalent(*again, *parsed)) {
    fail(input, "'" + text + "' parses to another layout");
  }
  if (mem::to_string(*again) != text) fail(input, "to_string is not stable: '" + mem::to_string(*again) + "'");

  for (const auto& props : devices()) {
    auto resolved = mem::resolve_layout(*parsed, props);
    if (!resolved) {
      if (!devrt::is_config_error(resolved.code())) {
        fail(input, "resolve error that is not a configuration error: " + resolved.err().message());
      }
      if (resolved.err().message().empty()) fail(input, "a resolve error without a message");
      mem::manager_options opts;
      opts.layout = *parsed;
      devrt::devices::sim_options o;
      o.props = props;
      auto m = mem::memory_manager::create(mem::storage::make<devrt::devices::sim_storage>(o), opts);
      if (m || m.code() != resolved.code()) fail(input, "memory_manager::create disagrees with resolve_layout");
      continue;
    }
    check_pools(input, props, *resolved);
    check_not_shrunk(input, *parsed, *resolved);
    if (resolved->size() <= 16) exercise(input, props, *parsed);
  }
  return 0;
}
