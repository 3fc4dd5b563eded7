// devrt-inspect snapshot: replays an allocation trace on a device with devrt's pools, records the
// memory history, and writes the snapshot that PyTorch's memory viewer reads (or JSON), with a
// summary and the format's checks.
#include <fmt/format.h>

#include <charconv>
#include <fstream>
#include <optional>

#include "devrt/devices/host_storage.hpp"
#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"
#include "devrt/memory/snapshot.hpp"
#include "inspect/cli.hpp"
#include "replay/trace.hpp"

namespace devrt::inspect {

namespace {

struct snapshot_options {
  std::string trace;
  std::optional<std::uint64_t> events;
  bool host = false;
  std::string layout = "auto";
  bool at_end = false;
  std::string output = "devrt-snapshot.pickle";
  bool json = false;
  std::size_t entries = memory::memory_manager::default_history_entries * 10;
};

bool parse_count(std::string_view s, std::uint64_t& out) {
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return !s.empty() && ec == std::errc() && p == s.data() + s.size();
}

}  // namespace

std::string snapshot_usage() {
  return R"(usage: devrt-inspect snapshot --trace FILE [--events N] [--device sim|host] [--layout L]
                                [--at peak|end] [-o FILE] [--json] [--entries N]

Replays an allocation trace (devrt, PyTorch snapshot or RMM log: tools/replay/traces) on one
device with devrt's pools, recording the memory history, and writes a snapshot in the format of
torch.cuda.memory._snapshot(): open it with `python3 -m torch.cuda._memory_viz stats|trace|
trace_plot FILE`. Prints what it holds and checks it: in every segment the blocks add up to its
size, the segments to the bytes reserved, the live blocks to the bytes in use, and every
free_completed follows its alloc.

  --trace FILE   the allocation trace
  --events N     replay the first N events only
  --device D     sim (default: an H200's properties, no memory touched) or host (real memory)
  --layout L     the pools (default: the default preset)
  --at W         peak (default): stop where the trace's live bytes peak; end: replay it all
  -o FILE        where to write it (default devrt-snapshot.pickle)
  --json         write JSON instead of a pickle
  --entries N    the history's size (default 1000000; the oldest entries are dropped)

Exit codes: 0 written and consistent, 1 the trace cannot be read, an allocation failed or a check
failed, 2 bad usage.
)";
}

int run_snapshot(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  snapshot_options o;
  auto bad = [&](const std::string& why) {
    err << "devrt-inspect snapshot: " << why << "\n(see devrt-inspect snapshot --help)\n";
    return 2;
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](std::string& into) {
      if (i + 1 >= args.size()) return false;
      into = args[++i];
      return true;
    };
    std::string v;
    if (a == "--help" || a == "-h") {
      out << snapshot_usage();
      return 0;
    } else if (a == "--trace") {
      if (!value(o.trace)) return bad("--trace needs a file");
    } else if (a == "--events") {
      std::uint64_t n = 0;
      if (!value(v) || !parse_count(v, n)) return bad("--events needs a number of events");
      o.events = n;
    } else if (a == "--device") {
      if (!value(v) || (v != "sim" && v != "host")) return bad("--device is sim or host");
      o.host = v == "host";
    } else if (a == "--layout") {
      if (!value(o.layout)) return bad("--layout needs a layout");
    } else if (a == "--at") {
      if (!value(v) || (v != "peak" && v != "end")) return bad("--at is peak or end");
      o.at_end = v == "end";
    } else if (a == "-o" || a == "--output") {
      if (!value(o.output)) return bad("-o needs a file");
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--entries") {
      std::uint64_t n = 0;
      if (!value(v) || !parse_count(v, n) || n == 0) return bad("--entries needs a positive number");
      o.entries = n;
    } else {
      return bad("unknown argument '" + a + "'");
    }
  }
  if (o.trace.empty()) return bad("--trace FILE is required");
  auto layout = memory::parse_layout(o.layout);
  if (!layout) return bad("--layout: " + layout.err().message());
  auto t = replay::read_trace(o.trace);
  if (!t) {
    err << "devrt-inspect snapshot: " << replay::trace_error_text(t.err()) << "\n";
    return 1;
  }
  if (o.events) replay::truncate(*t, *o.events);
  const replay::trace_summary summary = replay::summarize(*t);
  const std::uint64_t stop =
      o.at_end ? t->events.size() : std::min<std::uint64_t>(summary.peak_live_event + 1, t->events.size());

  memory::storage store = o.host ? memory::storage::make<devices::host_storage>(devices::host_options{})
                                 : memory::storage::make<devices::sim_storage>(devices::sim_options::h200());
  memory::manager_options mo;
  mo.name = o.host ? "host" : "sim";
  mo.layout = *layout;
  std::unique_ptr<memory::memory_manager> m;
  try {
    m = std::make_unique<memory::memory_manager>(std::move(store), mo);
  } catch (const exception& e) {
    err << "devrt-inspect snapshot: --layout " << o.layout << ": " << e.what() << "\n";
    return 1;
  }
  m->record_history(true, o.entries);
  std::vector<memory::memory_handle> live(t->allocations);
  std::uint64_t failed = 0;
  for (std::uint64_t i = 0; i < stop; ++i) {
    const replay::trace_event& e = t->events[i];
    if (e.kind == replay::event_kind::free) {
      live[e.id].reset();
      continue;
    }
    auto r = m->reserve(e.size);
    if (!r) {
      if (failed++ == 0) err << fmt::format("devrt-inspect snapshot: event {}: {}\n", i, r.err().message());
      continue;
    }
    live[e.id] = std::move(*r);
  }
  memory::memory_snapshot snap = m->snapshot();
  snap.device = mo.name;
  const std::string problem = snap.check();
  {
    std::ofstream f(o.output, std::ios::binary);
    const std::string text = o.json ? memory::to_json(snap) : memory::to_pickle({snap});
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    if (!f) {
      err << "devrt-inspect snapshot: cannot write " << o.output << "\n";
      return 1;
    }
  }
  std::uint64_t blocks = 0;
  std::uint64_t largest_free = 0;
  std::uint64_t free_bytes = 0;
  for (const auto& s : snap.segments) {
    blocks += s.blocks.size();
    for (const auto& b : s.blocks) {
      if (b.state != memory::block_state::free) continue;
      free_bytes += b.size;
      largest_free = std::max(largest_free, b.size);
    }
  }
  out << fmt::format("{}: {} of {} events replayed on {} ({}), {}\n", t->name, stop, t->events.size(), mo.name,
                     o.layout, o.at_end ? "to the end" : "to the peak of live bytes");
  out << fmt::format("segments {}, blocks {}\n", snap.segments.size(), blocks);
  out << fmt::format("total_reserved {} ({} bytes; devrt's reserved bytes: {})\n",
                     memory::format_bytes(snap.total_reserved()), snap.total_reserved(),
                     snap.statistics.bytes_reserved);
  out << fmt::format("total_allocated {} ({} bytes; devrt's bytes in use: {})\n",
                     memory::format_bytes(snap.total_allocated()), snap.total_allocated(),
                     snap.statistics.bytes_in_use);
  out << fmt::format("free in segments {}, largest free block {}\n", memory::format_bytes(free_bytes),
                     memory::format_bytes(largest_free));
  out << fmt::format("trace: {} entries ({} dropped)\n", snap.trace.size(), snap.trace_dropped);
  out << fmt::format("written: {} ({})\n", o.output, o.json ? "JSON" : "pickle for torch.cuda._memory_viz");
  if (failed != 0) out << fmt::format("failed allocations: {}\n", failed);
  out << "checks: " << (problem.empty() ? "ok" : problem) << "\n";
  return problem.empty() && failed == 0 ? 0 : 1;
}

}  // namespace devrt::inspect
