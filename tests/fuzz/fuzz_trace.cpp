// libFuzzer target: devrt-replay's trace readers (devrt format and RMM's CSV log).
//
// The first byte picks the format; the rest is the trace text.
//
// Checks, aborting on a violation:
// - errors are malformed_config and their text names the origin;
// - an accepted trace is well formed: allocation ids are dense and in order, every free ends a live
//   allocation and carries its size, `allocations` counts the allocation events;
// - summarize() agrees with the events, and truncate() keeps a prefix that is well formed too.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "replay/trace.hpp"

namespace {

using devrt::errc;
namespace rp = devrt::replay;

[[noreturn]] void fail(const std::string& input, const std::string& what) {
  std::fprintf(stderr, "fuzz_trace: %s\ninput (%zu bytes): '%s'\n", what.c_str(), input.size(), input.c_str());
  std::abort();
}

void check_well_formed(const std::string& input, const rp::trace& t, const char* what) {
  std::vector<std::uint64_t> sizes;
  std::vector<bool> live;
  std::uint64_t live_bytes = 0;
  std::uint64_t peak = 0;
  std::uint64_t frees = 0;
  for (const auto& e : t.events) {
    if (e.kind == rp::event_kind::alloc) {
      if (e.id != sizes.size()) fail(input, std::string(what) + ": allocation ids are not dense and in order");
      sizes.push_back(e.size);
      live.push_back(true);
      live_bytes += e.size;
      peak = std::max(peak, live_bytes);
    } else {
      if (e.id >= sizes.size()) fail(input, std::string(what) + ": free of an id never allocated");
      if (!live[e.id]) fail(input, std::string(what) + ": double free accepted");
      if (e.size != sizes[e.id]) fail(input, std::string(what) + ": a free does not carry its allocation's size");
      live[e.id] = false;
      live_bytes -= e.size;
      ++frees;
    }
  }
  if (t.allocations != sizes.size()) fail(input, std::string(what) + ": `allocations` does not count the events");
  const rp::trace_summary s = rp::summarize(t);
  if (s.events != t.events.size() || s.allocations != sizes.size() || s.frees != frees ||
      s.live_at_end != sizes.size() - frees || s.live_bytes_at_end != live_bytes || s.peak_live_bytes != peak) {
    fail(input, std::string(what) + ": summarize() disagrees with the events");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string input(reinterpret_cast<const char*>(data), size);  // NOLINT
  const rp::trace_format format = (data[0] & 1) != 0 ? rp::trace_format::rmm : rp::trace_format::devrt;
  const std::string text = input.substr(1);
  (void)rp::detect_format("fuzz.trace", text);
  auto t = rp::parse_trace(text, format, "fuzz.trace");
  if (!t) {
    if (t.code() != errc::malformed_config) fail(input, "error code " + std::string(to_string(t.code())));
    const std::string msg = rp::trace_error_text(t.err());
    if (msg.rfind("fuzz.trace", 0) != 0) fail(input, "the error does not name the origin: " + msg);
    if (t.err().message().empty()) fail(input, "an error without a message");
    return 0;
  }
  if (t->format != format) fail(input, "the trace reports another format");
  check_well_formed(input, *t, "trace");
  rp::trace prefix = *t;
  rp::truncate(prefix, t->events.size() / 2);
  check_well_formed(input, prefix, "truncated trace");
  return 0;
}
