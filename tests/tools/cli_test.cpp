// devrt-replay end to end through run_cli: exit codes, human and JSON output, the timeline files.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/json_text.hpp"
#include "replay/cli.hpp"
#include "tools/tools_test_util.hpp"

namespace devrt::replay {
namespace {

using testing::scratch_dir;
using testing::write_gz;
using testing::write_plain;

// Peak live 8000 bytes; on one 4 KiB-page sliced pool, peak reserved 8192 (see replay_test.cpp).
constexpr const char* by_hand =
    "# {\"scenario\": \"by-hand\"}\na 0 3000\na 1 3000\nf 0\na 2 4000\na 3 1000\nf 1\nf 2\nf 3\n";

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

/// Sets PATH for the scope of a test, then puts it back. (The environment calls are not thread
/// safe; no other thread runs while a test of this suite does.)
// NOLINTBEGIN(concurrency-mt-unsafe)
class path_override {
 public:
  explicit path_override(const std::string& value) {
    if (const char* p = std::getenv("PATH")) old_ = p;
    ::setenv("PATH", value.c_str(), 1);
  }
  path_override(const path_override&) = delete;
  path_override& operator=(const path_override&) = delete;
  ~path_override() {
    if (old_) {
      ::setenv("PATH", old_->c_str(), 1);
    } else {
      ::unsetenv("PATH");
    }
  }

 private:
  std::optional<std::string> old_;
};
// NOLINTEND(concurrency-mt-unsafe)

TEST(ReplayCli, HelpExitsZero) {
  const auto r = run({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.out, "usage: devrt-replay TRACE"));
  EXPECT_TRUE(contains(r.out, "--timeline PREFIX"));
}

struct usage_case {
  std::vector<std::string> args;
  const char* what;
};

class ReplayCliUsage : public ::testing::TestWithParam<usage_case> {};

TEST_P(ReplayCliUsage, BadUsageExitsTwoWithAClearMessage) {
  const auto r = run(GetParam().args);
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, GetParam().what)) << r.err;
  EXPECT_TRUE(r.out.empty());
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ReplayCliUsage,
    ::testing::Values(usage_case{{}, "no trace given"}, usage_case{{"t", "--bogus"}, "unknown option '--bogus'"},
                      usage_case{{"t", "-x"}, "unknown option '-x'"},
                      usage_case{{"t", "u"}, "more than one trace given"},
                      usage_case{{"t", "--threads"}, "option --threads needs a value"},
                      usage_case{{"t", "--threads", "0"}, "bad value for --threads: '0'"},
                      usage_case{{"t", "--threads=many"}, "bad value for --threads: 'many'"},
                      usage_case{{"t", "--limit", "-3"}, "bad value for --limit: '-3'"},
                      usage_case{{"t", "--device", "gpu"}, "bad value for --device: 'gpu'"},
                      usage_case{{"t", "--format", "csv"}, "bad value for --format: 'csv'"},
                      usage_case{{"t", "--layout", "pools-please"}, "bad value for --layout"},
                      usage_case{{"t", "--layout", "sliced:page=4KiB,slice=8KiB", "--device", "host"},
                                 "bad value for --layout on the host device"},
                      usage_case{{"t", "--timeline-format", "jpg"}, "bad value for --timeline-format: 'jpg'"},
                      usage_case{{"t", "--json=yes"}, "option --json takes no value"},
                      usage_case{{"t", "--wait"}, "--wait needs --threads"},
                      usage_case{{"t", "--threads", "2", "--timeline", "x"}, "--timeline works in core mode only"},
                      usage_case{{"t", "--gpu-lag", "-1", "--device", "sim-gpu"}, "bad value for --gpu-lag: '-1'"},
                      usage_case{{"t", "--timeline-format", "svg"}, "--timeline-format needs --timeline PREFIX"},
                      usage_case{{"t", "--threads", "2", "--strict"}, "--strict in actor mode needs --wait"},
                      usage_case{{"t", "--gpu-lag", "2000000", "--device", "sim-gpu"},
                                 "bad value for --gpu-lag: '2000000'"},
                      usage_case{{"t", "--gpu-lag", "8"}, "--gpu-lag needs --device sim-gpu"},
                      usage_case{{"t", "--gpu-lag", "8", "--device", "sim-gpu", "--threads", "2"},
                                 "--gpu-lag needs --device sim-gpu in core mode"}));

TEST(ReplayCli, UnreadableOrMalformedTraceExitsOne) {
  scratch_dir dir;
  const auto missing = run({dir.file("none.trace.gz")});
  EXPECT_EQ(missing.code, 1);
  EXPECT_TRUE(contains(missing.err, "none.trace.gz: cannot open")) << missing.err;

  const std::string bad = write_gz(dir.file("bad.trace.gz"), "a 0 1\na 1 two\n");
  const auto r = run({bad});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, bad + ":2: size 'two'")) << r.err;
}

// Traces a replay cannot stand for: no events, sizes no allocation can have, bytes that are not
// text; and a memory limit that rounds to nothing.
TEST(ReplayCli, TracesAndLimitsThatMeanNothingAreRefused) {
  scratch_dir dir;
  const std::string empty = write_plain(dir.file("empty.trace"), "");
  const auto e = run({empty});
  EXPECT_EQ(e.code, 1);
  EXPECT_TRUE(contains(e.err, empty + ": the trace has no events")) << e.err;

  const std::string huge = write_plain(dir.file("huge.trace"), "a 0 100\na 1 9223372036854775808\n");
  const auto h = run({huge});
  EXPECT_EQ(h.code, 1);
  EXPECT_TRUE(contains(h.err, huge + ":2: size 9223372036854775808 is larger than an allocation can be")) << h.err;

  const std::string many = write_plain(dir.file("many.trace"),
                                       "a 0 4611686018427387904\na 1 4611686018427387904\na 2 "
                                       "4611686018427387904\na 3 4611686018427387904\n");
  const auto m = run({many});
  EXPECT_EQ(m.code, 1);
  EXPECT_TRUE(contains(m.err, many + ":4: with 4611686018427387904 more bytes the live bytes")) << m.err;

  const std::string nul = write_plain(dir.file("nul.trace"), std::string("a 0 100\0\n", 9));
  const auto n = run({nul});
  EXPECT_EQ(n.code, 1);
  EXPECT_TRUE(contains(n.err, "size '100\\x00' is not a non-negative integer")) << n.err;

  const std::string ok = write_plain(dir.file("ok.trace"), by_hand);
  const auto tiny = run({ok, "--memory-limit", "0.000000001x"});
  EXPECT_EQ(tiny.code, 2);
  EXPECT_TRUE(contains(tiny.err, "is under 1 byte(s)")) << tiny.err;
  EXPECT_TRUE(tiny.out.empty());
}

TEST(JsonText, EscapesWhatJsonForbidsAndKeepsUtf8) {
  using devrt::tools::json_string;
  EXPECT_EQ(json_string("a\"b\\c\n\t"), "\"a\\\"b\\\\c\\n\\t\"");
  EXPECT_EQ(json_string(std::string("x\0y", 3)), "\"x\\u0000y\"");
  EXPECT_EQ(json_string("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
  // Bytes that are no UTF-8: a stray continuation, a lone lead byte, an overlong form, a surrogate.
  EXPECT_EQ(json_string("a\xff"), "\"a\\ufffd\"");
  EXPECT_EQ(json_string("\x80z"), "\"\\ufffdz\"");
  EXPECT_EQ(json_string("\xc3"), "\"\\ufffd\"");
  EXPECT_EQ(json_string("\xc0\xaf"), "\"\\ufffd\\ufffd\"");
  EXPECT_EQ(json_string("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");
}

TEST(ReplayCli, TheGpuLagIsShownAndZeroIsTheDefault) {
  scratch_dir dir;
  const std::string path = write_plain(dir.file("hand.trace"), by_hand);
  const auto idle = run({path, "--device", "sim-gpu", "--gpu-lag", "0", "--json"});
  ASSERT_EQ(idle.code, 0) << idle.err;
  EXPECT_TRUE(contains(idle.out, "\"gpu_lag\": 0")) << idle.out;
  const auto busy = run({path, "--device", "sim-gpu", "--gpu-lag", "3"});
  ASSERT_EQ(busy.code, 0) << busy.err;
  EXPECT_TRUE(contains(busy.out, "layout auto, the GPU 3 events behind\n")) << busy.out;
}

TEST(ReplayCli, HumanOutputHasEveryFigure) {
  scratch_dir dir;
  const std::string path = write_gz(dir.file("hand.trace.gz"), by_hand);
  const auto r = run({path, "--layout", "sliced:page=4KiB"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "trace          hand.trace.gz (devrt format)")) << r.out;
  EXPECT_TRUE(contains(r.out, "replay         core, sim-h200, layout sliced:page=4KiB")) << r.out;
  EXPECT_TRUE(contains(r.out, "events         8 (4 allocations, 4 frees)")) << r.out;
  EXPECT_TRUE(contains(r.out, "ns/event")) << r.out;
  EXPECT_TRUE(contains(r.out, "peak live      0.000 GiB (8,000 bytes)")) << r.out;
  EXPECT_TRUE(contains(r.out, "peak reserved  0.000 GiB (8,192 bytes)")) << r.out;
  EXPECT_TRUE(contains(r.out, "ratio          1.024")) << r.out;
  EXPECT_TRUE(contains(r.out, "driver         2 allocations, 0 frees")) << r.out;
  EXPECT_TRUE(contains(r.out, "failures       0")) << r.out;
  EXPECT_TRUE(r.err.empty()) << r.err;  // no progress line unless asked for
}

TEST(ReplayCli, TheFloorOfMapsIsCountedInWords) {
  // 8,000 bytes at the peak: one mapping of 256 MiB would hold them, and the line says "1 map".
  scratch_dir dir;
  const std::string path = write_plain(dir.file("hand.trace"), by_hand);
  const auto r = run({path, "--layout", "arena"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "(the floor: 1 map of 256 MiB)")) << r.out;
  EXPECT_FALSE(contains(r.out, "1 maps of")) << r.out;
}

TEST(ReplayCli, JsonHasEveryFigure) {
  scratch_dir dir;
  const std::string path = write_plain(dir.file("hand.trace"), by_hand);
  const auto r = run({path, "--layout=sliced:page=4KiB", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.front(), '{');
  EXPECT_EQ(r.out.substr(r.out.size() - 2), "}\n");
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1);
  for (const char* field :
       {"\"trace\": \"hand.trace\"", "\"header\": \"{\\\"scenario\\\": \\\"by-hand\\\"}\"", "\"mode\": \"core\"",
        "\"events\": 8,", "\"allocations\": 4,", "\"frees\": 4,", "\"peak_live_bytes\": 8000,",
        "\"peak_reserved_bytes\": 8192,", "\"ratio\": 1.024,", "\"driver_allocs\": 2,", "\"driver_frees\": 0,",
        "\"failures\": 0,", "\"ns_per_event\": ", "\"events_per_second\": ", "\"seconds\": "}) {
    EXPECT_TRUE(contains(r.out, field)) << field << " missing in " << r.out;
  }
}

TEST(ReplayCli, LimitReplaysThePrefix) {
  scratch_dir dir;
  const std::string path = write_plain(dir.file("hand.trace"), by_hand);
  const auto r = run({path, "--layout", "sliced:page=4KiB", "--limit", "2", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "\"events\": 2,")) << r.out;
  EXPECT_TRUE(contains(r.out, "\"trace_events\": 8,")) << r.out;
  EXPECT_TRUE(contains(r.out, "\"peak_live_bytes\": 6000,")) << r.out;
}

TEST(ReplayCli, RmmLogByFormatOption) {
  scratch_dir dir;
  const std::string path = write_plain(dir.file("rmm.log"),
                                       "Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x100,300,0\n"
                                       "1,t,allocate failure,0x0,900,0\n1,t,free,0x100,300,0\n");
  const auto r = run({path, "--format", "rmm"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "(rmm format, 1 allocate failures skipped)")) << r.out;
  EXPECT_TRUE(contains(r.out, "(300 bytes)")) << r.out;
}

TEST(ReplayCli, StrictFailureExitsOne) {
  scratch_dir dir;
  const std::string path = write_plain(dir.file("big.trace"), "a 0 100\na 1 5000\nf 1\nf 0\n");
  const auto lenient = run({path, "--layout", "sliced:page=4KiB"});
  EXPECT_EQ(lenient.code, 0);
  EXPECT_TRUE(contains(lenient.out, "failures       1 (first: event 1 (a 1 5000)")) << lenient.out;
  const auto strict = run({path, "--layout", "sliced:page=4KiB", "--strict"});
  EXPECT_EQ(strict.code, 1);
  EXPECT_TRUE(contains(strict.out, "stopped        at the first failure")) << strict.out;
}

TEST(ReplayCli, ActorModeRuns) {
  scratch_dir dir;
  const std::string path = write_plain(dir.file("hand.trace"), by_hand);
  const auto r = run({path, "--threads", "2", "--layout", "sliced:page=4KiB"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "replay         actor, 2 threads, create(), sim-h200, layout")) << r.out;
  EXPECT_TRUE(contains(r.out, "events         8 (4 allocations, 4 frees, ")) << r.out;
  EXPECT_TRUE(contains(r.out, "peak in use    ")) << r.out;
}

TEST(ReplayCli, ProgressLineOnRequest) {
  scratch_dir dir;
  const std::string path = write_plain(dir.file("hand.trace"), by_hand);
  const auto r = run({path, "--progress", "--layout", "sliced:page=4KiB"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "\rdevrt-replay: 100.0% (8 / 8 events)")) << r.err;
}

TEST(ReplayCli, TimelineWithoutGnuplotKeepsCsvAndScript) {
  scratch_dir dir;
  const std::string path = write_plain(dir.file("hand.trace"), by_hand);
  const std::string prefix = dir.file("tl");
  run_output r;
  {
    const path_override no_gnuplot(dir.file("empty-path"));
    r = run({path, "--layout", "sliced:page=4KiB", "--timeline", prefix});
  }
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "gnuplot is not installed")) << r.out;
  std::ifstream csv(prefix + ".csv");
  ASSERT_TRUE(csv);
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "event,live_bytes,reserved_bytes");
  std::vector<std::string> rows;
  while (std::getline(csv, line)) rows.push_back(line);
  ASSERT_EQ(rows.size(), 8U);  // fewer events than samples: one row an event
  EXPECT_EQ(rows[0], "1,3000,4096");
  EXPECT_EQ(rows[4], "5,8000,8192");
  EXPECT_EQ(rows[7], "8,0,8192");
  EXPECT_TRUE(std::filesystem::exists(prefix + ".gp"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".png"));
}

TEST(ReplayCli, TimelinePlotWhenGnuplotIsInstalled) {
  if (find_gnuplot().empty()) GTEST_SKIP() << "gnuplot is not installed";
  scratch_dir dir;
  const std::string path = write_plain(dir.file("hand.trace"), by_hand);
  const std::string prefix = dir.file("it's");  // a quote in the name must survive the quoting
  const auto r = run({path, "--layout", "sliced:page=4KiB", "--timeline", prefix, "--timeline-format", "both"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(std::filesystem::exists(prefix + ".csv"));
  EXPECT_GT(std::filesystem::file_size(prefix + ".png"), 1000U) << r.out;
  EXPECT_GT(std::filesystem::file_size(prefix + ".svg"), 1000U) << r.out;
}

TEST(ReplayCli, GroupDigits) {
  EXPECT_EQ(group_digits(0), "0");
  EXPECT_EQ(group_digits(999), "999");
  EXPECT_EQ(group_digits(1000), "1,000");
  EXPECT_EQ(group_digits(1342099), "1,342,099");
  EXPECT_EQ(group_digits(24987485768ULL), "24,987,485,768");
}

TEST(ReplayCli, AMemoryLimitInBytesOrTimesThePeakIsAppliedAndReported) {
  const std::string trace = std::string(DEVRT_TRACES_DIR) + "/bert_serve.trace.gz";
  const auto capped = run({trace, "--memory-limit", "1.05x", "--json"});
  ASSERT_EQ(capped.code, 0) << capped.err;
  EXPECT_TRUE(contains(capped.out, "\"failures\": 0")) << capped.out;
  EXPECT_TRUE(contains(capped.out, "\"memory_limit_bytes\": 498433152")) << capped.out;  // 1.05 x 474,698,240
  EXPECT_TRUE(contains(capped.out, "\"floor_maps\": 2")) << capped.out;
  const auto text = run({trace, "--memory-limit", "400MiB"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_TRUE(contains(text.out, "memory limit   0.391 GiB (419,430,400 bytes, 0.884 times the peak of live bytes)"))
      << text.out;
  EXPECT_TRUE(contains(text.out, "(first: event")) << "below the peak of live bytes, reserves fail: " << text.out;
  EXPECT_TRUE(contains(text.out, "memory limit")) << text.out;
  EXPECT_TRUE(contains(text.out, "(the floor: 2 maps of 256 MiB)")) << text.out;
  for (const char* bad : {"lots", "0x", "-1x", "0"}) {
    const auto r = run({trace, "--memory-limit", bad});
    EXPECT_EQ(r.code, 2) << bad;
    EXPECT_TRUE(contains(r.err, "bad value for --memory-limit")) << r.err;
  }
}

}  // namespace
}  // namespace devrt::replay
