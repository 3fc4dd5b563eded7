#include <fmt/format.h>

#include <algorithm>
#include <exception>

#include "devrt/memory/config.hpp"
#include "devrt/runtime/device_report.hpp"
#include "devrt/runtime/runtime.hpp"

namespace devrt::runtime {

namespace {

std::string column_name(const device_info& d) {
  return d.kind == device_kind::cuda ? "cuda:" + std::to_string(d.index) : std::string(to_string(d.kind));
}

}  // namespace

std::string runtime_report::table() const {
  using row_value = std::uint64_t memory::memory_statistics::*;
  struct row {
    const char* name;
    row_value value;
    bool bytes;
  };
  static constexpr row rows[] = {
      {"reserved", &memory::memory_statistics::bytes_reserved, true},
      {"peak reserved", &memory::memory_statistics::peak_bytes_reserved, true},
      {"in use", &memory::memory_statistics::bytes_in_use, true},
      {"peak in use", &memory::memory_statistics::peak_bytes_in_use, true},
      {"reserves", &memory::memory_statistics::reserves, false},
      {"driver allocs", &memory::memory_statistics::driver_allocs, false},
      {"driver frees", &memory::memory_statistics::driver_frees, false},
      {"maps", &memory::memory_statistics::maps, false},
      {"unmaps", &memory::memory_statistics::unmaps, false},
      {"out of memory", &memory::memory_statistics::out_of_memory, false},
  };
  std::vector<std::vector<std::string>> cells;  // [device][row]
  std::vector<std::size_t> widths;
  for (const auto& d : devices) {
    std::vector<std::string> col{column_name(d.device)};
    for (const auto& r : rows) {
      if (!d.error.empty()) {
        col.emplace_back("-");
        continue;
      }
      const std::uint64_t v = d.statistics.*(r.value);
      col.push_back(r.bytes ? memory::format_bytes(v) : std::to_string(v));
    }
    std::size_t w = 0;
    for (const auto& c : col) w = std::max(w, c.size());
    widths.push_back(w);
    cells.push_back(std::move(col));
  }
  std::string out;
  constexpr int label = 15;
  for (std::size_t line = 0; line <= std::size(rows); ++line) {
    out += fmt::format("{:<{}}", line == 0 ? "" : rows[line - 1].name, label);
    for (std::size_t d = 0; d < cells.size(); ++d) out += fmt::format("  {:>{}}", cells[d][line], widths[d]);
    out += '\n';
  }
  return out;
}

std::string runtime_report::to_string() const {
  std::string out = table();
  for (const auto& d : devices) {
    out += fmt::format("\n== {} ==\n{}", d.device.name, d.error.empty() ? d.report : d.error + "\n");
  }
  return out;
}

runtime_report runtime::report() const {
  const std::vector<std::shared_ptr<device_actor>> actors = started_actors();
  runtime_report out;
  // Every device is asked first, then every answer awaited: the devices work at once.
  struct pending {
    decltype(std::declval<compute_client>().statistics()) statistics;
    decltype(std::declval<compute_client>().report()) report;
  };
  std::vector<pending> asked;
  for (const auto& a : actors) {
    compute_client c(a);
    asked.push_back(pending{c.statistics(), c.report()});
  }
  for (std::size_t i = 0; i < actors.size(); ++i) {
    device_report d;
    d.device = actors[i]->info();
    try {
      d.statistics = asked[i].statistics.get();
      d.report = asked[i].report.get();
    } catch (const std::exception& e) {
      d.error = e.what();
    }
    out.devices.push_back(std::move(d));
  }
  return out;
}

}  // namespace devrt::runtime
