// More malformed traces than trace_test.cpp covers: signs, hex and NUL bytes in numbers, tabs,
// old Mac line endings, long lines (quoted short), empty files of each format, quoted RMM fields,
// a free at the null pointer with nothing live there, a directory given as the trace file. Each
// error names the file and the line; each accepted oddity gives the expected events.

#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <string>
#include <vector>

#include "replay/trace.hpp"
#include "tools/tools_test_util.hpp"

namespace devrt::replay {
namespace {

using testing::scratch_dir;

struct malformed {
  const char* name;
  std::string text;
  trace_format format;
  const char* where;
  const char* what;
};

class MalformedTrace : public ::testing::TestWithParam<malformed> {};

TEST_P(MalformedTrace, ErrorNamesFileLineAndProblem) {
  const malformed& c = GetParam();
  auto t = parse_trace(c.text, c.format, "bad.trace");
  ASSERT_FALSE(t) << "accepted: " << c.name;
  EXPECT_EQ(t.code(), errc::malformed_config);
  const std::string msg = trace_error_text(t.err());
  EXPECT_NE(msg.find(c.where), std::string::npos) << msg;
  EXPECT_NE(msg.find(c.what), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 400u) << "the message quotes too much of the input";
}

#define RMM_HEADER "Thread,Time,Action,Pointer,Size,Stream\n"
INSTANTIATE_TEST_SUITE_P(
    Cases, MalformedTrace,
    ::testing::Values(
        malformed{"signed id", "a +1 10\n", trace_format::devrt, "bad.trace:1:", "id '+1' is not a non-negative"},
        malformed{"hex size", "a 0 0x10\n", trace_format::devrt, "bad.trace:1:", "size '0x10'"},
        malformed{"fractional size", "a 0 1.5\n", trace_format::devrt, "bad.trace:1:", "size '1.5'"},
        malformed{"NUL in a size", std::string("a 0 1\0\n", 7), trace_format::devrt, "bad.trace:1:", "size '1"},
        malformed{"text after a tab", "a 0 10\tx\n", trace_format::devrt, "bad.trace:1:", "unexpected 'x'"},
        malformed{"old Mac line endings", "a 0 1\rf 0\r", trace_format::devrt, "bad.trace:1:", "size '1\\x0df'"},
        malformed{"a long garbage line", std::string(5000, 'z') + "\n", trace_format::devrt,
                  "bad.trace:1:", "unknown event 'zzzzzzzzzz"},
        malformed{"a long size", "a 0 " + std::string(3000, '9') + "\n", trace_format::devrt,
                  "bad.trace:1:", "is not a non-negative integer"},
        malformed{"rmm blank file", "\n \n", trace_format::rmm, "bad.trace:", "no CSV header"},
        malformed{"rmm quoted action", RMM_HEADER "1,t,\"allocate\",0x10,8,0\n", trace_format::rmm,
                  "bad.trace:2:", "unknown action '\"allocate\"'"},
        malformed{"rmm negative size", RMM_HEADER "1,t,allocate,0x10,-5,0\n", trace_format::rmm,
                  "bad.trace:2:", "size '-5'"},
        malformed{"rmm free at null with nothing there", RMM_HEADER "1,t,free,0x0,0,0\n", trace_format::rmm,
                  "bad.trace:2:", "free of pointer 0x0, never allocated"},
        malformed{"rmm pointer with a sign", RMM_HEADER "1,t,allocate,-0x10,8,0\n", trace_format::rmm,
                  "bad.trace:2:", "pointer '-0x10'"}),
    [](const ::testing::TestParamInfo<malformed>& p) {
      std::string n = p.param.name;
      for (char& ch : n) ch = std::isalnum(static_cast<unsigned char>(ch)) != 0 ? ch : '_';
      return n;
    });

TEST(OddTraces, AcceptedOdditiesGiveTheExpectedEvents) {
  // Tabs separate like spaces; an id may be written with leading zeros.
  auto tabs = parse_trace("a\t007\t10\nf\t7\n", trace_format::devrt, "t");
  ASSERT_TRUE(tabs) << tabs.err().message();
  ASSERT_EQ(tabs->events.size(), 2u);
  EXPECT_EQ(tabs->events[1].size, 10u);
  // A file of comments and blank lines is an empty trace.
  auto empty = parse_trace("# {}\n\n# nothing\n", trace_format::devrt, "t");
  ASSERT_TRUE(empty) << empty.err().message();
  EXPECT_TRUE(empty->events.empty());
  EXPECT_EQ(empty->header, "{}");
  // An RMM log with a header and no rows is an empty trace too.
  auto header_only = parse_trace(RMM_HEADER, trace_format::rmm, "t");
  ASSERT_TRUE(header_only) << header_only.err().message();
  EXPECT_TRUE(header_only->events.empty());
  // `nullptr` is the null pointer.
  auto null = parse_trace(RMM_HEADER "1,t,allocate,nullptr,0,0\n1,t,free,(nil),0,0\n", trace_format::rmm, "t");
  ASSERT_TRUE(null) << null.err().message();
  EXPECT_EQ(null->events.size(), 2u);
}

TEST(OddTraces, ADirectoryIsNotATrace) {
  scratch_dir dir;
  auto t = read_trace(dir.file("a-folder"));
  ASSERT_FALSE(t);
  std::filesystem::create_directories(dir.file("folder.trace"));
  auto d = read_trace(dir.file("folder.trace"));
  ASSERT_FALSE(d) << "a directory was read as an empty trace";
  EXPECT_EQ(d.code(), errc::malformed_config);
  EXPECT_NE(trace_error_text(d.err()).find("folder.trace: cannot"), std::string::npos) << trace_error_text(d.err());
}

}  // namespace
}  // namespace devrt::replay
