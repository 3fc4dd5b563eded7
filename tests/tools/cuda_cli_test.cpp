// devrt-replay's CUDA options (--device cuda, --baseline, --compare) through run_cli. What is
// expected depends on the build and the machine:
//   built without CUDA             usage error "built without CUDA", exit code 2;
//   CUDA build, no usable GPU      exit code 1, the message names the CUDA error;
//   CUDA build with a GPU          the replay runs (exit code 0) and peak live is the trace's.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "replay/cli.hpp"
#include "replay/replay.hpp"
#include "tools/tools_test_util.hpp"

namespace devrt::replay {
namespace {

using testing::scratch_dir;
using testing::write_plain;

// Peak live 8000 bytes (see cli_test.cpp).
constexpr const char* by_hand = "a 0 3000\na 1 3000\nf 0\na 2 4000\na 3 1000\nf 1\nf 2\nf 3\na 4 0\nf 4\n";

struct run_output {
  int code;
  std::string out;
  std::string err;
};

run_output run(const std::vector<std::string>& args) {
  std::ostringstream out;
  std::ostringstream err;
  const int code = run_cli(args, out, err, false);
  return {code, out.str(), err.str()};
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

class ReplayCudaCli : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(ReplayCudaCli, RunsOrFailsClearly) {
  scratch_dir dir;
  std::vector<std::string> args{write_plain(dir.file("t.trace"), by_hand)};
  for (const auto& a : GetParam()) args.push_back(a);
  args.emplace_back("--json");
  const run_output r = run(args);
  if (!built_with_cuda()) {
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(contains(r.err, "built without CUDA")) << r.err;
    EXPECT_TRUE(r.out.empty());
    return;
  }
  const std::string reason = cuda_unavailable_reason();
  if (!reason.empty()) {
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(contains(r.err, "CUDA device 0 cannot be used")) << r.err;
    EXPECT_TRUE(contains(r.err, "cudaError")) << r.err;  // the CUDA error's name
    EXPECT_TRUE(r.out.empty());
    return;
  }
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "\"peak_live_bytes\": 8000,")) << r.out;
  EXPECT_TRUE(contains(r.out, "\"failures\": 0,")) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Options, ReplayCudaCli,
                         ::testing::Values(std::vector<std::string>{"--device", "cuda"},
                                           std::vector<std::string>{"--baseline", "cudaMalloc"},
                                           std::vector<std::string>{"--baseline=cudaMallocAsync"},
                                           std::vector<std::string>{"--compare"}));

TEST(ReplayCudaCli, BadCombinationsAreUsageErrors) {
  scratch_dir dir;
  const std::string trace = write_plain(dir.file("t.trace"), by_hand);
  const std::vector<std::vector<std::string>> cases{
      {"--baseline", "cudaFoo"},
      {"--device", "gpu"},
  };
  for (const auto& extra : cases) {
    std::vector<std::string> args{trace};
    args.insert(args.end(), extra.begin(), extra.end());
    const run_output r = run(args);
    EXPECT_EQ(r.code, 2) << extra.front();
    EXPECT_TRUE(contains(r.err, "bad value")) << r.err;
  }
  if (!built_with_cuda()) return;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cuda_cases{
      {{"--baseline", "cudaMalloc", "--threads", "2"}, "core mode only"},
      {{"--compare", "--threads", "2"}, "core mode only"},
      {{"--device", "cuda", "--threads", "2"}, "core mode only"},
      {{"--baseline", "cudaMalloc", "--compare"}, "do not go together"},
      {{"--baseline", "cudaMalloc", "--device", "sim"}, "does not apply"},
      {{"--compare", "--timeline", "x"}, "timeline"},
  };
  for (const auto& [extra, says] : cuda_cases) {
    std::vector<std::string> args{trace};
    args.insert(args.end(), extra.begin(), extra.end());
    const run_output r = run(args);
    EXPECT_EQ(r.code, 2) << extra.front();
    EXPECT_TRUE(contains(r.err, says)) << r.err;
  }
}

TEST(ReplayCudaCli, HelpNamesTheCudaOptions) {
  const run_output r = run({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.out, "--device sim|sim-gpu|host|cuda"));
  EXPECT_TRUE(contains(r.out, "--baseline cudaMalloc|cudaMallocAsync"));
  EXPECT_TRUE(contains(r.out, "--compare"));
}

}  // namespace
}  // namespace devrt::replay
