// What every started device holds, side by side: `runtime::report()`.
#pragma once

#include <string>
#include <vector>

#include "devrt/memory/usage.hpp"
#include "devrt/runtime/device_actor.hpp"

namespace devrt::runtime {

/// One device's statistics and readable report, taken on its strand.
struct device_report {
  device_info device;
  memory::memory_statistics statistics;
  std::string report;  ///< the manager's readable report (pools, pages, summary)
  std::string error;   ///< why the device did not answer (it shut down); empty when it did
};

/// Every started device: the host, the sim device, then the CUDA devices by index.
struct runtime_report {
  std::vector<device_report> devices;

  /// The statistics side by side, one column per device:
  ///
  ///                      host       cuda:0      cuda:1
  ///     reserved         2.00 MiB   64.00 MiB   32.00 MiB
  ///     peak reserved    ...
  [[nodiscard]] std::string table() const;
  /// The table, then each device's report under its name.
  [[nodiscard]] std::string to_string() const;
};

}  // namespace devrt::runtime
