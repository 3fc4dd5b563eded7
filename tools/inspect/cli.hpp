// The command line of devrt-inspect, as a library so that tests can run it whole.
//
//   devrt-inspect [--device D] [--layout L]   the resolved pools of layout L on device D
//   devrt-inspect [--device D] --check L      whether L is valid on D, and what to change if not
//   devrt-inspect --config FILE               the settings a runtime config file resolves to
//   devrt-inspect snapshot --trace FILE ...   a trace replayed, its memory snapshot written
//
// Exit codes: 0 done (the layout or file is valid), 1 the layout or config file is invalid or the
// device cannot be used, 2 bad usage.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "devrt/memory/error.hpp"
#include "devrt/memory/storage.hpp"
#include "devrt/runtime/config.hpp"

namespace devrt::inspect {

enum class device_choice { host, sim, cuda };

struct cli_options {
  device_choice device = device_choice::host;
  bool device_given = false;
  std::optional<int> cuda_index;  ///< --device cuda:N; every GPU when absent
  // Simulated device properties (--device sim).
  bool h200 = false;
  std::optional<std::uint64_t> page_size;
  std::optional<std::uint64_t> alignment;
  std::optional<std::uint64_t> capacity;
  std::optional<std::string> layout;  ///< --layout; the default layout when absent
  std::optional<std::string> check;   ///< --check LAYOUT
  std::optional<std::string> config;  ///< --config FILE
  bool json = false;
  bool bytes = false;  ///< sizes as numbers of bytes
  bool help = false;
};

/// Parses the arguments (without the program name). Error malformed_config whose text says what
/// is wrong with the command line.
result<cli_options> parse_args(const std::vector<std::string>& args);

std::string usage();

/// A device whose layouts are shown.
struct device_entry {
  std::string name;  ///< "host", "sim-h200", "cuda:0 (NVIDIA H200)"
  std::string kind;  ///< "host", "sim", "cuda"
  memory::device_properties props;
};

/// The devices the options name. Errors: device_error when a GPU cannot be used (or this build
/// has no CUDA), with the reason in its text.
result<std::vector<device_entry>> devices_of(const cli_options& o);

/// `devrt-inspect snapshot ...` (its arguments after the word): replays a trace and writes a memory
/// snapshot (snapshot_command.cpp). Exit codes as run_cli's.
int run_snapshot(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);
std::string snapshot_usage();

/// Runs devrt-inspect; `env` supplies the DEVRT_* variables that --config reports on.
int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
            const runtime::env_lookup& env = runtime::process_env);

}  // namespace devrt::inspect
