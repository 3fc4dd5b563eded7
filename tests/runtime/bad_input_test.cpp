// Bad input through the runtime and its clients, each case with the error code and the message the
// caller gets:
// - every client operation after shutdown that errors_test.cpp does not already cover (bind,
//   write, read, cleanup, configure, statistics, report, check_invariants, capture_begin,
//   capture_end, replay, synchronize) and a captured graph dropped after shutdown;
// - every invalid layout through configure and through the runtime's options;
// - zero-size and enormous requests through reserve and create, writes and reads on the sim device;
// - empty, never-initialized, stale and foreign handles given to write, read, submit and bind;
// - capture_end twice;
// - malformed configuration: a directory as the config file, a byte-order mark, a NUL byte, empty
//   and padded environment values.

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "devrt/runtime/runtime.hpp"
#include "runtime_test_util.hpp"

namespace {

using devrt::errc;
using devrt::devices::sim_options;
using devrt::memory::exclusive_pool_config;
using devrt::memory::memory_binding;
using devrt::memory::memory_handle;
using devrt::memory::memory_layout;
using devrt::memory::pool_config;
using devrt::memory::preset;
using devrt::memory::sliced_pool_config;
using devrt::runtime::compute_client;
using devrt::runtime::env_lookup;
using devrt::runtime::runtime;
using devrt::runtime::runtime_config;
using devrt::runtime::runtime_options;
using devrt::runtime::submit_context;
using devrt_test::failure_of;
using devrt_test::quiet_options;

constexpr std::uint64_t kib = 1ULL << 10;
constexpr std::uint64_t mib = 1ULL << 20;
constexpr std::uint64_t gib = 1ULL << 30;

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

sliced_pool_config sliced(std::uint64_t page, std::optional<std::uint64_t> slice = {},
                          std::optional<std::uint64_t> cap = {}, std::optional<std::uint64_t> period = {}) {
  sliced_pool_config c;
  c.page_size = page;
  c.max_slice_size = slice;
  c.max_pool_size = cap;
  c.dealloc_period = period;
  return c;
}

exclusive_pool_config exclusive(std::uint64_t max, std::optional<std::uint64_t> period = {}) {
  exclusive_pool_config c;
  c.max_alloc_size = max;
  c.dealloc_period = period;
  return c;
}

runtime_options with_sim(std::uint64_t capacity = 0) {
  runtime_options o = quiet_options();
  sim_options s;
  s.props.max_page_size = 64 * mib;
  s.props.alignment = 512;
  s.props.capacity = capacity;
  o.sim = s;
  return o;
}

/// Expects `f` to fail with `code` and a message holding every needle.
template <class Future>
void expect_failure(Future&& f, errc code, const std::vector<std::string>& needles, const std::string& what) {
  auto fail = failure_of(std::forward<Future>(f));
  EXPECT_FALSE(fail.threw_other) << what << ": " << fail.other;
  EXPECT_EQ(fail.code, code) << what << ": " << fail.what;
  for (const auto& n : needles) EXPECT_TRUE(contains(fail.what, n)) << what << ": " << fail.what;
}

// ---- Every operation after shutdown ----

TEST(BadInputShutdown, EveryRemainingOperationCompletesWithShutdown) {
  runtime rt(quiet_options());
  compute_client c = rt.host();
  memory_handle live = c.reserve(1000).get();
  memory_handle reserved = c.reserve(64).get();
  c.capture_begin().get();
  memory_handle pinned = c.reserve(256).get();
  auto graph = c.capture_end().get();
  ASSERT_EQ(graph.pins().size(), 1u);
  rt.shutdown();

  const std::vector<std::string> said{"the runtime is shut down"};
  expect_failure(c.bind(reserved, memory_handle::make()), errc::shutdown, said, "bind");
  expect_failure(c.write(live.binding(), std::vector<std::byte>(8)), errc::shutdown, said, "write");
  expect_failure(c.read(live.binding()), errc::shutdown, said, "read");
  expect_failure(c.cleanup(), errc::shutdown, said, "cleanup");
  expect_failure(c.configure(preset::exclusive_pages), errc::shutdown, said, "configure");
  expect_failure(c.statistics(), errc::shutdown, said, "statistics");
  expect_failure(c.report(), errc::shutdown, said, "report");
  expect_failure(c.check_invariants(), errc::shutdown, said, "check_invariants");
  expect_failure(c.capture_begin(), errc::shutdown, said, "capture_begin");
  expect_failure(c.capture_end(), errc::shutdown, said, "capture_end");
  expect_failure(c.replay(graph), errc::shutdown, said, "replay");
  expect_failure(c.synchronize(), errc::shutdown, said, "synchronize");
  // An invalid layout is refused on the caller's side before the actor is asked: the validation
  // error, not shutdown.
  expect_failure(c.configure(std::vector<pool_config>{}), errc::empty_pool_list, {"the pool list is empty"},
                 "invalid configure");
  // A graph captured before the shutdown releases its pins after it, safely.
  graph = {};
  pinned.reset();
  live.reset();
  reserved.reset();
}

// ---- Every invalid layout through the client and the runtime's options ----

struct invalid_layout {
  const char* name;
  memory_layout layout;
  errc code;
  const char* needle;
};

std::vector<invalid_layout> invalid_layouts() {
  return {
      {"empty pool list", std::vector<pool_config>{}, errc::empty_pool_list, "the pool list is empty"},
      {"too many pools", std::vector<pool_config>(255, exclusive(kib)), errc::too_many_pools, "255 pools given"},
      {"zero page", std::vector<pool_config>{sliced(0)}, errc::zero_size, "`page_size` must be non-zero"},
      {"zero slice", std::vector<pool_config>{sliced(kib, 0)}, errc::zero_size, "`max_slice_size`"},
      {"zero cap", std::vector<pool_config>{sliced(kib, std::nullopt, 0)}, errc::zero_size, "`max_pool_size`"},
      {"zero sliced period", std::vector<pool_config>{sliced(kib, std::nullopt, std::nullopt, 0)}, errc::zero_size,
       "`dealloc_period`"},
      {"zero exclusive period", std::vector<pool_config>{exclusive(kib, 0)}, errc::zero_size, "`dealloc_period`"},
      {"slice larger than page", std::vector<pool_config>{sliced(mib, 2 * mib)}, errc::slice_larger_than_page,
       "max_slice_size (2097152 bytes) is larger than page_size (1048576 bytes)"},
      {"cap smaller than page", std::vector<pool_config>{sliced(mib, std::nullopt, kib)}, errc::cap_smaller_than_page,
       "max_pool_size (1024 bytes) is smaller than page_size (1048576 bytes)"},
      {"too many pages", std::vector<pool_config>{sliced(kib, std::nullopt, gib)}, errc::too_many_pages,
       "1048576 pages"},
  };
}

TEST(BadInputLayout, EveryInvalidLayoutThroughConfigure) {
  runtime rt(with_sim());
  for (compute_client c : {rt.host(), rt.sim()}) {
    SCOPED_TRACE(c.device().name);
    memory_handle live = c.reserve(4096).get();
    // The actor counts a message after it completes it: wait for the count of the reserve.
    ASSERT_TRUE(devrt_test::wait_until([&] { return c.actor()->messages_processed() >= 1; }));
    const auto processed = c.actor()->messages_processed();
    for (const auto& l : invalid_layouts()) {
      expect_failure(c.configure(l.layout), l.code, {"invalid layout", l.needle}, l.name);
    }
    EXPECT_EQ(c.actor()->messages_processed(), processed) << "an invalid layout reached the actor";
    EXPECT_EQ(c.get_resource(live.binding()).get().size, 4096u);
    EXPECT_EQ(c.check_invariants().get(), "");
  }
}

devrt::memory::arena_pool_config arena(std::optional<std::uint64_t> granule = {}, std::optional<std::uint64_t> max = {},
                                       std::optional<std::uint64_t> space = {}) {
  devrt::memory::arena_pool_config c;
  c.granule = granule;
  c.max_alloc_size = max;
  c.address_space = space;
  return c;
}

TEST(BadInputLayout, InvalidArenasAndSizesAbove2To62ThroughConfigure) {
  runtime rt(with_sim());  // the host maps memory; this sim device does not
  compute_client host = rt.host();
  compute_client sim = rt.sim();
  ASSERT_GT(host.device().properties.map_granularity, 0u);
  ASSERT_EQ(sim.device().properties.map_granularity, 0u);
  const std::string no_mapping = "an arena pool maps memory into a reserved address range, and this device cannot";
  expect_failure(sim.configure(preset::arena), errc::mapping_unsupported, {no_mapping}, "arena preset on sim");
  expect_failure(sim.configure(std::vector<pool_config>{sliced(mib), arena()}), errc::mapping_unsupported,
                 {"(pool 1)", no_mapping}, "arena pool on sim");
  expect_failure(host.configure(std::vector<pool_config>{arena(0)}), errc::zero_size, {"`granule` must be non-zero"},
                 "zero granule");
  expect_failure(host.configure(std::vector<pool_config>{arena(std::nullopt, 64 * mib, 32 * mib)}),
                 errc::slice_larger_than_page, {"invalid layout (pool 0)"}, "max above the address space");
  for (compute_client c : {host, sim}) {
    expect_failure(c.configure(std::vector<pool_config>{sliced((std::uint64_t{1} << 62) + 1)}), errc::malformed_size,
                   {"page_size = 4611686018427387905", "at most 2^62"}, "page above 2^62");
  }
  expect_failure(host.configure(std::vector<pool_config>{arena(std::nullopt, std::nullopt, std::uint64_t{1} << 63)}),
                 errc::malformed_size, {"address_space", "at most 2^62"}, "address space above 2^62");
  // The runtime refuses to start with an arena on a device that cannot map.
  runtime_options o = with_sim();
  o.sim_layout = preset::arena;
  EXPECT_EQ(runtime::create(o).code(), errc::mapping_unsupported);
}

TEST(BadInputLayout, EveryInvalidLayoutInTheRuntimeOptions) {
  for (const auto& l : invalid_layouts()) {
    SCOPED_TRACE(l.name);
    for (const bool on_sim : {false, true}) {
      runtime_options o = with_sim();
      (on_sim ? o.sim_layout : o.host_layout) = l.layout;
      auto r = runtime::create(o);
      ASSERT_FALSE(r) << "a runtime started with an invalid " << (on_sim ? "sim" : "host") << " layout";
      EXPECT_EQ(r.code(), l.code) << r.err().message();
      EXPECT_TRUE(contains(r.err().message(), l.needle)) << r.err().message();
    }
  }
}

// ---- Zero-size and enormous requests ----

TEST(BadInputRequests, ZeroAndEnormousSizesThroughReserveAndCreate) {
  runtime rt(with_sim(4 * gib));
  for (compute_client c : {rt.host(), rt.sim()}) {
    SCOPED_TRACE(c.device().name);
    memory_handle zero = c.reserve(0).get();
    EXPECT_EQ(c.get_resource(zero.binding()).get().size, 0u);
    memory_handle created_zero = c.create(0);
    EXPECT_EQ(c.get_resource(created_zero.binding()).get().size, 0u);
    const std::uint64_t limit =
        c.device().properties.capacity != 0 ? c.device().properties.capacity : std::uint64_t{1} << 62;
    for (const std::uint64_t size : {limit + 1, std::numeric_limits<std::uint64_t>::max()}) {
      expect_failure(c.reserve(size), errc::buffer_too_big, {"cannot allocate " + std::to_string(size) + " bytes"},
                     "reserve");
      // create returns a handle at once; every use of it explains the failure.
      memory_handle h = c.create(size);
      ASSERT_FALSE(h.empty());
      expect_failure(c.get_resource(h.binding()), errc::buffer_too_big, {std::to_string(size)}, "create");
      expect_failure(c.read(h.binding()), errc::buffer_too_big, {std::to_string(size)}, "read after create");
    }
    EXPECT_EQ(c.memory_usage().get().bytes_in_use, 0u);
    EXPECT_EQ(c.check_invariants().get(), "");
  }
}

TEST(BadInputRequests, WritesAndReadsThatDoNotFit) {
  runtime rt(with_sim());
  compute_client host = rt.host();
  memory_handle h = host.reserve(16).get();
  expect_failure(host.write(h.binding(), std::vector<std::byte>(17)), errc::invalid_argument,
                 {"more bytes written than the allocation holds (17 > 16)"}, "oversized write");
  memory_handle zero = host.reserve(0).get();
  host.write(zero.binding(), {}).get();  // nothing to write is fine
  EXPECT_TRUE(host.read(zero.binding()).get().empty());
  // The sim device has no memory behind its allocations.
  compute_client sim = rt.sim();
  memory_handle s = sim.reserve(64).get();
  expect_failure(sim.write(s.binding(), std::vector<std::byte>(8)), errc::invalid_argument,
                 {"the simulated device has no memory to write to"}, "sim write");
  expect_failure(sim.read(s.binding()), errc::invalid_argument, {"the simulated device has no memory to read from"},
                 "sim read");
  EXPECT_EQ(sim.get_resource(s.binding()).get().ptr, nullptr);
}

// ---- Handles without memory ----

TEST(BadInputHandles, EmptyUnboundStaleAndForeignHandlesInEveryOperation) {
  runtime rt(with_sim());
  compute_client c = rt.host();
  memory_handle reserved = c.reserve(128).get();
  memory_handle stale = reserved;
  memory_handle owner = memory_handle::make();
  c.bind(std::move(reserved), owner).get();
  memory_handle foreign = rt.sim().reserve(128).get();  // memory of another device
  struct ref_case {
    const char* name;
    memory_binding binding;
    const char* needle;
  };
  const std::vector<ref_case> refs{
      {"empty", memory_binding{}, "the handle is empty"},
      {"never bound", memory_handle::make().binding(), "never initialized"},
      {"stale", stale.binding(), "stale"},
      {"foreign", foreign.binding(), "memory not found"},
  };
  for (const auto& r : refs) {
    SCOPED_TRACE(r.name);
    expect_failure(c.write(r.binding, std::vector<std::byte>(4)), errc::not_found, {r.needle}, "write");
    expect_failure(c.read(r.binding), errc::not_found, {r.needle}, "read");
    bool ran = false;
    expect_failure(c.submit({r.binding}, [&ran](submit_context&) { ran = true; }), errc::not_found, {r.needle},
                   "submit");
    EXPECT_FALSE(ran) << "a submit ran with a binding that does not resolve";
  }
  // bind: an empty handle to take the memory from, an empty handle to give it to.
  expect_failure(c.bind(memory_handle{}, memory_handle::make()), errc::not_found, {"the handle is empty"},
                 "bind from empty");
  memory_handle live = c.reserve(64).get();
  expect_failure(c.bind(live, memory_handle{}), errc::invalid_argument, {"the handle to bind is empty"},
                 "bind to empty");
  expect_failure(c.bind(foreign, memory_handle::make()), errc::not_found, {"memory not found"}, "bind foreign");
  EXPECT_EQ(c.get_resource(live.binding()).get().size, 64u) << "a failed bind consumed the memory";
  EXPECT_EQ(c.get_resource(owner.binding()).get().size, 128u);
  EXPECT_EQ(c.check_invariants().get(), "");
  EXPECT_EQ(rt.sim().check_invariants().get(), "");
}

// ---- Capture ----

TEST(BadInputCapture, CaptureEndTwice) {
  runtime rt(quiet_options());
  compute_client c = rt.host();
  c.capture_begin().get();
  c.capture_begin().get();  // a second begin keeps the first window
  memory_handle h = c.reserve(512).get();
  auto graph = c.capture_end().get();
  EXPECT_EQ(graph.pins().size(), 1u);
  expect_failure(c.capture_end(), errc::no_capture, {"no capture window is open", "without capture_begin"},
                 "second capture_end");
  EXPECT_TRUE(c.configure(preset::exclusive_pages).get().applied) << "the window is closed";
}

// ---- Configuration ----

/// A file in the test's temporary directory, removed afterwards.
class temp_path {
 public:
  explicit temp_path(const std::string& name) {
    path_ = ::testing::TempDir() + "devrt_bad_" + std::to_string(::getpid()) + "_" + name;
  }
  temp_path(const temp_path&) = delete;
  temp_path& operator=(const temp_path&) = delete;
  ~temp_path() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] const std::string& path() const { return path_; }
  void write(const std::string& text) const { std::ofstream(path_, std::ios::binary) << text; }

 private:
  std::string path_;
};

env_lookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(BadInputConfig, ADirectoryIsNotAConfigFile) {
  temp_path dir("dir.conf");
  std::filesystem::create_directory(dir.path());
  runtime_config cfg;
  auto r = devrt::runtime::apply_config_file(cfg, dir.path());
  ASSERT_FALSE(r) << "a directory was read as an empty config file";
  EXPECT_EQ(r.code(), errc::malformed_config);
  EXPECT_TRUE(contains(r.err().message(), dir.path())) << r.err().message();
}

TEST(BadInputConfig, MalformedFilesNameTheFileAndTheLine) {
  struct file_case {
    const char* name;
    std::string text;
    std::size_t line;
    const char* needle;
  };
  const std::vector<file_case> cases{
      {"byte-order mark", "\xEF\xBB\xBFpersistent_memory = enabled\n", 1, "unknown setting"},
      {"a NUL in a value", std::string("log_level = basic\0x\n", 20), 1, "log_level is one of"},
      {"binary garbage",
       std::string("\x7f"
                   "ELF\x02\x01\x01",
                   7),
       1, "expected `key = value`"},
      {"two equals signs", "log_level = basic = full\n", 1, "log_level is one of"},
      {"key in capitals", "\n\nLOG_LEVEL = basic\n", 3, "unknown setting"},
      {"mismatched quotes", "persistent_memory = 'enabled\"\n", 1, "persistent_memory is one of"},
      {"a later bad line", "log_level = basic\npersistent_memory = enforced\n# ok\nlog_level\n", 4,
       "expected `key = value`"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    temp_path f("file.conf");
    f.write(c.text);
    runtime_config cfg;
    auto r = devrt::runtime::apply_config_file(cfg, f.path());
    ASSERT_FALSE(r) << "accepted";
    EXPECT_EQ(r.code(), errc::malformed_config);
    const std::string msg = r.err().message();
    EXPECT_TRUE(contains(msg, f.path() + ":" + std::to_string(c.line) + ":")) << msg;
    EXPECT_TRUE(contains(msg, c.needle)) << msg;
    // The runtime refuses to start with it.
    runtime_options o = quiet_options();
    o.config_file = f.path();
    EXPECT_EQ(runtime::create(o).code(), errc::malformed_config);
  }
}

TEST(BadInputConfig, EmptyAndPaddedEnvironmentValues) {
  // Surrounding spaces and case are forgiven.
  auto padded = devrt::runtime::load_config(
      std::nullopt, env_of({{"DEVRT_LOG_LEVEL", "  Basic\t"}, {"DEVRT_PERSISTENT_MEMORY", " SIZE-MATCH "}}));
  ASSERT_TRUE(padded) << padded.err().message();
  EXPECT_EQ(padded->log, devrt::runtime::log_level::basic);
  EXPECT_EQ(padded->persistent_memory, devrt::memory::persistent_policy::size_match);
  // An empty or blank value is refused, naming the variable.
  for (const char* value : {"", "   "}) {
    for (const char* var : {"DEVRT_LOG_LEVEL", "DEVRT_PERSISTENT_MEMORY"}) {
      auto r = devrt::runtime::load_config(std::nullopt, env_of({{var, value}}));
      ASSERT_FALSE(r) << var << "='" << value << "' was accepted";
      EXPECT_EQ(r.code(), errc::malformed_config);
      EXPECT_TRUE(contains(r.err().message(), std::string(var) + "=" + value)) << r.err().message();
    }
  }
  // DEVRT_CONFIG naming a missing file is an error naming it.
  auto missing = devrt::runtime::load_config(std::nullopt, env_of({{"DEVRT_CONFIG", "/nonexistent/devrt.conf"}}));
  ASSERT_FALSE(missing);
  EXPECT_TRUE(contains(missing.err().message(), "/nonexistent/devrt.conf")) << missing.err().message();
  EXPECT_TRUE(contains(missing.err().message(), "cannot be read")) << missing.err().message();
}

}  // namespace
