// devrt-inspect snapshot, run whole: a bundled trace replayed to its peak, the snapshot written and
// checked, its figures printed; bad usage and unreadable traces are refused with the reason.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "inspect/cli.hpp"

namespace {

struct run_result {
  int code;
  std::string out;
  std::string err;
};

run_result run(const std::vector<std::string>& args) {
  std::ostringstream out;
  std::ostringstream err;
  const int code = devrt::inspect::run_cli(args, out, err);
  return {code, out.str(), err.str()};
}

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

const std::string trace = std::string(DEVRT_TRACES_DIR) + "/bert_serve.trace.gz";

}  // namespace

TEST(InspectSnapshot, WritesAPickleWhoseTotalsAreDevrtsFigures) {
  const std::string path = ::testing::TempDir() + "inspect_snapshot.pickle";
  const auto r = run({"snapshot", "--trace", trace, "--events", "4000", "-o", path});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("checks: ok"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("to the peak of live bytes"), std::string::npos) << r.out;
  // "total_reserved X (N bytes; devrt's reserved bytes: N)": the same N twice.
  for (const char* what : {"total_reserved", "total_allocated"}) {
    const auto at = r.out.find(what);
    ASSERT_NE(at, std::string::npos) << r.out;
    const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
    const auto open = line.find('(');
    const auto bytes = line.substr(open + 1, line.find(' ', open) - open - 1);
    EXPECT_NE(line.find(": " + bytes + ")"), std::string::npos) << line;
    EXPECT_NE(bytes, "0") << line;
  }
  const std::string pickle = read(path);
  ASSERT_GT(pickle.size(), 100u);
  EXPECT_EQ(pickle.substr(0, 2), std::string("\x80\x02", 2));
  EXPECT_NE(pickle.find("device_traces"), std::string::npos);
  EXPECT_NE(pickle.find("segment_alloc"), std::string::npos);
  std::remove(path.c_str());
}

TEST(InspectSnapshot, JsonToTheEndOnTheHost) {
  const std::string path = ::testing::TempDir() + "inspect_snapshot.json";
  const auto r = run({"snapshot", "--trace", trace, "--events", "2000", "--at", "end", "--device", "host", "--layout",
                      "sliced:page=64MiB,slice=8MiB;exclusive:max=1GiB", "--json", "-o", path});
  ASSERT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("2000 of 2000 events replayed on host"), std::string::npos) << r.out;
  const std::string json = read(path);
  EXPECT_EQ(json.rfind("{\"device\": \"host\"", 0), 0u) << json.substr(0, 80);
  EXPECT_NE(json.find("\"pool\": \"sliced 0\""), std::string::npos);
  std::remove(path.c_str());
}

TEST(InspectSnapshot, RefusesBadUsageAndSaysWhy) {
  auto r = run({"snapshot"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--trace FILE is required"), std::string::npos) << r.err;
  r = run({"snapshot", "--trace", trace, "--at", "middle"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--at is peak or end"), std::string::npos) << r.err;
  r = run({"snapshot", "--trace", trace, "--layout", "sliced:page=banana"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--layout"), std::string::npos) << r.err;
  r = run({"snapshot", "--trace", "/nonexistent/x.trace"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("/nonexistent/x.trace"), std::string::npos) << r.err;
  r = run({"snapshot", "--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("torch.cuda._memory_viz"), std::string::npos);
}
