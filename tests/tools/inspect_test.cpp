// devrt-inspect: the request sizes each pool serves (checked against the memory manager's own
// routing), the diagnoses and fixes of invalid layouts, config files, and the command line with
// its exit codes.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "devrt/devices/host_storage.hpp"
#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/config.hpp"
#include "devrt/memory/memory_manager.hpp"
#include "devrt/runtime/runtime.hpp"
#include "inspect/cli.hpp"
#include "inspect/inspect.hpp"
#include "tools/tools_test_util.hpp"
#if defined(DEVRT_WITH_CUDA)
#include "devrt/devices/cuda_storage.hpp"
#endif

namespace devrt::inspect {
namespace {

using replay::testing::scratch_dir;
using replay::testing::write_plain;

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = 1024 * KiB;
constexpr std::uint64_t GiB = 1024 * MiB;

struct run_output {
  int code;
  std::string out;
  std::string err;
};

using env_map = std::vector<std::pair<std::string, std::string>>;

run_output run(const std::vector<std::string>& args, env_map env = {}) {
  std::ostringstream out;
  std::ostringstream err;
  const runtime::env_lookup lookup = [env = std::move(env)](const char* name) -> std::optional<std::string> {
    for (const auto& [k, v] : env) {
      if (k == name) return v;
    }
    return std::nullopt;
  };
  const int code = run_cli(args, out, err, lookup);
  return {code, out.str(), err.str()};
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

/// Brackets and braces balance outside strings, and strings are closed: enough to catch output
/// that a JSON reader would reject for its structure.
bool balanced_json(const std::string& s) {
  std::string stack;
  bool in_string = false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      stack += c;
    } else if (c == '}' || c == ']') {
      if (stack.empty() || stack.back() != (c == '}' ? '{' : '[')) return false;
      stack.pop_back();
    }
  }
  return !in_string && stack.empty();
}

memory::device_properties props(std::uint64_t max_page, std::uint64_t alignment, std::uint64_t capacity) {
  memory::device_properties p;
  p.max_page_size = max_page;
  p.alignment = alignment;
  p.capacity = capacity;
  return p;
}

memory::pool_options pool(memory::pool_kind kind, std::uint64_t page, std::uint64_t max,
                          std::optional<std::uint64_t> cap = std::nullopt) {
  memory::pool_options p;
  p.kind = kind;
  p.page_size = page;
  p.max_alloc_size = max;
  p.max_pool_size = cap;
  return p;
}

// ---- Size sets ----

TEST(InspectSizes, SubtractAndUnite) {
  EXPECT_EQ(subtract({{0, 100}}, {{10, 20}, {50, 60}}), (size_set{{0, 9}, {21, 49}, {61, 100}}));
  EXPECT_EQ(subtract({{0, 100}}, {{0, 100}}), size_set{});
  EXPECT_EQ(subtract({{5, 10}}, {{0, 4}, {11, 20}}), (size_set{{5, 10}}));
  EXPECT_EQ(subtract({{0, UINT64_MAX}}, {{1, UINT64_MAX}}), (size_set{{0, 0}}));
  EXPECT_EQ(unite({{0, 9}}, {{10, 20}}), (size_set{{0, 20}}));  // adjacent ranges merge
  EXPECT_EQ(unite({{30, 40}, {0, 5}}, {{3, 8}}), (size_set{{0, 8}, {30, 40}}));
  EXPECT_EQ(unite({{5, UINT64_MAX}}, {{0, 4}}), (size_set{{0, UINT64_MAX}}));
}

TEST(InspectSizes, Text) {
  EXPECT_EQ(size_text(512), "512 B");
  EXPECT_EQ(size_text(64 * MiB), "64 MiB");
  EXPECT_EQ(size_text(1536), "1.50 KiB");
  EXPECT_EQ(size_text(37527470080ULL), "34.95 GiB");
  EXPECT_EQ(size_text(37527470080ULL, true), "37527470080");
  EXPECT_EQ(range_text({0, 8 * MiB}), "[0 B, 8 MiB]");
  EXPECT_EQ(range_text({8 * MiB + 1, 32 * MiB}), "(8 MiB, 32 MiB]");
  EXPECT_EQ(range_text({0, 0}), "0 B");
  EXPECT_EQ(layout_size(64 * MiB), "64MiB");
  EXPECT_EQ(layout_size(16448), "16448");
}

// ---- What each pool serves, against the memory manager's routing ----

/// Reserves sizes from every range the report gives (both ends and the middle) on a simulated
/// device with the same properties, and checks which pool serves each one, or that none does.
void expect_routing_matches(const std::string& layout_text, const memory::device_properties& p) {
  SCOPED_TRACE(layout_text);
  const memory::memory_layout layout = memory::parse_layout(layout_text).value();
  const layout_report r = report_layout(memory::resolve_layout(layout, p).value(), p);
  ASSERT_TRUE(r.exact);
  devices::sim_options so;
  so.props = p;
  memory::manager_options mo;
  mo.layout = layout;
  memory::memory_manager m(memory::storage::make<devices::sim_storage>(so), mo);
  ASSERT_EQ(m.layout(), r.pools);

  const auto probes = [](const size_range& range) {
    return std::vector<std::uint64_t>{range.lo, range.lo + (range.hi - range.lo) / 2, range.hi};
  };
  std::size_t checked = 0;
  for (std::size_t i = 0; i < r.serves.size(); ++i) {
    ASSERT_TRUE(r.serves[i].has_value());
    for (const size_range& range : *r.serves[i]) {
      for (const std::uint64_t size : probes(range)) {
        SCOPED_TRACE(::testing::Message() << "pool " << i << ", size " << size);
        auto h = m.reserve(size);
        ASSERT_TRUE(h.has_value()) << h.err().message();
        EXPECT_EQ(h->raw()->loc.pool, i);
        ++checked;
      }
    }
  }
  for (const size_range& range : r.unserved) {
    for (const std::uint64_t size : probes(range)) {
      SCOPED_TRACE(::testing::Message() << "unserved size " << size);
      EXPECT_EQ(m.reserve(size).code(), errc::buffer_too_big);
      ++checked;
    }
  }
  EXPECT_GT(checked, 3 * r.pools.size());
  EXPECT_EQ(m.check_invariants(), "");
}

TEST(InspectRouting, SubSlicesOnH200) { expect_routing_matches("sub-slices", devices::sim_options::h200().props); }

TEST(InspectRouting, ExclusivePages) { expect_routing_matches("exclusive-pages", props(64 * MiB, 512, GiB)); }

TEST(InspectRouting, ExplicitPoolsWithGapsAndCaps) {
  // A capped sliced pool takes no request larger than its max slice; an uncapped one takes those
  // that fill most of a page; the exclusive pool takes what is left up to 8 MiB.
  expect_routing_matches("exclusive:max=4KiB;sliced:page=1MiB,slice=256KiB,cap=4MiB;sliced:page=4MiB,slice=1MiB",
                         props(GiB, 512, GiB));
  expect_routing_matches("sliced:page=1MiB,slice=64KiB;exclusive:max=64KiB;exclusive:max=8MiB,period=100",
                         props(GiB, 64, 0));
}

TEST(InspectRouting, ShadowedPoolsAndGaps) {
  const auto p = props(GiB, 512, GiB);
  const auto pools = memory::resolve_layout(
                         memory::parse_layout("sliced:page=1MiB,slice=64KiB,cap=8MiB;exclusive:max=32KiB").value(), p)
                         .value();
  const layout_report r = report_layout(pools, p);
  ASSERT_EQ(r.serves.size(), 2U);
  EXPECT_EQ(*r.serves[0], (size_set{{0, 64 * KiB}}));
  EXPECT_EQ(*r.serves[1], size_set{});
  EXPECT_EQ(r.unserved, (size_set{{64 * KiB + 1, GiB}}));
  EXPECT_EQ(r.largest_request, GiB);
}

TEST(InspectRouting, KindsThisToolDoesNotDescribe) {
  // A pool kind added after this tool: shown with its number, its sizes left unknown, and the
  // pools after it still described.
  const auto unknown = static_cast<memory::pool_kind>(200);
  const std::vector<memory::pool_options> pools{pool(unknown, 2 * MiB, 4 * MiB, 64 * GiB),
                                                pool(memory::pool_kind::exclusive, 0, 8 * MiB)};
  const pool_description d = describe_pool(pools[0]);
  EXPECT_EQ(d.kind, "kind 200");
  EXPECT_EQ(d.page_size, 2 * MiB);
  EXPECT_EQ(d.cap, 64 * GiB);
  EXPECT_FALSE(d.accepts.has_value());
  const layout_report r = report_layout(pools, props(GiB, 512, 0));
  EXPECT_FALSE(r.exact);
  EXPECT_FALSE(r.serves[0].has_value());
  EXPECT_EQ(*r.serves[1], (size_set{{0, 8 * MiB}}));
}

// ---- Invalid layouts: what is wrong and what to change ----

struct invalid_case {
  const char* layout;
  const char* code;
  const char* fix;    ///< part of the fix line
  const char* fixed;  ///< the layout with the fix applied
};

TEST(InspectCheck, EveryValidationErrorHasAFixThatWorks) {
  const std::vector<invalid_case> cases{
      {"sliced:page=1MiB,slice=2MiB", "slice_larger_than_page",
       "fix      slice larger than page: make max slice <= page size (slice=1MiB or less) or raise the page size "
       "(page=2MiB or more)",
       "sliced:page=2MiB,slice=2MiB"},
      {"sliced:page=1MiB,cap=100KiB", "cap_smaller_than_page", "(cap=1MiB or more)", "sliced:page=100KiB,cap=100KiB"},
      {"sliced:page=4KiB,cap=1GiB", "too_many_pages", "(page=16448 or more, such as page=32KiB)",
       "sliced:page=16448,cap=1GiB"},
      {"sliced:page=4KiB,cap=1GiB", "too_many_pages", "(cap=262140KiB or less)", "sliced:page=4KiB,cap=262140KiB"},
      {"sliced:page=1MiB,period=0", "zero_size", "set period= above zero", "sliced:page=1MiB,period=1"},
      {"sliced:page=0", "zero_size", "page size above zero", "sliced:page=64MiB"},
      {"sliced:page=1MiB,slice=0", "zero_size", "leave slice= out", "sliced:page=1MiB"},
      {"sliced:page=12QB", "malformed_size", "64MiB, 1.5GiB", "sliced:page=12MiB"},
      {"slised:page=1MiB", "malformed_layout", "KIND:key=value", "sliced:page=1MiB"},
  };
  for (const invalid_case& c : cases) {
    SCOPED_TRACE(c.layout);
    const run_output o = run({"--check", c.layout});
    EXPECT_EQ(o.code, 1);
    EXPECT_TRUE(contains(o.out, fmt::format("layout '{}' is invalid", c.layout))) << o.out;
    EXPECT_TRUE(contains(o.out, fmt::format("code     {}\n", c.code))) << o.out;
    EXPECT_TRUE(contains(o.out, "fix      ")) << o.out;
    EXPECT_TRUE(contains(o.out, c.fix)) << o.out;
    const run_output fixed = run({"--check", c.fixed});
    EXPECT_EQ(fixed.code, 0) << fixed.out;
    EXPECT_TRUE(contains(fixed.out, "is valid on host")) << fixed.out;
  }
}

TEST(InspectCheck, ValuesComeFromTheError) {
  const run_output o = run({"--check", "exclusive:max=1KiB;sliced:page=1MiB,slice=3MiB", "--device", "sim"});
  EXPECT_EQ(o.code, 1);
  EXPECT_TRUE(contains(o.out, "is invalid on sim\n")) << o.out;
  EXPECT_TRUE(contains(o.out, "(3145728 bytes) is larger than page_size (1048576 bytes)")) << o.out;
  EXPECT_TRUE(contains(o.out, "pool     1: sliced:page=1MiB,slice=3MiB\n")) << o.out;
  EXPECT_TRUE(contains(o.out, "(slice=1MiB or less)")) << o.out;
  EXPECT_TRUE(contains(o.out, "(page=3MiB or more)")) << o.out;
}

TEST(InspectCheck, TooManyPools) {
  std::string layout;
  for (int i = 0; i < 255; ++i) layout += "exclusive:max=1KiB;";
  const run_output o = run({"--check", layout});
  EXPECT_EQ(o.code, 1);
  EXPECT_TRUE(contains(o.out, "code     too_many_pools")) << o.out;
  EXPECT_TRUE(contains(o.out, "at most 254 pools")) << o.out;
}

TEST(InspectCheck, HintsWithoutAPool) {
  error e = error::make(errc::empty_pool_list);
  EXPECT_TRUE(contains(fix_hint(e, props(GiB, 512, 0)), "at least one pool"));
  e = error::make(errc::too_many_pages);
  e.size = 100000;
  e.limit = 65535;
  EXPECT_TRUE(contains(fix_hint(e, props(GiB, 512, 0)), "raise the page size or lower the cap"));
  // Errors that are not about a layout have nothing to add to their message.
  EXPECT_EQ(fix_hint(error::make(errc::not_found), props(GiB, 512, 0)), "");
  e.text = "pool 12";
  EXPECT_EQ(error_pool_index(e), 12U);
  e.text = "pool x";
  EXPECT_EQ(error_pool_index(e), std::nullopt);
}

TEST(InspectCheck, ValidLayoutWarnsAboutShadowedPoolsAndGaps) {
  const std::string layout =
      "sliced:page=1MiB,slice=64KiB,cap=8MiB;exclusive:max=32KiB;exclusive:max=256KiB;exclusive:max=4MiB";
  const run_output o = run({"--check", layout, "--device", "sim", "--capacity", "1GiB"});
  EXPECT_EQ(o.code, 0) << o.out;
  EXPECT_TRUE(contains(o.out, "is valid on sim: 4 pools, 1 warning\n")) << o.out;
  EXPECT_TRUE(contains(o.out, "warning  pool 1 serves no request")) << o.out;
  EXPECT_TRUE(contains(o.out, "above    requests above 4 MiB are refused")) << o.out;

  // An uncapped sliced pool takes small requests and those that fill most of a page, not those in
  // between.
  const run_output gap = run({"--check", "sliced:page=1MiB,slice=64KiB", "--device", "sim"});
  EXPECT_EQ(gap.code, 0) << gap.out;
  EXPECT_TRUE(contains(gap.out, "warning  requests of (64 KiB, 819.20 KiB] are served by no pool")) << gap.out;
  EXPECT_TRUE(contains(gap.out, "[0 B, 64 KiB], (819.20 KiB, 1 MiB]\n")) << gap.out;
}

// ---- Layouts ----

TEST(InspectLayout, H200SubSlices) {
  const run_output o = run({"--device", "sim", "--h200", "--layout", "sub-slices"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_TRUE(contains(
      o.out,
      "device   sim-h200 (sim): pages up to 34.95 GiB, alignment 512 B, capacity 139.80 GiB, maps memory in 2 MiB\n"))
      << o.out;
  EXPECT_TRUE(contains(o.out, "layout   sub-slices (preset): 8 pools, in routing order")) << o.out;
  EXPECT_TRUE(contains(o.out, "pool  kind       page        max slice/alloc  cap  period  serves requests of\n"))
      << o.out;
  EXPECT_TRUE(contains(o.out, "0     exclusive  -           0 B              -    -       0 B\n")) << o.out;
  EXPECT_TRUE(contains(o.out, "(4.37 GiB, 6.99 GiB], (8.74 GiB, 34.95 GiB]\n")) << o.out;
  EXPECT_TRUE(contains(o.out, "above    requests above 34.95 GiB are refused")) << o.out;
  EXPECT_TRUE(contains(o.out, "tagged requests (devrt_set_tag, tag_scope) go to an arena of the tag's own")) << o.out;
  EXPECT_FALSE(contains(o.out, "warning")) << o.out;

  const run_output bytes = run({"--device", "sim", "--h200", "--layout", "sub-slices", "--bytes"});
  EXPECT_TRUE(contains(bytes.out, "pages up to 37527470080, alignment 512, capacity 150109880320")) << bytes.out;
}

TEST(InspectLayout, DefaultIsTheDefaultLayoutOnTheHost) {
  const run_output o = run({});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_TRUE(contains(o.out, "device   host (host): pages up to 1 GiB, alignment 64 B")) << o.out;
  EXPECT_TRUE(contains(o.out, "layout   " + memory::to_string(memory::memory_layout()) + " (preset)")) << o.out;
}

TEST(InspectLayout, SimProperties) {
  const run_output o = run({"--device=sim", "--page-size", "64MiB", "--alignment=4KiB", "--capacity", "1GiB",
                            "--layout", "sliced:page=1000,slice=100,cap=4MiB,period=10;exclusive:max=8MiB"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_TRUE(contains(o.out, "sim (sim): pages up to 64 MiB, alignment 4 KiB, capacity 1 GiB")) << o.out;
  EXPECT_TRUE(contains(o.out, "tags only label requests here: the device cannot map memory")) << o.out;
  // Sizes are rounded up to the alignment; the cap stays as written and holds whole pages.
  EXPECT_TRUE(contains(o.out, "0     sliced     4 KiB  4 KiB            4 MiB (1024 pages)  10      [0 B, 4 KiB]\n"))
      << o.out;
  EXPECT_TRUE(contains(o.out, "1     exclusive  -      8 MiB            -                   -       (4 KiB, 8 MiB]\n"))
      << o.out;
}

TEST(InspectLayout, Json) {
  const run_output o = run({"--device", "sim", "--capacity", "1GiB", "--json", "--layout",
                            "sliced:page=1MiB,slice=64KiB,cap=4MiB,period=10;exclusive:max=8MiB"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_TRUE(balanced_json(o.out)) << o.out;
  EXPECT_TRUE(contains(o.out,
                       "\"device\": {\"name\": \"sim\", \"kind\": \"sim\", \"max_page_size\": 1073741824, "
                       "\"alignment\": 512, \"capacity\": 1073741824}"))
      << o.out;
  EXPECT_TRUE(contains(o.out,
                       "{\"index\": 0, \"kind\": \"sliced\", \"kind_id\": 0, \"page_size\": 1048576, "
                       "\"max_size\": 65536, \"cap\": 4194304, \"max_pages\": 4, \"dealloc_period\": 10, "
                       "\"serves\": [[0, 65536]]}"))
      << o.out;
  EXPECT_TRUE(contains(o.out, "\"serves\": [[65537, 8388608]]")) << o.out;
  EXPECT_TRUE(contains(o.out, "\"unserved\": [[8388609, 1073741824]], \"refused_above\": 8388608")) << o.out;
  EXPECT_TRUE(contains(o.out, "\"valid\": true")) << o.out;

  const run_output bad = run({"--json", "--check", "sliced:page=1MiB,slice=2MiB"});
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(balanced_json(bad.out)) << bad.out;
  EXPECT_TRUE(contains(bad.out, "\"valid\": false")) << bad.out;
  EXPECT_TRUE(contains(bad.out, "\"code\": \"slice_larger_than_page\", \"code_id\": 22")) << bad.out;
  EXPECT_TRUE(contains(bad.out, "\"size\": 2097152, \"limit\": 1048576")) << bad.out;
  EXPECT_TRUE(contains(bad.out, "\"pool\": 0, \"pool_layout\": \"sliced:page=1MiB,slice=2MiB\"")) << bad.out;
}

TEST(InspectLayout, InvalidLayoutFailsWithTheDiagnosis) {
  const run_output o = run({"--layout", "sliced:page=1MiB,cap=100KiB"});
  EXPECT_EQ(o.code, 1);
  EXPECT_TRUE(contains(o.out, "code     cap_smaller_than_page")) << o.out;
}

TEST(InspectLayout, Cuda) {
  const run_output o = run({"--device", "cuda"});
#if defined(DEVRT_WITH_CUDA)
  if (devices::cuda_device_count() == 0) {
    // Said plainly, with what to use instead (not the CUDA runtime's "driver version is
    // insufficient" on a machine without a driver).
    EXPECT_EQ(o.code, 1);
    EXPECT_TRUE(contains(o.err, "devrt-inspect: --device cuda: no CUDA GPU")) << o.err;
    EXPECT_TRUE(contains(o.err, "use --device host, or --device sim")) << o.err;
    EXPECT_FALSE(contains(o.err, "insufficient")) << o.err;
    const run_output one = run({"--device", "cuda:3"});
    EXPECT_EQ(one.code, 1);
    EXPECT_TRUE(contains(one.err, "--device cuda:3: no CUDA GPU")) << one.err;
  } else {
    EXPECT_EQ(o.code, 0) << o.err;
    for (int i = 0; i < devices::cuda_device_count(); ++i) {
      EXPECT_TRUE(contains(o.out, fmt::format("device   cuda:{} ", i))) << o.out;
    }
    const run_output missing = run({"--device", fmt::format("cuda:{}", devices::cuda_device_count())});
    EXPECT_EQ(missing.code, 1);
    EXPECT_TRUE(contains(missing.err, "there is no such GPU")) << missing.err;
  }
#else
  EXPECT_EQ(o.code, 1);
  EXPECT_TRUE(contains(o.err, "built without CUDA")) << o.err;
  EXPECT_TRUE(contains(o.err, "use --device host, or --device sim")) << o.err;
#endif
}

// The host device devrt-inspect shows is the one a runtime creates: the same alignment (64, not
// the 256 the examples ask for or the 512 of devrt-replay's host), pages and mapping unit.
TEST(InspectLayout, HostIsTheRuntimesHostDevice) {
  runtime::runtime_options opts;
  opts.use_cuda = false;
  opts.use_environment = false;
  const runtime::runtime rt(opts);
  const memory::device_properties want = rt.host().device().properties;
  EXPECT_EQ(want.alignment, devices::host_storage{}.properties().alignment);

  auto devices = devices_of(cli_options{});
  ASSERT_TRUE(devices.has_value());
  ASSERT_EQ(devices->size(), 1U);
  const memory::device_properties& got = devices->front().props;
  EXPECT_EQ(got.alignment, want.alignment);
  EXPECT_EQ(got.max_page_size, want.max_page_size);
  EXPECT_EQ(got.map_granularity, want.map_granularity);
  EXPECT_EQ(got.capacity, want.capacity);

  const run_output text = run({"--device", "host"});
  EXPECT_TRUE(contains(text.out, "device   host (host): pages up to " + size_text(want.max_page_size) + ", alignment " +
                                     size_text(want.alignment) + ", "))
      << text.out;
  const run_output json = run({"--device", "host", "--json"});
  EXPECT_TRUE(contains(json.out, fmt::format("\"alignment\": {},", want.alignment))) << json.out;
  EXPECT_TRUE(contains(run({"--help"}).out, fmt::format("{}-byte", want.alignment)));
}

// What an arena does with free memory, as devrt-inspect says it, is what the arena itself reports
// (memory_manager::report): the default growth policy, grow=0 and a slack.
TEST(InspectLayout, ArenaFreeMemoryRuleIsTheArenasOwn) {
  for (const std::string layout : {"arena", "arena:grow=0", "arena:slack=64MiB", "arena:slack=8MiB,grow=0"}) {
    SCOPED_TRACE(layout);
    const memory::device_properties props = devices::host_storage{}.properties();
    auto parsed = memory::parse_layout(layout);
    ASSERT_TRUE(parsed.has_value());
    auto pools = memory::resolve_layout(*parsed, props);
    ASSERT_TRUE(pools.has_value());
    ASSERT_EQ(pools->size(), 1U);
    const std::string rule = arena_free_memory_rule(pools->front());

    memory::memory_manager m(memory::storage::make<devices::host_storage>(), memory::manager_options{"host", *parsed});
    auto h = m.reserve(3 * MiB);
    ASSERT_TRUE(h.has_value());
    const std::string report = m.report();
    EXPECT_TRUE(contains(report, "free memory kept " + rule)) << report;

    const run_output o = run({"--device", "host", "--layout", layout});
    ASSERT_EQ(o.code, 0) << o.err;
    EXPECT_TRUE(contains(o.out, "free memory stays mapped " + rule)) << o.out;
  }
  EXPECT_EQ(arena_free_memory_rule(memory::pool_options{memory::pool_kind::arena}), "until needed elsewhere");
}

// ---- Config files ----

TEST(InspectConfig, ValidFileAndWhereEachSettingComesFrom) {
  scratch_dir dir;
  const std::string path =
      write_plain(dir.file("devrt.conf"), "# devrt\npersistent_memory = size-match   # for serving\n\n");
  const run_output o = run({"--config", path});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_TRUE(contains(o.out, "config file '" + path + "' is valid")) << o.out;
  EXPECT_TRUE(contains(o.out, "persistent_memory  size-match  file\n")) << o.out;
  EXPECT_TRUE(contains(o.out, "log_level          disabled    default\n")) << o.out;

  const run_output env =
      run({"--config", path}, {{"DEVRT_PERSISTENT_MEMORY", "enforced"}, {"DEVRT_LOG_LEVEL", "full"}});
  EXPECT_EQ(env.code, 0) << env.err;
  EXPECT_TRUE(contains(env.out, "persistent_memory  enforced  environment DEVRT_PERSISTENT_MEMORY, over the file\n"))
      << env.out;
  EXPECT_TRUE(contains(env.out, "log_level          full      environment DEVRT_LOG_LEVEL\n")) << env.out;

  const run_output json = run({"--config", path, "--json"});
  EXPECT_EQ(json.code, 0);
  EXPECT_TRUE(balanced_json(json.out)) << json.out;
  EXPECT_TRUE(contains(json.out, "\"persistent_memory\": {\"value\": \"size-match\", \"source\": \"file\"}"))
      << json.out;
}

TEST(InspectConfig, EverySettingOfTheFileIsShown) {
  scratch_dir dir;
  const std::string path =
      write_plain(dir.file("devrt.conf"), "cuda_devices = 0,2\nserve_in_place = off\nmemory_limit = 80%\n");
  const run_output o = run({"--config", path});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_TRUE(contains(o.out, "cuda_devices       0,2       file\n")) << o.out;
  EXPECT_TRUE(contains(o.out, "serve_in_place     false     file\n")) << o.out;
  EXPECT_TRUE(contains(o.out, "memory_limit       80%       file\n")) << o.out;

  const std::string empty = write_plain(dir.file("empty.conf"), "# nothing set\n");
  const run_output d = run({"--config", empty}, {{"DEVRT_MEMORY_LIMIT", "40GiB"}});
  EXPECT_EQ(d.code, 0) << d.err;
  EXPECT_TRUE(contains(d.out, "cuda_devices       all        default\n")) << d.out;
  EXPECT_TRUE(contains(d.out, "serve_in_place     true       default\n")) << d.out;
  EXPECT_TRUE(contains(d.out, "memory_limit       40.00 GiB  environment DEVRT_MEMORY_LIMIT\n")) << d.out;
}

TEST(InspectConfig, SettingTheDefaultValueCountsAsSet) {
  scratch_dir dir;
  const std::string path = write_plain(dir.file("devrt.conf"), "log_level = disabled\n");
  const run_output o = run({"--config", path});
  EXPECT_EQ(o.code, 0);
  EXPECT_TRUE(contains(o.out, "log_level          disabled  file\n")) << o.out;
}

TEST(InspectConfig, InvalidFileNamesTheLine) {
  scratch_dir dir;
  const std::string path = write_plain(dir.file("devrt.conf"), "log_level = basic\n\nlog_level = loud\n");
  const run_output o = run({"--config", path});
  EXPECT_EQ(o.code, 1);
  EXPECT_TRUE(contains(o.out, "config file '" + path + "' is invalid")) << o.out;
  EXPECT_TRUE(contains(o.out, path + ":3: log_level = loud")) << o.out;
  EXPECT_TRUE(contains(o.out, "fix      a config file has one `key = value` per line")) << o.out;

  const run_output json = run({"--config", path, "--json"});
  EXPECT_EQ(json.code, 1);
  EXPECT_TRUE(balanced_json(json.out)) << json.out;
  EXPECT_TRUE(contains(json.out, "\"code\": \"malformed_config\"")) << json.out;

  const run_output missing = run({"--config", dir.file("none.conf")});
  EXPECT_EQ(missing.code, 1);
  EXPECT_TRUE(contains(missing.out, "cannot be read")) << missing.out;
  EXPECT_TRUE(contains(missing.out, "fix      check the path")) << missing.out;

  const std::string ok = write_plain(dir.file("ok.conf"), "log_level = basic\n");
  const run_output bad_env = run({"--config", ok}, {{"DEVRT_LOG_LEVEL", "loud"}});
  EXPECT_EQ(bad_env.code, 1);
  EXPECT_TRUE(contains(bad_env.out, "DEVRT_LOG_LEVEL=loud")) << bad_env.out;
  EXPECT_TRUE(contains(bad_env.out, "config file '" + ok + "' is valid, but the environment is not")) << bad_env.out;
  EXPECT_FALSE(contains(bad_env.out, "is invalid")) << bad_env.out;
}

// ---- The command line ----

TEST(InspectCli, Help) {
  const run_output o = run({"--help"});
  EXPECT_EQ(o.code, 0);
  EXPECT_TRUE(contains(o.out, "usage: devrt-inspect")) << o.out;
  EXPECT_TRUE(contains(o.out, "--check L")) << o.out;
}

TEST(InspectCli, BadUsageExitsWithTwo) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases{
      {{"--frobnicate"}, "unknown option '--frobnicate'"},
      {{"--layout"}, "option --layout needs a value"},
      {{"--json=yes"}, "option --json takes no value"},
      {{"--device", "gpu"}, "bad value for --device: 'gpu'"},
      {{"--device", "cuda:x"}, "bad value for --device: 'cuda:x'"},
      {{"--device", "host", "--h200"}, "describe a simulated device"},
      {{"--alignment", "3"}, "3 is not a power of two"},
      {{"--page-size", "0"}, "the page size must be above zero"},
      {{"--capacity", "lots"}, "bad value for --capacity: malformed size 'lots'"},
      {{"--layout", "sub-slices", "--check", "sub-slices"}, "give the layout once"},
      {{"--config", "f", "--device", "sim"}, "it takes no device"},
      {{"--config", "f", "--check", "sub-slices"}, "it takes no layout"},
      {{"sub-slices"}, "unexpected argument 'sub-slices'"},
  };
  for (const auto& [args, message] : cases) {
    SCOPED_TRACE(args.front());
    const run_output o = run(args);
    EXPECT_EQ(o.code, 2);
    EXPECT_TRUE(o.out.empty()) << o.out;
    EXPECT_TRUE(o.err.starts_with("devrt-inspect: ")) << o.err;
    EXPECT_TRUE(contains(o.err, message)) << o.err;
    EXPECT_TRUE(contains(o.err, "(see devrt-inspect --help)")) << o.err;
  }
}

TEST(InspectCli, SimPropertiesImplySim) {
  auto o = parse_args({"--h200"});
  ASSERT_TRUE(o.has_value());
  EXPECT_EQ(o->device, device_choice::sim);
  auto devices = devices_of(*o);
  ASSERT_TRUE(devices.has_value());
  ASSERT_EQ(devices->size(), 1U);
  EXPECT_EQ(devices->front().name, "sim-h200");
  EXPECT_EQ(devices->front().props.capacity, 150'109'880'320ULL);

  o = parse_args({"--h200", "--capacity", "80GiB"});
  ASSERT_TRUE(o.has_value());
  devices = devices_of(*o);
  ASSERT_TRUE(devices.has_value());
  EXPECT_EQ(devices->front().props.capacity, 80 * GiB);
  EXPECT_EQ(devices->front().props.alignment, 512U);
}

}  // namespace
}  // namespace devrt::inspect
