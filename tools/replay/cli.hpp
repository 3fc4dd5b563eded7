// The command line of devrt-replay, as a library so that tests can run it whole.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "devrt/memory/config.hpp"
#include "replay/replay.hpp"
#include "replay/trace.hpp"

namespace devrt::replay {

struct cli_options {
  std::string trace_path;
  std::optional<trace_format> format;  ///< detected from the file when absent
  device_choice device = device_choice::sim;
  bool device_given = false;
  std::optional<baseline_kind> baseline;  ///< --baseline: the CUDA runtime instead of devrt
  bool compare = false;                   ///< --compare: devrt on cuda, cudaMallocAsync, cudaMalloc
  std::string layout_text = "auto";
  memory::memory_layout layout = memory::preset::sub_slices;
  std::size_t threads = 0;
  bool wait = false;
  bool strict = false;
  bool json = false;
  std::optional<std::string> timeline_prefix;
  bool timeline_png = true;
  bool timeline_svg = false;
  std::optional<std::uint64_t> limit;
  std::uint64_t gpu_lag = 0;  ///< --gpu-lag: sim-gpu runs this many events behind
  /// --memory-limit: bytes, or (memory_limit_factor > 0) that many times the trace's peak of live
  /// bytes, resolved into memory_limit once the trace is read.
  std::uint64_t memory_limit = 0;
  double memory_limit_factor = 0;
  std::optional<bool> progress;  ///< default: on when stderr is a terminal
  bool help = false;
};

/// Parses the arguments (without the program name) and validates the layout against the device.
/// Error malformed_config (or the layout's error) whose `trace_error_text` says what is wrong.
result<cli_options> parse_args(const std::vector<std::string>& args);

std::string usage();

/// Runs devrt-replay. Exit codes: 0 replayed (failed reserves are reported, not fatal), 1 the
/// trace could not be read, --strict stopped at a failure, or the CUDA device could not be used
/// (CUDA build without a usable GPU: the message names the CUDA error), 2 bad usage (including
/// --device cuda, --baseline or --compare in a build without CUDA: "built without CUDA").
///
/// --compare replays, one after the other in this process: devrt (core mode, --layout) over
/// cuda_storage, cudaMallocAsync (all events, or --limit), cudaMalloc (the first
/// min(events, compare_malloc_events)), and prints one table (--json: a "runs" array).

/// --compare replays cudaMalloc on this many events at most (about 35 us an event on an H200).
inline constexpr std::uint64_t compare_malloc_events = 200000;
int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err, bool err_is_terminal);

/// 1234567 -> "1,234,567".
std::string group_digits(std::uint64_t n);

}  // namespace devrt::replay
