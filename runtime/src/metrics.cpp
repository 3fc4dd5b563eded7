// runtime::metrics_text: every device's gauges and counters in the OpenMetrics text format.
#include <fmt/format.h>

#include <algorithm>

#include "devrt/runtime/runtime.hpp"

namespace devrt::runtime {

namespace {

struct family {
  const char* name;  // without the _total of a counter's sample
  bool counter;
  bool bytes;
  const char* help;
  std::uint64_t (*value)(const memory::memory_statistics&, const memory::memory_usage&);
};

// One row per family; the sample of each device follows its TYPE, UNIT and HELP lines.
constexpr family families[] = {
    {"devrt_reserved_bytes", false, true, "Bytes the pools hold from the device.",
     [](const auto& s, const auto&) { return s.bytes_reserved; }},
    {"devrt_peak_reserved_bytes", false, true, "Peak of the bytes the device held for devrt, returning ones included.",
     [](const auto& s, const auto&) { return s.peak_bytes_reserved; }},
    {"devrt_in_use_bytes", false, true, "Bytes requested by live allocations.",
     [](const auto& s, const auto&) { return s.bytes_in_use; }},
    {"devrt_peak_in_use_bytes", false, true, "Peak of the bytes in use.",
     [](const auto& s, const auto&) {
       return s.bytes_in_use > s.peak_bytes_in_use ? s.bytes_in_use : s.peak_bytes_in_use;
     }},
    {"devrt_returning_bytes", false, true, "Bytes given back that the device has not taken back yet.",
     [](const auto& s, const auto&) { return s.bytes_returning; }},
    {"devrt_held_for_streams_bytes", false, true, "Freed bytes kept until their streams' fences pass.",
     [](const auto& s, const auto&) { return s.bytes_held_for_streams; }},
    {"devrt_peak_busy_bytes", false, true,
     "Peak of the bytes in use plus those freed on streams whose queued work may still use them.",
     [](const auto& s, const auto&) { return s.peak_bytes_busy; }},
    {"devrt_live_allocations", false, false, "Live allocations.",
     [](const auto&, const auto& u) { return u.number_allocs; }},
    {"devrt_streams", false, false, "Streams whose memory devrt tracks.",
     [](const auto& s, const auto&) { return s.streams; }},
    {"devrt_reserves", true, false, "Successful reserves.", [](const auto& s, const auto&) { return s.reserves; }},
    {"devrt_failed_reserves", true, false, "Reserves that returned an error.",
     [](const auto& s, const auto&) { return s.failed_reserves; }},
    {"devrt_out_of_memory_errors", true, false, "Reserves and wakes that failed because the device had no memory left.",
     [](const auto& s, const auto&) { return s.out_of_memory_errors; }},
    {"devrt_device_refusals", true, false, "Allocations and maps the device refused (some were retried).",
     [](const auto& s, const auto&) { return s.out_of_memory; }},
    {"devrt_maps", true, false, "Memory mapped into address ranges (driver calls).",
     [](const auto& s, const auto&) { return s.maps; }},
    {"devrt_unmaps", true, false, "Memory unmapped from address ranges (driver calls).",
     [](const auto& s, const auto&) { return s.unmaps; }},
    {"devrt_driver_allocs", true, false, "Pages allocated from the device.",
     [](const auto& s, const auto&) { return s.driver_allocs; }},
    {"devrt_driver_frees", true, false, "Pages returned to the device.",
     [](const auto& s, const auto&) { return s.driver_frees; }},
    {"devrt_fences", true, false, "Fences recorded on streams.", [](const auto& s, const auto&) { return s.fences; }},
    {"devrt_stream_waits", true, false, "Times the device waited for its streams under memory pressure.",
     [](const auto& s, const auto&) { return s.stream_waits; }},
    {"devrt_cleanups", true, false, "Explicit cleanups.", [](const auto& s, const auto&) { return s.cleanups; }},
    {"devrt_reclaims", true, false, "Cleanups forced by an out-of-memory before a retry.",
     [](const auto& s, const auto&) { return s.reclaims; }},
};

}  // namespace

std::string runtime::metrics_text() const {
  const std::vector<std::shared_ptr<device_actor>> actors = started_actors();
  using both = std::pair<memory::memory_statistics, memory::memory_usage>;
  // One message per device: its statistics and its live count at the same point of its strand.
  const auto ask = [](const std::shared_ptr<device_actor>& a) {
    return compute_client(a).async_run<both>(
        [](actor_core& c) {
          const memory::memory_statistics st = c.manager().statistics();
          return result<both>(both{st, c.manager().usage()});
        },
        use_future_t{});
  };
  std::vector<decltype(ask(actors.front()))> asked;
  asked.reserve(actors.size());
  for (const auto& a : actors) asked.push_back(ask(a));
  std::vector<std::pair<std::string, both>> answers;
  for (std::size_t i = 0; i < actors.size(); ++i) {
    try {
      answers.emplace_back(actors[i]->info().name, asked[i].get());
    } catch (const boost::system::system_error& e) {
      // A device that shut down has no figures to give: it is left out.
      if (to_errc(e.code()) != errc::shutdown) throw;
    }
  }
  std::string out;
  for (const family& f : families) {
    out += fmt::format("# TYPE {} {}\n", f.name, f.counter ? "counter" : "gauge");
    if (f.bytes) out += fmt::format("# UNIT {} bytes\n", f.name);
    out += fmt::format("# HELP {} {}\n", f.name, f.help);
    for (const auto& [device, figures] : answers) {
      out += fmt::format("{}{}{{device=\"{}\"}} {}\n", f.name, f.counter ? "_total" : "", device,
                         f.value(figures.first, figures.second));
    }
  }
  out += "# EOF\n";
  return out;
}

}  // namespace devrt::runtime
