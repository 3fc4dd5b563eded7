// Runtime configuration: the config file format, its errors (naming the file and line), the
// environment overrides, DEVRT_CONFIG, and the runtime's use of the result (policies).

#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "devrt/runtime/runtime.hpp"
#include "runtime_test_util.hpp"

namespace {

using devrt::errc;
using devrt::memory::memory_handle;
using devrt::memory::persistent_policy;
using devrt::memory::preset;
using devrt::memory::sliced_pool_config;
using devrt::runtime::apply_config_file;
using devrt::runtime::apply_config_text;
using devrt::runtime::env_lookup;
using devrt::runtime::load_config;
using devrt::runtime::log_level;
using devrt::runtime::parse_log_level;
using devrt::runtime::runtime;
using devrt::runtime::runtime_config;
using devrt::runtime::runtime_options;
using devrt_test::quiet_options;

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

/// A config file in the test's temporary directory, removed afterwards.
class temp_file {
 public:
  explicit temp_file(const std::string& text) {
    static int counter = 0;
    path_ =
        ::testing::TempDir() + "devrt_config_" + std::to_string(::getpid()) + "_" + std::to_string(++counter) + ".conf";
    std::ofstream out(path_);
    out << text;
  }
  temp_file(const temp_file&) = delete;
  temp_file& operator=(const temp_file&) = delete;
  ~temp_file() { std::remove(path_.c_str()); }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  std::string path_;
};

env_lookup fake_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(ConfigText, ValidSettingsCommentsAndQuotes) {
  runtime_config cfg;
  const char* text =
      "# devrt configuration\n"
      "\n"
      "   persistent_memory = size-match   # weights only\n"
      "log_level=\"basic\"\n"
      "  # indented comment\n";
  auto r = apply_config_text(cfg, text, "test.conf");
  ASSERT_TRUE(r) << r.err().message();
  EXPECT_EQ(cfg.persistent_memory, persistent_policy::size_match);
  EXPECT_EQ(cfg.log, log_level::basic);

  ASSERT_TRUE(apply_config_text(cfg, "persistent_memory = 'enforced'\r\nlog_level = FULL\r\n", "crlf.conf"));
  EXPECT_EQ(cfg.persistent_memory, persistent_policy::enforced);
  EXPECT_EQ(cfg.log, log_level::full);
  ASSERT_TRUE(apply_config_text(cfg, "persistent_memory = disabled\nlog_level = off", "x"));  // no final newline
  EXPECT_EQ(cfg.persistent_memory, persistent_policy::disabled);
  EXPECT_EQ(cfg.log, log_level::disabled);
  ASSERT_TRUE(apply_config_text(cfg, "", "empty.conf"));
  ASSERT_TRUE(apply_config_text(cfg, "# only a comment", "comment.conf"));
  EXPECT_EQ(cfg.persistent_memory, persistent_policy::disabled) << "nothing set, nothing changed";
}

TEST(ConfigText, Defaults) {
  runtime_config cfg;
  EXPECT_EQ(cfg.persistent_memory, persistent_policy::enabled);
  EXPECT_EQ(cfg.log, log_level::disabled);
}

struct malformed_case {
  const char* text;
  std::size_t line;
  const char* needle;
};

TEST(ConfigText, EachMalformedLineIsRefusedNamingFileAndLine) {
  const malformed_case cases[] = {
      {"log_level = basic\ncolour = red\n", 2, "unknown setting"},
      {"persistent_memory enabled\n", 1, "expected `key = value`"},
      {"# c\n\npersistent_memory = sometimes\n", 3, "persistent_memory is one of enabled, size-match"},
      {"log_level = loud\n", 1, "log_level is one of disabled, basic, full"},
      {"pools = sliced:page=64MiB\n", 1, "pool layouts are not read from config files"},
      {"log_level = basic\nlayout = exclusive-pages\n", 2, "set them with configure()"},
      {"= enabled\n", 1, "unknown setting"},
      {"persistent_memory = \n", 1, "persistent_memory is one of"},
      {"serve_in_place = sometimes\n", 1, "serve_in_place is true or false"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    runtime_config cfg;
    auto r = apply_config_text(cfg, c.text, "/etc/devrt.conf");
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), errc::malformed_config);
    const std::string m = r.err().message();
    EXPECT_TRUE(contains(m, "/etc/devrt.conf:" + std::to_string(c.line) + ":")) << m;
    EXPECT_TRUE(contains(m, c.needle)) << m;
  }
}

TEST(ConfigText, ServeInPlaceIsASwitch) {
  runtime_config cfg;
  EXPECT_TRUE(cfg.serve_in_place) << "requests are served in place by default";
  ASSERT_TRUE(apply_config_text(cfg, "serve_in_place = false\n", "x"));
  EXPECT_FALSE(cfg.serve_in_place);
  ASSERT_TRUE(apply_config_text(cfg, "serve_in_place = ON\n", "x"));
  EXPECT_TRUE(cfg.serve_in_place);
  for (const char* yes : {"1", "true", " On ", "YES"}) EXPECT_TRUE(devrt::runtime::parse_switch(yes).value()) << yes;
  for (const char* no : {"0", "False", "off", "no"}) EXPECT_FALSE(devrt::runtime::parse_switch(no).value()) << no;
  for (const char* bad : {"", "2", "enabled", "truth"}) {
    auto r = devrt::runtime::parse_switch(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.code(), errc::malformed_config);
  }
}

TEST(ConfigText, ParseLogLevel) {
  EXPECT_EQ(parse_log_level("disabled").value(), log_level::disabled);
  EXPECT_EQ(parse_log_level("OFF").value(), log_level::disabled);
  EXPECT_EQ(parse_log_level(" Basic ").value(), log_level::basic);
  EXPECT_EQ(parse_log_level("full").value(), log_level::full);
  EXPECT_EQ(parse_log_level("verbose").code(), errc::malformed_config);
  EXPECT_STREQ(devrt::runtime::to_string(log_level::basic), "basic");
}

TEST(ConfigFile, ReadsAFile) {
  temp_file f("persistent_memory = enforced\nlog_level = basic\n");
  runtime_config cfg;
  ASSERT_TRUE(apply_config_file(cfg, f.path()));
  EXPECT_EQ(cfg.persistent_memory, persistent_policy::enforced);
  EXPECT_EQ(cfg.log, log_level::basic);
}

TEST(ConfigFile, ErrorsNameTheFileAndLine) {
  temp_file f("log_level = basic\n\n# fine so far\nmax_memory = 4GiB\n");
  runtime_config cfg;
  auto r = apply_config_file(cfg, f.path());
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::malformed_config);
  EXPECT_TRUE(contains(r.err().message(), f.path() + ":4: max_memory = 4GiB")) << r.err().message();
}

TEST(ConfigFile, UnreadableFile) {
  const std::string path = ::testing::TempDir() + "devrt_no_such_dir/none.conf";
  runtime_config cfg;
  auto r = apply_config_file(cfg, path);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::malformed_config);
  EXPECT_TRUE(contains(r.err().message(), path)) << r.err().message();
  EXPECT_TRUE(contains(r.err().message(), "cannot be read")) << r.err().message();
  auto l = load_config(path, fake_env({}));
  ASSERT_FALSE(l);
  EXPECT_TRUE(contains(l.err().message(), path)) << l.err().message();
}

TEST(ConfigLoad, DefaultsWithoutFileOrEnvironment) {
  auto cfg = load_config(std::nullopt, fake_env({}));
  ASSERT_TRUE(cfg) << cfg.err().message();
  EXPECT_EQ(cfg->persistent_memory, persistent_policy::enabled);
  EXPECT_EQ(cfg->log, log_level::disabled);
}

TEST(ConfigLoad, EnvironmentOverrides) {
  auto cfg =
      load_config(std::nullopt, fake_env({{"DEVRT_PERSISTENT_MEMORY", "size-match"}, {"DEVRT_LOG_LEVEL", "full"}}));
  ASSERT_TRUE(cfg) << cfg.err().message();
  EXPECT_EQ(cfg->persistent_memory, persistent_policy::size_match);
  EXPECT_EQ(cfg->log, log_level::full);
}

TEST(ConfigLoad, BadEnvironmentValuesNameTheVariable) {
  auto a = load_config(std::nullopt, fake_env({{"DEVRT_LOG_LEVEL", "loud"}}));
  ASSERT_FALSE(a);
  EXPECT_EQ(a.code(), errc::malformed_config);
  EXPECT_TRUE(contains(a.err().message(), "DEVRT_LOG_LEVEL=loud")) << a.err().message();
  EXPECT_TRUE(contains(a.err().message(), "disabled, basic, full")) << a.err().message();
  auto b = load_config(std::nullopt, fake_env({{"DEVRT_PERSISTENT_MEMORY", "always"}}));
  ASSERT_FALSE(b);
  EXPECT_EQ(b.code(), errc::malformed_config);
  EXPECT_TRUE(contains(b.err().message(), "DEVRT_PERSISTENT_MEMORY=always")) << b.err().message();
  auto c = load_config(std::nullopt, fake_env({{"DEVRT_SERVE_IN_PLACE", "maybe"}}));
  ASSERT_FALSE(c);
  EXPECT_EQ(c.code(), errc::malformed_config);
  EXPECT_TRUE(contains(c.err().message(), "DEVRT_SERVE_IN_PLACE=maybe")) << c.err().message();
  auto d = load_config(std::nullopt, fake_env({{"DEVRT_SERVE_IN_PLACE", "0"}}));
  ASSERT_TRUE(d) << d.err().message();
  EXPECT_FALSE(d->serve_in_place);
}

TEST(ConfigLoad, DevrtConfigNamesTheFileAndTheEnvironmentWins) {
  temp_file f("persistent_memory = disabled\nlog_level = basic\n");
  auto from_file = load_config(std::nullopt, fake_env({{"DEVRT_CONFIG", f.path()}}));
  ASSERT_TRUE(from_file) << from_file.err().message();
  EXPECT_EQ(from_file->persistent_memory, persistent_policy::disabled);
  EXPECT_EQ(from_file->log, log_level::basic);

  auto overridden =
      load_config(std::nullopt, fake_env({{"DEVRT_CONFIG", f.path()}, {"DEVRT_PERSISTENT_MEMORY", "enforced"}}));
  ASSERT_TRUE(overridden) << overridden.err().message();
  EXPECT_EQ(overridden->persistent_memory, persistent_policy::enforced);
  EXPECT_EQ(overridden->log, log_level::basic);

  // An explicit file is used instead of DEVRT_CONFIG.
  temp_file other("log_level = full\n");
  auto explicit_file = load_config(other.path(), fake_env({{"DEVRT_CONFIG", "/nonexistent/devrt.conf"}}));
  ASSERT_TRUE(explicit_file) << explicit_file.err().message();
  EXPECT_EQ(explicit_file->log, log_level::full);
  EXPECT_EQ(explicit_file->persistent_memory, persistent_policy::enabled);

  // An empty DEVRT_CONFIG names no file.
  EXPECT_TRUE(load_config(std::nullopt, fake_env({{"DEVRT_CONFIG", ""}})));

  temp_file bad("log_level = basic\npools = exclusive-pages\n");
  auto refused = load_config(std::nullopt, fake_env({{"DEVRT_CONFIG", bad.path()}}));
  ASSERT_FALSE(refused);
  EXPECT_TRUE(contains(refused.err().message(), bad.path() + ":2:")) << refused.err().message();
}

// ---- The runtime and its configuration ----

TEST(ConfigRuntime, CreateReturnsTheConfigurationError) {
  temp_file bad("persistent_memory = enabled\nlog_level = chatty\n");
  runtime_options o = quiet_options();
  o.config_file = bad.path();
  auto r = runtime::create(o);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::malformed_config);
  EXPECT_TRUE(contains(r.err().message(), bad.path() + ":2:")) << r.err().message();
  // The constructor throws the same error.
  try {
    runtime rt(o);
    ADD_FAILURE() << "a malformed config file was accepted";
  } catch (const devrt::exception& e) {
    EXPECT_EQ(e.code(), errc::malformed_config);
  }
  o.config_file = ::testing::TempDir() + "devrt_missing.conf";
  EXPECT_EQ(runtime::create(o).code(), errc::malformed_config);
}

TEST(ConfigRuntime, CreateReturnsAnInvalidLayout) {
  runtime_options o = quiet_options();
  o.host_layout = std::vector<devrt::memory::pool_config>{sliced_pool_config{1 << 20, 4 << 20}};
  auto r = runtime::create(o);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::slice_larger_than_page);
}

TEST(ConfigRuntime, AValidFileIsApplied) {
  temp_file f("persistent_memory = size-match\n");
  runtime_options o = quiet_options();
  o.config_file = f.path();
  auto r = runtime::create(o);
  ASSERT_TRUE(r) << r.err().message();
  EXPECT_EQ((*r)->config().persistent_memory, persistent_policy::size_match);
  EXPECT_TRUE(contains((*r)->host().report().get(), "persistent policy: size-match"));
}

TEST(ConfigRuntime, OptionsOverrideTheFile) {
  temp_file f("persistent_memory = disabled\nlog_level = disabled\n");
  runtime_options o = quiet_options();
  o.config_file = f.path();
  o.persistent_memory = persistent_policy::enforced;
  runtime rt(o);
  EXPECT_EQ(rt.config().persistent_memory, persistent_policy::enforced);
}

TEST(ConfigRuntime, ProcessEnvironmentIsReadOnlyWhenAsked) {
  ASSERT_EQ(::setenv("DEVRT_PERSISTENT_MEMORY", "bogus", 1), 0);
  runtime_options o;
  o.use_cuda = false;
  o.use_environment = true;
  auto with_env = runtime::create(o);
  runtime_options q = quiet_options();
  auto without_env = runtime::create(q);
  ::unsetenv("DEVRT_PERSISTENT_MEMORY");
  ASSERT_FALSE(with_env);
  EXPECT_TRUE(contains(with_env.err().message(), "DEVRT_PERSISTENT_MEMORY=bogus")) << with_env.err().message();
  EXPECT_TRUE(without_env) << "use_environment=false must ignore DEVRT_* variables";
}

TEST(ConfigRuntime, EnforcedPolicyMakesHostReservesPersistent) {
  runtime_options o = quiet_options();
  o.persistent_memory = persistent_policy::enforced;
  runtime rt(o);
  auto c = rt.host();
  memory_handle a = c.reserve(1000).get();
  memory_handle b = c.create(3000);
  {
    auto scope = c.persistent();  // changes nothing under enforced
  }
  memory_handle d = c.reserve(500).get();
  const std::string report = c.report().get();
  EXPECT_TRUE(contains(report, "persistent policy: enforced; mode: persistent")) << report;
  EXPECT_TRUE(contains(report, "persistent pool: 3 slices")) << report;
  // Nothing lives in the dynamic pools, so a reconfiguration applies with all three alive.
  EXPECT_TRUE(c.configure(preset::exclusive_pages).get().applied);
  EXPECT_EQ(c.memory_usage().get().bytes_in_use, 4500u);
  EXPECT_EQ(c.check_invariants().get(), "");
}

TEST(ConfigRuntime, SizeMatchAndDisabledPolicies) {
  {
    runtime_options o = quiet_options();
    o.persistent_memory = persistent_policy::size_match;
    runtime rt(o);
    auto c = rt.host();
    memory_handle w;
    {
      auto scope = c.persistent();
      w = c.reserve(1000).get();
    }
    memory_handle same = c.reserve(1000).get();   // a persistent slice of this size exists
    memory_handle other = c.reserve(5000).get();  // none of this size: dynamic
    EXPECT_TRUE(contains(c.report().get(), "persistent pool: 2 slices")) << c.report().get();
  }
  {
    runtime_options o = quiet_options();
    o.persistent_memory = persistent_policy::disabled;
    runtime rt(o);
    auto c = rt.host();
    memory_handle h;
    {
      auto scope = c.persistent();  // ignored under disabled
      h = c.reserve(1000).get();
    }
    EXPECT_TRUE(contains(c.report().get(), "persistent pool: 0 slices")) << c.report().get();
    EXPECT_FALSE(c.configure(preset::exclusive_pages).get().applied) << "the reserve was dynamic";
  }
}

}  // namespace

TEST(ConfigLoad, TheMemoryLimitIsBytesOrAShareOfTheDeviceAndBadValuesAreRefused) {
  using devrt::runtime::parse_memory_limit;
  EXPECT_EQ(parse_memory_limit("40GiB").value().bytes, 40ULL << 30);
  EXPECT_EQ(parse_memory_limit("1073741824").value().bytes, 1ULL << 30);
  EXPECT_DOUBLE_EQ(parse_memory_limit("0.8").value().share, 0.8);
  EXPECT_DOUBLE_EQ(parse_memory_limit(" 80% ").value().share, 0.8);
  EXPECT_DOUBLE_EQ(parse_memory_limit("1").value().share, 1.0) << "1 is the whole device, not a byte";
  EXPECT_EQ(parse_memory_limit("none").value().on(1000), 0u);
  EXPECT_EQ(parse_memory_limit("0").value().on(1000), 0u);
  EXPECT_EQ(parse_memory_limit("50%").value().on(1000), 500u);
  EXPECT_EQ(parse_memory_limit("0.5").value().on(0), 0u) << "a share of a device of unknown size: no limit";
  EXPECT_EQ(parse_memory_limit("2MiB").value().on(0), 2u << 20) << "bytes hold on every device";
  for (const char* bad : {"", "1.5", "150%", "0%", "-1", "lots", "0.5GiB%", "%"}) {
    auto r = parse_memory_limit(bad);
    EXPECT_FALSE(r) << "'" << bad << "' was accepted";
    if (!r) {
      EXPECT_EQ(r.code(), errc::malformed_config);
    }
  }
  auto env = load_config(std::nullopt, fake_env({{"DEVRT_MEMORY_LIMIT", "lots"}}));
  ASSERT_FALSE(env);
  EXPECT_TRUE(contains(env.err().message(), "DEVRT_MEMORY_LIMIT=lots")) << env.err().message();
  EXPECT_TRUE(contains(env.err().message(), "0.8, 80%")) << env.err().message();
  auto ok = load_config(std::nullopt, fake_env({{"DEVRT_MEMORY_LIMIT", "64MiB"}}));
  ASSERT_TRUE(ok) << ok.err().message();
  ASSERT_TRUE(ok->memory_limit);
  EXPECT_EQ(ok->memory_limit->bytes, 64u << 20);
  runtime_config cfg;
  ASSERT_TRUE(apply_config_text(cfg, "memory_limit = 75%\n", "test.conf"));
  ASSERT_TRUE(cfg.memory_limit);
  EXPECT_DOUBLE_EQ(cfg.memory_limit->share, 0.75);
  auto bad_line = apply_config_text(cfg, "memory_limit = plenty\n", "test.conf");
  ASSERT_FALSE(bad_line);
  EXPECT_TRUE(contains(bad_line.err().message(), "test.conf:1")) << bad_line.err().message();
}

TEST(ConfigLoad, TheMemoryLimitReachesEveryDeviceAndCanBeChangedThere) {
  runtime_options o = quiet_options();
  o.host_layout = preset::automatic;  // the arena: the limit counts what is mapped, not whole pages
  o.memory_limit = devrt::runtime::memory_limit_spec{32ULL << 20, 0};
  runtime rt(o);
  auto c = rt.host();
  EXPECT_EQ(c.memory_limit().get(), 32ULL << 20);
  memory_handle a = c.reserve(20ULL << 20).get();
  const auto f = devrt_test::failure_of(c.reserve(20ULL << 20));
  EXPECT_EQ(devrt::runtime::to_errc(f.code), errc::out_of_memory) << f.what;
  EXPECT_TRUE(contains(f.what, "memory limit")) << f.what;
  c.set_memory_limit(0).get();
  EXPECT_EQ(c.memory_limit().get(), 0u);
  memory_handle b = c.reserve(20ULL << 20).get();
  EXPECT_NE(b.ptr(), nullptr) << "no limit: served";
}
