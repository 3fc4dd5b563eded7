#include "devrt/devices/host_memory.hpp"

#include <sys/sysinfo.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string_view>
#include <system_error>
#include <vector>

namespace devrt::devices {

namespace {

namespace fs = std::filesystem;

// v1 writes "no limit" as the largest page-aligned signed value; anything this large is none.
constexpr std::uint64_t no_limit_above = std::uint64_t{1} << 62;

std::optional<std::uint64_t> parse_number(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

std::optional<std::string> read_text(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::optional<std::uint64_t> read_number(const fs::path& p) {
  const auto t = read_text(p);
  if (!t) return std::nullopt;
  return parse_number(*t);
}

// The value of `key` in a "key value" file such as memory.stat (0 when absent).
std::uint64_t stat_value(const fs::path& p, std::string_view key) {
  std::ifstream in(p);
  std::string k;
  std::uint64_t v = 0;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return 0;
}

struct cgroup_files {
  const char* limit;
  const char* usage;
  const char* inactive;  // in memory.stat
};
constexpr cgroup_files v2_files{"memory.max", "memory.current", "inactive_file"};
constexpr cgroup_files v1_files{"memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"};

// The process's cgroup under `base` and its ancestors up to `base`: the least room any leaves.
void walk_cgroup(const fs::path& base, std::string_view path, const cgroup_files& files, host_memory& out) {
  std::error_code ec;
  if (!fs::is_directory(base, ec)) return;
  fs::path dir = base;
  std::string rel(path);
  while (!rel.empty() && rel.front() == '/') rel.erase(rel.begin());
  if (!rel.empty() && fs::is_directory(base / rel, ec)) dir = base / rel;
  // Inside a cgroup namespace the process's own cgroup is mounted as the root: `dir` is `base`.
  for (;;) {
    const auto limit = read_number(dir / files.limit);  // v2's "max" does not parse: no limit
    if (limit && *limit < no_limit_above) {
      const std::uint64_t usage = read_number(dir / files.usage).value_or(0);
      const std::uint64_t inactive = stat_value(dir / "memory.stat", files.inactive);
      const std::uint64_t working = usage - std::min(inactive, usage);
      const std::uint64_t room = *limit - std::min(working, *limit);
      if (room < out.bytes || out.bytes == 0) {
        out.bytes = room;
        out.bound = "the room left in memory cgroup " + dir.string() + " (limit " + std::to_string(*limit) +
                    " bytes, working set " + std::to_string(working) + " bytes)";
      }
    }
    if (dir == base || !dir.has_parent_path() || dir.parent_path() == dir) break;
    dir = dir.parent_path();
  }
}

}  // namespace

host_memory host_memory_available(const host_memory_sources& from) {
  host_memory out;
  try {
    std::ifstream meminfo(from.meminfo);
    std::string key;
    std::uint64_t kib = 0;
    std::optional<std::uint64_t> mem_total, mem_available, swap_total, swap_free;
    while (meminfo >> key >> kib) {
      if (key == "MemTotal:") mem_total = kib * 1024;
      if (key == "MemAvailable:") mem_available = kib * 1024;
      if (key == "SwapTotal:") swap_total = kib * 1024;
      if (key == "SwapFree:") swap_free = kib * 1024;
      meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
    }
    std::uint64_t total = 0;
    if (mem_total) {
      total = *mem_total + swap_total.value_or(0);
    } else if (struct sysinfo si{}; ::sysinfo(&si) == 0) {
      const std::uint64_t unit = si.mem_unit == 0 ? 1 : si.mem_unit;
      total = (static_cast<std::uint64_t>(si.totalram) + static_cast<std::uint64_t>(si.totalswap)) * unit;
    }
    // Without MemAvailable (kernels before 3.14) nothing says what is free: the machine's total.
    if (mem_available && *mem_available != 0) {
      out.bytes = std::min(*mem_available + swap_free.value_or(0), total == 0 ? ~std::uint64_t{0} : total);
      out.bound = "the memory available and free swap";
    } else {
      out.bytes = total;
      out.bound = "the machine's memory and swap";
    }

    // Each line of /proc/self/cgroup: "id:controllers:path"; v2's has id 0 and no controllers.
    std::ifstream cgroups(from.self_cgroup);
    std::string line;
    const fs::path root(from.cgroup_root);
    while (std::getline(cgroups, line)) {
      const auto first = line.find(':');
      const auto second = first == std::string::npos ? std::string::npos : line.find(':', first + 1);
      if (second == std::string::npos) continue;
      const std::string controllers = line.substr(first + 1, second - first - 1);
      const std::string path = line.substr(second + 1);
      if (controllers.empty()) {
        // The unified hierarchy: mounted at the root, or beside the v1 ones as "unified".
        std::error_code ec;
        walk_cgroup(fs::exists(root / "cgroup.controllers", ec) ? root : root / "unified", path, v2_files, out);
      } else {
        std::stringstream list(controllers);
        for (std::string c; std::getline(list, c, ',');) {
          if (c == "memory") walk_cgroup(root / "memory", path, v1_files, out);
        }
      }
    }
  } catch (...) {
    // A figure that could not be read bounds nothing; what was read stands.
  }
  return out;
}

}  // namespace devrt::devices
