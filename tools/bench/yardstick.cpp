// The yardstick: a textbook coalescing best-fit allocator replayed over the same events, in the
// same process, alternating with devrt's core replay, so that the two times are measured side by
// side under the same load.
//
//   devrt_bench_yardstick TRACE... [--rounds N] [--layout LAYOUT] [--json] [--devrt-only]
//
// The yardstick keeps its free blocks in a `std::set` ordered by (size, address) for the fit and
// a `std::map` by address for the merges, and the live blocks in a vector indexed by the trace's
// ids. Sizes are rounded up to 512 bytes (the simulated H200's alignment, as devrt's slices are);
// it takes address space from an unbounded range and never gives it back, and maps nothing. Its
// "peak reserved" is the highest address it used.
//
// Per round: devrt's core replay (sim H200, the layout given, `auto` by default: exactly
// `devrt-replay TRACE --json`'s loop) and the yardstick, in turns first and second (each leaves
// the heap in a state that changes the other's time). The times are the medians over the rounds
// (11 by default), and the ratio is the median of the rounds' ratios (devrt's time over the
// yardstick's in the same round), which drifts least when the machine's load changes.
//
// --devrt-only: devrt's replay alone, round after round (the yardstick's columns empty), to profile
// devrt's core with the same loop, e.g. `perf record --call-graph dwarf devrt_bench_yardstick
// TRACE --rounds 300 --devrt-only`.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/json_text.hpp"
#include "replay/replay.hpp"
#include "replay/trace.hpp"

using namespace devrt;

namespace {

using clock_type = std::chrono::steady_clock;

class textbook_best_fit {
 public:
  static constexpr std::uint64_t alignment = 512;

  std::uint64_t alloc(std::uint64_t size) {
    const std::uint64_t extent = (std::max<std::uint64_t>(size, 1) + alignment - 1) / alignment * alignment;
    auto it = by_size_.lower_bound({extent, 0});
    if (it == by_size_.end()) {
      // No free block fits: take it from the top (merged with a free block that ends there).
      std::uint64_t at = top_;
      if (auto last = by_address_.rbegin(); last != by_address_.rend() && last->first + last->second == top_) {
        at = last->first;
        by_size_.erase({last->second, last->first});
        by_address_.erase(std::next(last).base());
      }
      top_ = at + extent;
      high_ = std::max(high_, top_);
      return at;
    }
    const auto [block, at] = *it;
    by_size_.erase(it);
    by_address_.erase(at);
    if (block > extent) {
      by_size_.insert({block - extent, at + extent});
      by_address_.emplace(at + extent, block - extent);
    }
    return at;
  }

  void free(std::uint64_t at, std::uint64_t size) {
    std::uint64_t extent = (std::max<std::uint64_t>(size, 1) + alignment - 1) / alignment * alignment;
    auto next = by_address_.lower_bound(at);
    if (next != by_address_.end() && next->first == at + extent) {
      extent += next->second;
      by_size_.erase({next->second, next->first});
      next = by_address_.erase(next);
    }
    if (next != by_address_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == at) {
        by_size_.erase({prev->second, prev->first});
        at = prev->first;
        extent += prev->second;
        by_address_.erase(prev);
      }
    }
    by_size_.insert({extent, at});
    by_address_.emplace(at, extent);
  }

  [[nodiscard]] std::uint64_t high_water() const noexcept { return high_; }

 private:
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_size_;  // (extent, address)
  std::map<std::uint64_t, std::uint64_t> by_address_;          // address -> extent
  std::uint64_t top_ = 0;
  std::uint64_t high_ = 0;
};

struct yardstick_result {
  double ns_per_event = 0;
  std::uint64_t high_water = 0;
};

yardstick_result run_yardstick(const replay::trace& t) {
  struct live {
    std::uint64_t at = 0;
    std::uint64_t size = 0;
  };
  std::vector<live> blocks(t.allocations);
  textbook_best_fit a;
  const auto start = clock_type::now();
  for (const replay::trace_event& e : t.events) {
    if (e.kind == replay::event_kind::alloc) {
      blocks[e.id] = live{a.alloc(e.size), e.size};
    } else {
      a.free(blocks[e.id].at, blocks[e.id].size);
    }
  }
  const auto stop = clock_type::now();
  yardstick_result r;
  r.ns_per_event = std::chrono::duration<double, std::nano>(stop - start).count() /
                   static_cast<double>(std::max<std::size_t>(t.events.size(), 1));
  r.high_water = a.high_water();
  return r;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int usage(const char* what) {
  std::fprintf(stderr,
               "devrt_bench_yardstick: %s\nusage: devrt_bench_yardstick TRACE... [--rounds N] [--layout LAYOUT] "
               "[--json] [--devrt-only]\n",
               what);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> paths;
  int rounds = 11;
  bool json = false;
  bool devrt_only = false;
  std::string layout_text = "auto";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) {
      const std::string_view v = argv[++i];
      const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), rounds);
      if (ec != std::errc() || end != v.data() + v.size() || rounds < 1 || rounds > 100000) {
        return usage(("bad value for --rounds: '" + std::string(v) + "' (expected 1 to 100000)").c_str());
      }
    } else if (a == "--layout" && i + 1 < argc) {
      layout_text = argv[++i];
    } else if (a == "--json") {
      json = true;
    } else if (a == "--devrt-only") {
      devrt_only = true;
    } else if (a.starts_with("-")) {
      return usage(("unknown option " + a).c_str());
    } else {
      paths.push_back(a);
    }
  }
  if (paths.empty()) return usage("no trace given");
  auto layout = memory::parse_layout(layout_text);
  if (!layout) return usage(("bad layout: " + layout.err().message()).c_str());

  if (!json) {
    fmt::print(
        "| trace | devrt ns/event | yardstick ns/event | devrt / yardstick (median of rounds) | peak reserved / peak "
        "live | "
        "yardstick peak / peak live | maps / unmaps |\n|---|---|---|---|---|---|---|\n");
  }
  for (const std::string& path : paths) {
    auto t = replay::read_trace(path);
    if (!t) {
      std::fprintf(stderr, "devrt_bench_yardstick: %s\n", replay::trace_error_text(t.err()).c_str());
      return 1;
    }
    if (t->events.empty()) {
      std::fprintf(stderr, "devrt_bench_yardstick: %s: the trace has no events\n", path.c_str());
      return 1;
    }
    std::vector<double> devrt_ns;
    std::vector<double> yard_ns;
    std::vector<double> ratios;
    replay::replay_result last;
    yardstick_result yard;
    for (int k = 0; k < rounds; ++k) {
      replay::replay_options o;
      o.layout = *layout;
      // Alternately first and second, so that neither always runs on the heap the other left.
      if (!devrt_only && k % 2 == 1) yard = run_yardstick(*t);
      auto r = replay::replay(*t, o);
      if (!r) {
        std::fprintf(stderr, "devrt_bench_yardstick: %s: %s\n", path.c_str(), r.err().message().c_str());
        return 1;
      }
      if (!devrt_only && k % 2 == 0) yard = run_yardstick(*t);
      devrt_ns.push_back(r->ns_per_event);
      if (!devrt_only) {
        yard_ns.push_back(yard.ns_per_event);
        ratios.push_back(r->ns_per_event / yard.ns_per_event);
      }
      last = std::move(*r);
    }
    const double d = median(devrt_ns);
    const double live = static_cast<double>(std::max<std::uint64_t>(last.peak_live_bytes, 1));
    std::string name = t->name;
    if (name.ends_with(".trace.gz")) name.resize(name.size() - 9);
    if (devrt_only) {
      if (json) {
        fmt::print("{{\"trace\": {}, \"rounds\": {}, \"layout\": {}, \"devrt_ns_per_event\": {:.1f}}}\n",
                   tools::json_string(name), rounds, tools::json_string(layout_text), d);
      } else {
        fmt::print("| {} | {:.1f} | - | - | {:.3f} | - | {} / {} |\n", name, d, last.ratio, last.maps, last.unmaps);
      }
      std::fflush(stdout);
      continue;
    }
    const double y = median(yard_ns);
    if (json) {
      fmt::print(
          "{{\"trace\": {}, \"rounds\": {}, \"layout\": {}, \"devrt_ns_per_event\": {:.1f}, "
          "\"yardstick_ns_per_event\": {:.1f}, \"ratio_of_medians\": {:.3f}, \"ratio\": {:.3f}, "
          "\"peak_live_bytes\": {}, \"peak_reserved_bytes\": {}, \"peak_ratio\": {:.3f}, "
          "\"yardstick_peak_ratio\": {:.3f}, \"maps\": {}, \"unmaps\": {}, \"failures\": {}}}\n",
          tools::json_string(name), rounds, tools::json_string(layout_text), d, y, d / y, median(ratios),
          last.peak_live_bytes, last.peak_reserved_bytes, last.ratio, static_cast<double>(yard.high_water) / live,
          last.maps, last.unmaps, last.failures);
    } else {
      fmt::print("| {} | {:.1f} | {:.1f} | {:.2f} | {:.3f} | {:.3f} | {} / {} |\n", name, d, y, median(ratios),
                 last.ratio, static_cast<double>(yard.high_water) / live, last.maps, last.unmaps);
    }
    std::fflush(stdout);
  }
  return 0;
}
