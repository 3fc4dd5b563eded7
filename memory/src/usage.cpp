#include "devrt/memory/usage.hpp"

#include <fmt/format.h>

#include "devrt/memory/config.hpp"

namespace devrt::memory {

namespace {
double percent(std::uint64_t part, std::uint64_t whole) {
  return whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
}
}  // namespace

std::string memory_usage::to_string() const {
  return fmt::format(
      "usage: {} allocations, {} in use, {} padding, {} reserved ({:.2f}% of reserved in use, padding {:.2f}% of "
      "in use)\n",
      number_allocs, format_bytes(bytes_in_use), format_bytes(bytes_padding), format_bytes(bytes_reserved),
      percent(bytes_in_use, bytes_reserved), percent(bytes_padding, bytes_in_use));
}

std::string usage_mismatch(const memory_usage& counted, const memory_usage& summed, const std::string& what) {
  if (counted == summed) return {};
  return fmt::format(
      "{}: usage counters ({} allocs, {} in use, {} padding, {} reserved) differ from what its memory adds up to ({}, "
      "{}, {}, {})",
      what, counted.number_allocs, counted.bytes_in_use, counted.bytes_padding, counted.bytes_reserved,
      summed.number_allocs, summed.bytes_in_use, summed.bytes_padding, summed.bytes_reserved);
}

std::string memory_statistics::to_string() const {
  return fmt::format(
             "statistics: reserved {}{} (peak {}), in use {} (peak {}), {} reserves ({} failed), {} driver "
             "allocations, "
             "{} "
             "driver frees, {} maps, {} unmaps, {} out-of-memory, {} explicit cleanups, {} reclaims\n",
             format_bytes(bytes_reserved),
             bytes_returning != 0 ? fmt::format(" and {} on its way back", format_bytes(bytes_returning))
                                  : std::string(),
             format_bytes(peak_bytes_reserved), format_bytes(bytes_in_use), format_bytes(peak_bytes_in_use), reserves,
             failed_reserves, driver_allocs, driver_frees, maps, unmaps, out_of_memory, cleanups, reclaims) +
         (streams > 0 || fences > 0
              ? fmt::format(
                    "streams: {} tracked ({} registered so far{}), {} fences, {} held for streams, {} waits "
                    "for fences under memory pressure{}\n",
                    streams, stream_registrations,
                    broken_streams > 0 ? fmt::format(", {} whose fences failed", broken_streams) : std::string(),
                    fences, format_bytes(bytes_held_for_streams), stream_waits,
                    peak_bytes_busy > 0
                        ? fmt::format(", peak of in use and busy on streams {}", format_bytes(peak_bytes_busy))
                        : std::string())
              : std::string()) +
         (sleeps > 0 ? fmt::format("sleep: {} sleeping, {} offloaded to the host, {} sleeps, {} wakes, {} pinned host "
                                   "memory kept for later copies\n",
                                   format_bytes(bytes_sleeping), format_bytes(bytes_offloaded), sleeps, wakes,
                                   format_bytes(bytes_host_cached))
                     : std::string());
}

}  // namespace devrt::memory
