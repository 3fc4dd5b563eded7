// Allocation traces: reading devrt's trace format and RMM's CSV allocation log into one list of
// events with dense ids.
//
// devrt format (gzip'd or plain text):
//     # {"scenario": ..., "events": ...}     optional first line: '#' then a JSON header
//     a <id> <bytes>                          allocate <bytes> as allocation <id>
//     f <id>                                  free allocation <id>
// Other lines starting with '#' and blank lines are ignored. Ids are unsigned integers, each
// allocated once; the reader renumbers them densely in allocation order.
//
// RMM format: the CSV written by rmm::mr::logging_resource_adaptor, header
// `Thread,Time,Action,Pointer,Size,Stream` (columns found by name, in any order). Actions:
// `allocate` and `free`; `allocate failure` rows are skipped and counted (`trace::skipped`),
// because nothing became live in the recorded run. A pointer maps to a new id at every allocation;
// several allocations may be live at the null pointer at once (size-0 allocations). The size of
// a `free` row is not checked.
//
// Errors are errc::malformed_config with `text` = "<file>:<line>: <what was wrong>" and `detail`
// naming the kind of problem; `trace_error_text` gives the text alone for tools.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "devrt/memory/error.hpp"

namespace devrt::replay {

enum class trace_format { devrt, rmm };
const char* to_string(trace_format f) noexcept;
/// "devrt" or "rmm". Error malformed_config.
result<trace_format> parse_trace_format(std::string_view text);

enum class event_kind : std::uint8_t { alloc, free };

/// One event. `id` is dense: 0 .. allocations-1, in allocation order, whatever the source used.
struct trace_event {
  std::uint64_t size = 0;  ///< bytes requested; for a free, the size of the allocation it ends
  std::uint32_t id = 0;
  event_kind kind = event_kind::alloc;
  friend bool operator==(const trace_event&, const trace_event&) = default;
};

struct trace {
  std::string name;  ///< the file name (no folders), for reports
  trace_format format = trace_format::devrt;
  std::string header;  ///< devrt: the first line's text after "# " (JSON); empty if absent
  std::vector<trace_event> events;
  std::uint32_t allocations = 0;  ///< number of ids (alloc events)
  std::uint64_t skipped = 0;      ///< rmm: `allocate failure` rows left out
};

/// What the events themselves say, independent of any allocator.
struct trace_summary {
  std::uint64_t events = 0;
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t peak_live_bytes = 0;  ///< largest sum of the sizes of live allocations
  std::uint64_t peak_live_event = 0;  ///< index of the event after which the peak was reached
  std::uint64_t live_at_end = 0;      ///< allocations never freed
  std::uint64_t live_bytes_at_end = 0;
};
trace_summary summarize(const trace& t);

/// Keeps the first `n` events (ids stay dense: they are assigned in allocation order).
void truncate(trace& t, std::uint64_t n);

/// Parses a trace's text. `origin` names it in errors.
result<trace> parse_trace(std::string_view text, trace_format format, std::string_view origin);
/// The format from the file name (".csv", ".csv.gz": rmm), else from the first non-empty line
/// ("Thread," or a line with commas: rmm; otherwise devrt).
trace_format detect_format(std::string_view path, std::string_view text);
/// Reads a whole file, decompressing it if it is gzip'd (zlib passes plain files through).
/// Error malformed_config naming the file when it cannot be opened or read.
result<std::string> read_file(const std::string& path);
/// Reads and parses a trace file; the format is detected unless given.
result<trace> read_trace(const std::string& path, std::optional<trace_format> format = {});

/// The text of a reader error ("file:12: unknown event 'x' ..."), or the message of any other.
std::string trace_error_text(const error& e);

}  // namespace devrt::replay
