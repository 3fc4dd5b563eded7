// Runtime configuration: the persistent-memory policy and the log level, from a config file and
// the environment. Pool layouts are set programmatically (or as a layout string in tools).
//
// File format (one setting per line, `#` starts a comment):
//     persistent_memory = size-match      # enabled | size-match | disabled | enforced
//     log_level = basic                   # disabled | basic | full
//     cuda_devices = 0,2                  # CUDA device indices to use, or none
// Environment (overrides the file): DEVRT_PERSISTENT_MEMORY, DEVRT_LOG_LEVEL, DEVRT_CUDA_DEVICES,
// and DEVRT_CONFIG, the path of the file.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "devrt/memory/config.hpp"
#include "devrt/memory/error.hpp"

namespace devrt::runtime {

/// How much the memory actors log: nothing, one line per configuration event and error, or every
/// memory message.
enum class log_level { disabled, basic, full };

result<log_level> parse_log_level(std::string_view text);
const char* to_string(log_level l) noexcept;

/// A list of CUDA device indices: "0,2" (commas, optional spaces; no duplicates), or "none" for
/// the empty list. Error malformed_config quoting the text.
result<std::vector<int>> parse_device_list(std::string_view text);

struct runtime_config {
  memory::persistent_policy persistent_memory = memory::persistent_policy::enabled;
  log_level log = log_level::disabled;
  /// The CUDA devices to use (indices as the CUDA runtime numbers them); nullopt: every one.
  std::optional<std::vector<int>> cuda_devices;
  /// A request that finds its device's actor idle runs on the calling thread, so that nothing is
  /// woken (device_actor::run_or_post); false sends every request to the device thread.
  bool serve_in_place = true;
};

/// Reads a switch: 1, true, on, yes or 0, false, off, no (any case). Error malformed_config.
result<bool> parse_switch(std::string_view text);

/// Applies the settings of a config file's text to `cfg`. `origin` names the file in errors.
/// Error malformed_config naming the line.
result<void> apply_config_text(runtime_config& cfg, std::string_view text, std::string_view origin);

/// Reads and applies a config file. Errors: malformed_config (unreadable file, bad line).
result<void> apply_config_file(runtime_config& cfg, const std::string& path);

/// Looks up an environment variable; replaceable in tests.
using env_lookup = std::function<std::optional<std::string>(const char*)>;
std::optional<std::string> process_env(const char* name);

/// The configuration: defaults, then the file named by `file` or by DEVRT_CONFIG, then the
/// environment variables.
result<runtime_config> load_config(const std::optional<std::string>& file, const env_lookup& env = process_env);

}  // namespace devrt::runtime
