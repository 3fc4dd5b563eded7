// The trace readers: both formats, every malformed-line case (the error must name the line), gzip'd
// and plain files.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "replay/trace.hpp"
#include "tools/tools_test_util.hpp"

namespace devrt::replay {
namespace {

using testing::scratch_dir;
using testing::write_gz;
using testing::write_plain;

trace_event A(std::uint32_t id, std::uint64_t size) { return {size, id, event_kind::alloc}; }
trace_event F(std::uint32_t id, std::uint64_t size) { return {size, id, event_kind::free}; }

TEST(DevrtTrace, ParsesHeaderEventsAndRenumbersIdsDensely) {
  auto t = parse_trace("# {\"scenario\": \"x\"}\na 5 100\na 7 200\nf 5\na 9 0\nf 7\n", trace_format::devrt, "t");
  ASSERT_TRUE(t) << t.err().message();
  EXPECT_EQ(t->header, "{\"scenario\": \"x\"}");
  EXPECT_EQ(t->allocations, 3U);
  // Frees carry the size of the allocation they end.
  const std::vector<trace_event> want{A(0, 100), A(1, 200), F(0, 100), A(2, 0), F(1, 200)};
  EXPECT_EQ(t->events, want);
}

TEST(DevrtTrace, AcceptsCrlfBlankLinesLaterCommentsAndNoHeader) {
  auto t = parse_trace("\r\na 0 10\r\n\n# a comment\nf 0\r\n   \n", trace_format::devrt, "t");
  ASSERT_TRUE(t) << t.err().message();
  EXPECT_EQ(t->header, "");
  const std::vector<trace_event> want{A(0, 10), F(0, 10)};
  EXPECT_EQ(t->events, want);
}

TEST(DevrtTrace, AcceptsLastLineWithoutNewlineAndLargeSparseIds) {
  auto t = parse_trace("a 18446744073709551615 7\nf 18446744073709551615", trace_format::devrt, "t");
  ASSERT_TRUE(t) << t.err().message();
  const std::vector<trace_event> want{A(0, 7), F(0, 7)};
  EXPECT_EQ(t->events, want);
}

struct bad_case {
  const char* text;
  const char* where;  // "origin:line:"
  const char* what;   // a part of the message
};

class DevrtMalformed : public ::testing::TestWithParam<bad_case> {};

TEST_P(DevrtMalformed, ErrorNamesFileLineAndProblem) {
  const bad_case& c = GetParam();
  auto t = parse_trace(c.text, trace_format::devrt, "my.trace");
  ASSERT_FALSE(t) << "accepted: " << c.text;
  EXPECT_EQ(t.code(), errc::malformed_config);
  const std::string msg = trace_error_text(t.err());
  EXPECT_NE(msg.find(c.where), std::string::npos) << msg;
  EXPECT_NE(msg.find(c.what), std::string::npos) << msg;
  // The full message carries the same text.
  EXPECT_NE(t.err().message().find(c.where), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DevrtMalformed,
    ::testing::Values(bad_case{"a 0 10\nx 1 2\n", "my.trace:2:", "unknown event 'x 1 2'"},
                      bad_case{"a 0 10\nalloc 1 2\n", "my.trace:2:", "unknown event"},
                      bad_case{"# h\n\na 0 1\nA 1 2\n", "my.trace:4:", "unknown event"},
                      bad_case{"a\n", "my.trace:1:", "missing id"},
                      bad_case{"a 0 10\nf\n", "my.trace:2:", "missing id"},
                      bad_case{"a 0 10\nf   \n", "my.trace:2:", "missing id"},
                      bad_case{"a zz 10\n", "my.trace:1:", "id 'zz'"}, bad_case{"a -1 10\n", "my.trace:1:", "id '-1'"},
                      bad_case{"a 0 10\na 1\n", "my.trace:2:", "missing size"},
                      bad_case{"a 0 12x\n", "my.trace:1:", "size '12x' is not a non-negative integer"},
                      bad_case{"a 0 -5\n", "my.trace:1:", "size '-5'"},
                      bad_case{"a 0 99999999999999999999\n", "my.trace:1:", "size '99999999999999999999'"},
                      bad_case{"a 0 1 2\n", "my.trace:1:", "unexpected '2' after the size"},
                      bad_case{"a 0 1\nf 0 1\n", "my.trace:2:", "unexpected '1' after the id"},
                      bad_case{"a 0 1\nf 3\n", "my.trace:2:", "free of id 3, never allocated"},
                      bad_case{"a 0 1\nf 0\nf 0\n",
                               "my.trace:3:", "double free of id 0 (allocated at line 1, already freed at line 2)"},
                      bad_case{"a 0 1\na 0 2\n", "my.trace:2:", "duplicate id 0: already allocated at line 1"},
                      bad_case{"a 0 1\nf 0\na 0 5\n", "my.trace:3:", "duplicate id 0"}));

constexpr const char* rmm_text =
    "Thread,Time,Action,Pointer,Size,Stream\n"
    "1,08:00:00:000001,allocate,0x7f0000000000,256,0x0\n"
    "1,08:00:00:000002,allocate,0x7f0000000100,512,0x0\n"
    "1,08:00:00:000003,allocate failure,0x0,99999999999,0x0\n"
    "1,08:00:00:000004,free,0x7f0000000000,256,0x0\n"
    "2,08:00:00:000005,allocate,0x7f0000000000,64,0x0\n"  // pointer reused: a new id
    "2,08:00:00:000006,free,0x7f0000000100,512,0x0\n"
    "2,08:00:00:000007,free,0x7f0000000000,64,0x0\n";

TEST(RmmTrace, MapsPointersToNewIdsAndSkipsAllocateFailures) {
  auto t = parse_trace(rmm_text, trace_format::rmm, "log.csv");
  ASSERT_TRUE(t) << t.err().message();
  EXPECT_EQ(t->skipped, 1U);
  EXPECT_EQ(t->allocations, 3U);
  const std::vector<trace_event> want{A(0, 256), A(1, 512), F(0, 256), A(2, 64), F(1, 512), F(2, 64)};
  EXPECT_EQ(t->events, want);
}

TEST(RmmTrace, FindsColumnsByNameAndAcceptsSizeZeroAtNull) {
  auto t = parse_trace(
      "Size, Action ,Pointer\n0,allocate,0x0\n0,allocate,0x0\n8,allocate,ff\n0,free,0x0\n8,free,0xFF\n0,free,0x0\n",
      trace_format::rmm, "log.csv");
  ASSERT_TRUE(t) << t.err().message();
  const std::vector<trace_event> want{A(0, 0), A(1, 0), A(2, 8), F(1, 0), F(2, 8), F(0, 0)};
  EXPECT_EQ(t->events, want);
}

class RmmMalformed : public ::testing::TestWithParam<bad_case> {};

TEST_P(RmmMalformed, ErrorNamesFileLineAndProblem) {
  const bad_case& c = GetParam();
  auto t = parse_trace(c.text, trace_format::rmm, "log.csv");
  ASSERT_FALSE(t) << "accepted: " << c.text;
  EXPECT_EQ(t.code(), errc::malformed_config);
  const std::string msg = trace_error_text(t.err());
  EXPECT_NE(msg.find(c.where), std::string::npos) << msg;
  EXPECT_NE(msg.find(c.what), std::string::npos) << msg;
}

#define RMM_HEADER "Thread,Time,Action,Pointer,Size,Stream\n"
INSTANTIATE_TEST_SUITE_P(
    Cases, RmmMalformed,
    ::testing::Values(
        bad_case{"Thread,Time,Action,Size,Stream\n1,t,allocate,8,0\n", "log.csv:1:", "lacks the column 'Pointer'"},
        bad_case{"", "log.csv:", "no CSV header"},
        bad_case{RMM_HEADER "1,t,allocate,0x10,8,0\n1,t,free,0x20,8,0\n",
                 "log.csv:3:", "free of pointer 0x20, never allocated"},
        bad_case{RMM_HEADER "1,t,allocate,0x10,8,0\n1,t,free,0x10,8,0\n1,t,free,0x10,8,0\n",
                 "log.csv:4:", "double free of pointer 0x10 (allocated at line 2, already freed at line 3)"},
        bad_case{RMM_HEADER "1,t,allocate,0x10,8,0\n1,t,allocate,0x10,8,0\n",
                 "log.csv:3:", "allocation at pointer 0x10, still live since line 2"},
        bad_case{RMM_HEADER "1,t,reallocate,0x10,8,0\n", "log.csv:2:", "unknown action 'reallocate'"},
        bad_case{RMM_HEADER "1,t,allocate,0xzz,8,0\n", "log.csv:2:", "pointer '0xzz'"},
        bad_case{RMM_HEADER "1,t,allocate,0x10,eight,0\n", "log.csv:2:", "size 'eight'"},
        bad_case{RMM_HEADER "1,t,allocate,0x10\n", "log.csv:2:", "4 fields where the header has at least 5"}));

TEST(TraceFormat, DetectedFromNameThenFirstLine) {
  EXPECT_EQ(detect_format("x.csv", "a 0 1\n"), trace_format::rmm);
  EXPECT_EQ(detect_format("x.csv.gz", ""), trace_format::rmm);
  EXPECT_EQ(detect_format("x.trace.gz", "# {\"a\": 1, \"b\": 2}\na 0 1\n"), trace_format::devrt);
  EXPECT_EQ(detect_format("x.log", "\nThread,Time,Action,Pointer,Size,Stream\n"), trace_format::rmm);
  EXPECT_EQ(detect_format("x.log", "a 0 1\n"), trace_format::devrt);
  EXPECT_TRUE(parse_trace_format("rmm"));
  EXPECT_FALSE(parse_trace_format("csv"));
}

TEST(TraceFile, GzipAndPlainGiveTheSameTraceAndItsName) {
  scratch_dir dir;
  const std::string text = "# {\"scenario\": \"file\"}\na 0 4096\na 1 1\nf 0\n";
  auto gz = read_trace(write_gz(dir.file("x.trace.gz"), text));
  auto plain = read_trace(write_plain(dir.file("x.trace"), text));
  ASSERT_TRUE(gz) << gz.err().message();
  ASSERT_TRUE(plain) << plain.err().message();
  EXPECT_EQ(gz->events, plain->events);
  EXPECT_EQ(gz->events.size(), 3U);
  EXPECT_EQ(gz->header, "{\"scenario\": \"file\"}");
  EXPECT_EQ(gz->name, "x.trace.gz");
  EXPECT_EQ(plain->name, "x.trace");
}

TEST(TraceFile, ReadsFilesLargerThanOneChunk) {
  // More than the reader's 4 MiB chunk, so the buffer grows and the chunks join mid-line.
  scratch_dir dir;
  std::string text;
  constexpr std::uint32_t n = 400'000;
  for (std::uint32_t i = 0; i < n; ++i) text += "a " + std::to_string(i) + " 123456\n";
  for (std::uint32_t i = 0; i < n; ++i) text += "f " + std::to_string(i) + "\n";
  ASSERT_GT(text.size(), std::size_t{4} << 20);
  auto t = read_trace(write_gz(dir.file("big.trace.gz"), text));
  ASSERT_TRUE(t) << t.err().message();
  EXPECT_EQ(t->events.size(), 2U * n);
  EXPECT_EQ(summarize(*t).peak_live_bytes, std::uint64_t{n} * 123456);
}

TEST(TraceFile, RmmDetectedFromCsvName) {
  scratch_dir dir;
  auto t = read_trace(write_gz(dir.file("log.csv.gz"), rmm_text));
  ASSERT_TRUE(t) << t.err().message();
  EXPECT_EQ(t->format, trace_format::rmm);
  EXPECT_EQ(t->events.size(), 6U);
}

TEST(TraceFile, ErrorsNameTheFile) {
  scratch_dir dir;
  auto missing = read_trace(dir.file("nope.trace.gz"));
  ASSERT_FALSE(missing);
  EXPECT_NE(trace_error_text(missing.err()).find("nope.trace.gz: cannot open"), std::string::npos)
      << trace_error_text(missing.err());

  const std::string path = write_gz(dir.file("bad.trace.gz"), "a 0 1\nq\n");
  auto bad = read_trace(path);
  ASSERT_FALSE(bad);
  EXPECT_NE(trace_error_text(bad.err()).find(path + ":2:"), std::string::npos) << trace_error_text(bad.err());
}

TEST(TraceFile, TruncatedGzipIsAnError) {
  scratch_dir dir;
  std::string text;
  for (int i = 0; i < 20000; ++i) text += "a " + std::to_string(i) + " " + std::to_string(i * 7919 % 100003) + "\n";
  const std::string path = write_gz(dir.file("cut.trace.gz"), text);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
  auto r = read_file(path);
  ASSERT_FALSE(r);
  EXPECT_NE(trace_error_text(r.err()).find("cut.trace.gz: cannot read"), std::string::npos)
      << trace_error_text(r.err());
}

TEST(TraceSummary, PeakLiveAndTruncate) {
  auto t = parse_trace("a 0 100\na 1 50\nf 0\na 2 70\na 3 10\nf 1\n", trace_format::devrt, "t");
  ASSERT_TRUE(t);
  const trace_summary s = summarize(*t);
  EXPECT_EQ(s.peak_live_bytes, 150U);
  EXPECT_EQ(s.peak_live_event, 1U);
  EXPECT_EQ(s.allocations, 4U);
  EXPECT_EQ(s.frees, 2U);
  EXPECT_EQ(s.live_at_end, 2U);
  EXPECT_EQ(s.live_bytes_at_end, 80U);
  truncate(*t, 3);
  EXPECT_EQ(t->events.size(), 3U);
  EXPECT_EQ(t->allocations, 2U);
  truncate(*t, 100);  // longer than the trace: unchanged
  EXPECT_EQ(t->events.size(), 3U);
}

}  // namespace
}  // namespace devrt::replay
