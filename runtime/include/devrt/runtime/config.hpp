// Runtime configuration: the persistent-memory policy and the log level, from a config file and
// the environment. Pool layouts are set programmatically (or as a layout string in tools).
//
// File format (one setting per line, `#` starts a comment):
//     persistent_memory = size-match      # enabled | size-match | disabled | enforced
//     log_level = basic                   # disabled | basic | full
//     cuda_devices = 0,2                  # CUDA device indices to use, or none
//     memory_limit = 0.8                  # per device: bytes (40GiB) or a share of it (0.8, 80%)
//     serve_in_place = true               # a client thread serves its message when the actor is idle
// Environment (overrides the file): DEVRT_PERSISTENT_MEMORY, DEVRT_LOG_LEVEL, DEVRT_CUDA_DEVICES,
// DEVRT_MEMORY_LIMIT, DEVRT_SERVE_IN_PLACE, and DEVRT_CONFIG, the path of the file.
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

/// The most a device may hold for devrt (memory::manager_options::memory_limit): a number of bytes,
/// or a share of the device's capacity.
struct memory_limit_spec {
  std::uint64_t bytes = 0;  ///< when share is 0
  double share = 0;         ///< in (0, 1]: of the device's capacity (devices of unknown capacity: no limit)
  /// The limit on a device of `capacity` bytes (0: none).
  [[nodiscard]] std::uint64_t on(std::uint64_t capacity) const noexcept {
    if (share <= 0) return bytes;
    return static_cast<std::uint64_t>(static_cast<double>(capacity) * share);
  }
};
/// "40GiB", "1073741824" (bytes), "0.8" or "80%" (a share of the device, above 0, at most 1),
/// "0" or "none" (no limit). Error malformed_config quoting the text.
result<memory_limit_spec> parse_memory_limit(std::string_view text);

struct runtime_config {
  memory::persistent_policy persistent_memory = memory::persistent_policy::enabled;
  log_level log = log_level::disabled;
  /// The CUDA devices to use (indices as the CUDA runtime numbers them); nullopt: every one.
  std::optional<std::vector<int>> cuda_devices;
  /// A request that finds its device's actor idle runs on the calling thread, so that nothing is
  /// woken (device_actor::run_or_post); false sends every request to the device thread.
  bool serve_in_place = true;
  /// Every device's memory limit (none by default: the pools' budget is then the device's capacity).
  std::optional<memory_limit_spec> memory_limit;
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
