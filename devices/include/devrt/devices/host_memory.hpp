// What the host can back for devrt: the bound a host storage without a capacity refuses memory
// past, read from the kernel when the storage is created.
//
// The smallest of:
//  - the memory available and the free swap (MemAvailable and SwapFree in /proc/meminfo), at most
//    the machine's memory and swap (MemTotal and SwapTotal): memory other processes hold is not
//    devrt's to take;
//  - the room left in each memory cgroup the process belongs to, from its own cgroup up to the
//    root: its limit less its working set (usage less the inactive file cache, which the kernel
//    reclaims before it kills). cgroup v2 (`memory.max`, `memory.current`, `memory.stat`'s
//    `inactive_file`) and v1 (`memory.limit_in_bytes`, `memory.usage_in_bytes`,
//    `total_inactive_file`). A container's limit is met by the kernel's OOM killer, which kills
//    the process without a word; devrt refuses the reserve with out_of_memory instead.
//
// Address ranges are reserved with MAP_NORESERVE and memory is committed lazily, so without such a
// bound the kernel grants mappings far beyond what is free and the process dies later, when the
// pages are touched.
#pragma once

#include <cstdint>
#include <string>

namespace devrt::devices {

/// Where the figures are read from: the running system's files by default.
struct host_memory_sources {
  std::string meminfo = "/proc/meminfo";
  std::string self_cgroup = "/proc/self/cgroup";  ///< the process's cgroups
  std::string cgroup_root = "/sys/fs/cgroup";     ///< where the cgroup file systems are mounted
};

struct host_memory {
  std::uint64_t bytes = 0;  ///< 0 only when nothing could be read
  /// What set `bytes`, for messages: "the memory available and free swap", "the machine's memory
  /// and swap", or "the room left in memory cgroup PATH (limit L, working set W)".
  std::string bound;
};

/// Reads the bound now. Files that are missing or unreadable are passed over; never throws.
[[nodiscard]] host_memory host_memory_available(const host_memory_sources& from = {});

}  // namespace devrt::devices
