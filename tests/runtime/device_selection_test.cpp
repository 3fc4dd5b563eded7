// Which CUDA devices the runtime uses: runtime_options::cuda_devices, DEVRT_CUDA_DEVICES and the
// config file's cuda_devices, validated with or without CUDA; a device's actor is created on its
// first use only.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "devrt/runtime/config.hpp"
#include "devrt/runtime/runtime.hpp"
#include "runtime_test_util.hpp"

#ifdef DEVRT_WITH_CUDA
#include "devrt/devices/cuda_storage.hpp"
#endif

namespace {

using devrt::errc;
using devrt::runtime::device_kind;
using devrt::runtime::load_config;
using devrt::runtime::parse_device_list;
using devrt::runtime::runtime;
using devrt_test::quiet_options;

bool contains(const std::string& s, const std::string& n) { return s.find(n) != std::string::npos; }

int visible_cuda_devices() {
#ifdef DEVRT_WITH_CUDA
  return devrt::devices::cuda_device_count();
#else
  return 0;
#endif
}

TEST(DeviceSelection, ParsesDeviceLists) {
  EXPECT_EQ(parse_device_list("0,2").value(), (std::vector<int>{0, 2}));
  EXPECT_EQ(parse_device_list(" 3 , 1 ").value(), (std::vector<int>{3, 1}));
  EXPECT_EQ(parse_device_list("7").value(), (std::vector<int>{7}));
  EXPECT_TRUE(parse_device_list("none").value().empty());
  for (const char* bad : {"", " ", "a", "-1", "1,,2", "1,", ",1", "1,1", "0x1", "1.5", "+1", "9999999"}) {
    SCOPED_TRACE(bad);
    auto r = parse_device_list(bad);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), errc::malformed_config);
    EXPECT_TRUE(contains(r.err().message(), std::string("'") + bad + "'")) << r.err().message();
  }
}

TEST(DeviceSelection, TheEnvironmentAndTheConfigFileChooseDevices) {
  auto env = [](const char* value) {
    return devrt::runtime::env_lookup([value](const char* name) -> std::optional<std::string> {
      if (std::string(name) == "DEVRT_CUDA_DEVICES") return std::string(value);
      return std::nullopt;
    });
  };
  auto cfg = load_config(std::nullopt, env("1,0"));
  ASSERT_TRUE(cfg) << cfg.err().message();
  EXPECT_EQ(cfg->cuda_devices, (std::vector<int>{1, 0}));
  auto none = load_config(std::nullopt, env("none"));
  ASSERT_TRUE(none);
  EXPECT_EQ(none->cuda_devices, std::vector<int>{});
  auto bad = load_config(std::nullopt, env("0;1"));
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.code(), errc::malformed_config);
  EXPECT_TRUE(contains(bad.err().message(), "DEVRT_CUDA_DEVICES=0;1")) << bad.err().message();
  EXPECT_TRUE(contains(bad.err().message(), "CUDA_VISIBLE_DEVICES")) << bad.err().message();
  auto unset = load_config(std::nullopt, env("0"));
  ASSERT_TRUE(unset);

  devrt::runtime::runtime_config file;
  ASSERT_TRUE(devrt::runtime::apply_config_text(file, "cuda_devices = 2, 3\n", "test.conf"));
  EXPECT_EQ(file.cuda_devices, (std::vector<int>{2, 3}));
  auto wrong = devrt::runtime::apply_config_text(file, "log_level = basic\ncuda_devices = two\n", "test.conf");
  ASSERT_FALSE(wrong);
  EXPECT_EQ(wrong.code(), errc::malformed_config);
  EXPECT_TRUE(contains(wrong.err().message(), "test.conf:2")) << wrong.err().message();
  EXPECT_EQ(load_config(std::nullopt, [](const char*) { return std::optional<std::string>(); })->cuda_devices,
            std::nullopt);
}

TEST(DeviceSelection, NegativeOrRepeatedIndicesAreRefusedAtStart) {
  for (const auto& list : {std::vector<int>{-1}, std::vector<int>{0, 1, 0}}) {
    auto opts = quiet_options();
    opts.use_cuda = true;
    opts.cuda_devices = list;
    auto r = runtime::create(opts);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), errc::invalid_argument) << r.err().message();
    EXPECT_TRUE(contains(r.err().message(), "cuda_devices")) << r.err().message();
  }
}

TEST(DeviceSelection, ADeviceThatIsNotThereIsNotFound) {
  auto opts = quiet_options();
  opts.use_cuda = true;
  const int visible = visible_cuda_devices();
  opts.cuda_devices = std::vector<int>{visible + 3};
  runtime rt(opts);
  EXPECT_EQ(rt.count(device_kind::cuda), 0);
  for (const auto& d : rt.devices()) EXPECT_NE(d.kind, device_kind::cuda) << d.name;
  try {
    (void)rt.cuda(visible + 3);
    ADD_FAILURE() << "a client of a device that is not there";
  } catch (const devrt::exception& e) {
    EXPECT_EQ(e.code(), errc::not_found);
    EXPECT_TRUE(contains(e.what(), "cuda:" + std::to_string(visible + 3))) << e.what();
    EXPECT_TRUE(contains(e.what(), "CUDA")) << e.what();
  }
  EXPECT_FALSE(rt.started(device_kind::cuda, visible + 3));
  EXPECT_THROW((void)rt.cuda(-1), devrt::exception);
  // The host is unaffected.
  EXPECT_TRUE(rt.started(device_kind::host));
  EXPECT_EQ(rt.host().reserve(64).get().use_count(), 1u);
}

TEST(DeviceSelection, TheRuntimeReadsDevrtCudaDevices) {
  // No other runtime is alive here: the variable is read at start.
  ::setenv("DEVRT_CUDA_DEVICES", "0,zero", 1);
  auto opts = quiet_options();
  opts.use_environment = true;
  auto r = runtime::create(opts);
  ::unsetenv("DEVRT_CUDA_DEVICES");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::malformed_config);
  EXPECT_TRUE(contains(r.err().message(), "DEVRT_CUDA_DEVICES=0,zero")) << r.err().message();
  // Options override the environment.
  ::setenv("DEVRT_CUDA_DEVICES", "none", 1);
  opts.use_cuda = true;
  opts.cuda_devices = std::vector<int>{0};
  runtime rt(opts);
  ::unsetenv("DEVRT_CUDA_DEVICES");
  EXPECT_EQ(rt.count(device_kind::cuda), visible_cuda_devices() > 0 ? 1 : 0);
}

TEST(DeviceSelection, ACudaDeviceStartsOnItsFirstUse) {
  const int visible = visible_cuda_devices();
  if (visible == 0) GTEST_SKIP() << "no CUDA device: the lazy start is checked where there is one";
  auto opts = quiet_options();
  opts.use_cuda = true;
  runtime rt(opts);
  EXPECT_EQ(rt.count(device_kind::cuda), visible);
  for (int i = 0; i < visible; ++i) EXPECT_FALSE(rt.started(device_kind::cuda, i)) << i;
  auto c = rt.cuda(visible - 1);
  EXPECT_TRUE(rt.started(device_kind::cuda, visible - 1));
  for (int i = 0; i + 1 < visible; ++i) EXPECT_FALSE(rt.started(device_kind::cuda, i)) << i;
  EXPECT_EQ(c.actor(), rt.cuda(visible - 1).actor()) << "one actor per device";
  EXPECT_EQ(c.reserve(4096).get().use_count(), 1u);
}

}  // namespace
