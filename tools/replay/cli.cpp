#include "replay/cli.hpp"

#include <fmt/format.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "common/json_text.hpp"

namespace devrt::replay {

namespace {

constexpr double gib = 1073741824.0;

error usage_error(std::string what) {
  error e = error::make(errc::malformed_config, "bad command line");
  e.text = std::move(what);
  return e;
}

bool parse_count(std::string_view s, std::uint64_t& out) {
  if (s.empty()) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size();
}

using tools::json_string;

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string gib_text(std::uint64_t bytes) { return fmt::format("{:.3f} GiB", static_cast<double>(bytes) / gib); }

/// Writes the timeline files; returns the lines to report (or the error's text).
result<std::vector<std::string>> write_timeline(const cli_options& o, const trace& t, const replay_result& r) {
  const std::string& prefix = *o.timeline_prefix;
  const std::string csv = prefix + ".csv";
  if (auto w = write_timeline_csv(csv, r.timeline); !w) return std::move(w).err();
  std::vector<std::string> made{csv};
  const std::string title =
      fmt::format("{} - layout {} on {} (ratio {:.3f})", t.name, o.layout_text, r.device, r.ratio);
  std::string script;
  std::vector<std::string> plots;
  if (o.timeline_png) plots.push_back(prefix + ".png");
  if (o.timeline_svg) plots.push_back(prefix + ".svg");
  for (const auto& p : plots) script += gnuplot_script(csv, p, title);
  // The script is kept either way so the plot can be made later, elsewhere.
  const std::string gp = prefix + ".gp";
  if (std::FILE* f = std::fopen(gp.c_str(), "w"); f != nullptr) {
    std::fputs(script.c_str(), f);
    std::fclose(f);
    made.push_back(gp);
  }
  const std::string gnuplot = find_gnuplot();
  if (gnuplot.empty()) {
    made.push_back(fmt::format("(gnuplot is not installed: no plot; install gnuplot-nox and run gnuplot {})", gp));
    return made;
  }
  const std::string cmd = shell_quote(gnuplot) + " " + shell_quote(gp);
  const int rc = std::system(cmd.c_str());  // NOLINT(concurrency-mt-unsafe,cert-env33-c): the replay is over
  if (rc != 0) {
    made.push_back(fmt::format("(gnuplot failed with status {}: no plot)", rc));
    return made;
  }
  made.insert(made.end(), plots.begin(), plots.end());
  return made;
}

class progress_line {
 public:
  explicit progress_line(std::ostream& err) : err_(err) {}
  void show(std::uint64_t done, std::uint64_t total) {
    const double pct = total != 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0;
    std::string line =
        fmt::format("devrt-replay: {:5.1f}% ({} / {} events)", pct, group_digits(done), group_digits(total));
    width_ = std::max(width_, line.size());
    err_ << '\r' << line << std::flush;
  }
  void clear() {
    if (width_ == 0) return;
    err_ << '\r' << std::string(width_, ' ') << '\r' << std::flush;
    width_ = 0;
  }

 private:
  std::ostream& err_;
  std::size_t width_ = 0;
};

std::string replay_error_text(const error& e) {
  // CUDA errors carry their whole sentence in `text` (see cuda_replay.hpp).
  if (e.code == errc::device_error && !e.text.empty()) return e.text;
  return trace_error_text(e);
}

std::string baseline_text(baseline_kind b) {
  return b == baseline_kind::cuda_malloc ? "cudaMalloc/cudaFree"
                                         : "cudaMallocAsync/cudaFreeAsync on one stream, release threshold UINT64_MAX";
}

/// devrt's calls to the driver. On a CUDA device they are counted where they are made (the
/// storage's profile). Elsewhere they are derived from the statistics: every mapping of an arena is
/// one physical allocation (cuMemCreate), one cuMemMap and one cuMemSetAccess, every unmap one
/// cuMemUnmap and one cuMemRelease (upper bounds: a mapping revived at the bounds of a pending
/// unmap, or given a kept physical allocation, makes fewer); pages of the other pools are one
/// allocation and one free each.
struct driver_calls {
  std::uint64_t creates = 0, maps = 0, access = 0, unmaps = 0, releases = 0, page_allocs = 0, page_frees = 0;
  [[nodiscard]] std::uint64_t total() const noexcept {
    return creates + maps + access + unmaps + releases + page_allocs + page_frees;
  }
};
driver_calls driver_calls_of(const replay_result& r) {
  if (!r.driver_measured)
    return driver_calls{r.maps, r.maps, r.maps, r.unmaps, r.unmaps, r.driver_allocs, r.driver_frees};
  auto calls = [&r](std::string_view name) -> std::uint64_t {
    for (const auto& d : r.driver_times) {
      if (d.call == name) return d.calls;
    }
    return 0;
  };
  return driver_calls{r.physical_creates,    calls("cuMemMap"), calls("cuMemSetAccess"), calls("cuMemUnmap"),
                      calls("cuMemRelease"), r.driver_allocs,   r.driver_frees};
}

/// The driver's calls and their time, as a JSON array.
std::string driver_times_json(const replay_result& r) {
  std::string j = "[";
  for (const auto& d : r.driver_times) {
    if (j.size() > 1) j += ", ";
    j += fmt::format("{{\"call\": {}, \"calls\": {}, \"seconds\": {:.6f}}}", json_string(d.call), d.calls, d.seconds);
  }
  return j + "]";
}

/// The driver's calls and their time, a line each (for the text output).
std::string driver_times_text(const replay_result& r) {
  std::string t;
  for (const auto& d : r.driver_times) {
    if (d.calls == 0) continue;
    t += fmt::format("  {:<22} {:>9} calls {:>10.3f} ms {:>9.1f} us/call\n", d.call, group_digits(d.calls),
                     d.seconds * 1e3, d.seconds * 1e6 / static_cast<double>(d.calls));
  }
  return t;
}
/// The floor of map calls: the fewest mappings of the arena's largest (its default `grow`,
/// 256 MiB) that hold the peak of live bytes.
constexpr std::uint64_t floor_mapping_size = std::uint64_t{256} << 20;
std::uint64_t floor_maps(const replay_result& r) {
  return (r.peak_live_bytes + floor_mapping_size - 1) / floor_mapping_size;
}
/// The floor in words: "N maps" ("1 map").
std::string floor_maps_text(const replay_result& r) {
  const std::uint64_t n = floor_maps(r);
  return fmt::format("{} map{}", group_digits(n), n == 1 ? "" : "s");
}

/// The figures of one run as JSON fields (no braces).
std::string run_json(const replay_result& r, const std::string& layout) {
  std::string j;
  const auto field = [&j](std::string_view key, const std::string& v) {
    if (!j.empty()) j += ", ";
    j += json_string(key);
    j += ": ";
    j += v;
  };
  field("allocator", json_string(r.allocator));
  field("device", json_string(r.device));
  field("layout", json_string(layout));
  field("events", std::to_string(r.events));
  field("allocations", std::to_string(r.allocations));
  field("frees", std::to_string(r.frees));
  field("seconds", fmt::format("{:.6f}", r.seconds));
  field("ns_per_event", fmt::format("{:.1f}", r.ns_per_event));
  field("events_per_second", fmt::format("{:.0f}", r.events_per_second));
  field("peak_live_bytes", std::to_string(r.peak_live_bytes));
  field("peak_live_gib", fmt::format("{:.3f}", static_cast<double>(r.peak_live_bytes) / gib));
  field("peak_in_use_bytes", std::to_string(r.peak_in_use_bytes));
  field("peak_reserved_bytes", std::to_string(r.peak_reserved_bytes));
  field("peak_reserved_gib", fmt::format("{:.3f}", static_cast<double>(r.peak_reserved_bytes) / gib));
  field("peak_reserved_source", json_string(r.peak_reserved_source));
  field("ratio", fmt::format("{:.3f}", r.ratio));
  field("reserved_at_end_bytes", std::to_string(r.reserved_at_end));
  field("driver_allocs", std::to_string(r.driver_allocs));
  field("driver_frees", std::to_string(r.driver_frees));
  field("maps", std::to_string(r.maps));
  field("unmaps", std::to_string(r.unmaps));
  if (r.allocator == "devrt") {
    const driver_calls c = driver_calls_of(r);
    field("driver_calls",
          fmt::format("{{\"physical_creates\": {}, \"maps\": {}, \"access_calls\": {}, \"unmaps\": {}, "
                      "\"releases\": {}, \"page_allocs\": {}, \"page_frees\": {}, \"total\": {}}}",
                      c.creates, c.maps, c.access, c.unmaps, c.releases, c.page_allocs, c.page_frees, c.total()));
    field("floor_maps", std::to_string(floor_maps(r)));
    if (r.driver_measured) {
      field("reused_allocations", std::to_string(r.reused_allocations));
      field("driver_time", driver_times_json(r));
    }
  }
  field("memory_limit_bytes", std::to_string(r.memory_limit));
  field("failures", std::to_string(r.failures));
  field("first_failure", json_string(r.first_failure));
  field("stopped", r.stopped ? "true" : "false");
  return j;
}

/// --compare: devrt on cuda, cudaMallocAsync, cudaMalloc (a prefix), one after the other.
int run_compare(const cli_options& o, const trace& t, std::uint64_t trace_events, double read_seconds,
                std::ostream& out, std::ostream& err, bool err_is_terminal) {
  struct row {
    std::string name;
    std::string layout;
    replay_result r;
  };
  std::vector<row> rows;
  progress_line bar(err);
  const bool show = o.progress.value_or(err_is_terminal);
  const auto one = [&](const trace& tr, std::optional<baseline_kind> b, std::string name) -> bool {
    replay_options ro;
    ro.device = device_choice::cuda;
    ro.layout = o.layout;
    ro.baseline = b;
    ro.strict = o.strict;
    ro.memory_limit = o.memory_limit;
    if (show) ro.progress = [&bar](std::uint64_t done, std::uint64_t total) { bar.show(done, total); };
    auto r = replay(tr, ro);
    bar.clear();
    if (!r) {
      err << "devrt-replay: " << name << ": " << replay_error_text(r.err()) << "\n";
      return false;
    }
    rows.push_back(row{std::move(name), b ? std::string() : o.layout_text, std::move(*r)});
    return true;
  };
  // devrt first: the cudaMallocAsync baseline changes the default pool's threshold while it runs
  // (it puts it back and trims the pool after), and devrt's storage takes its pages from that pool.
  if (!one(t, std::nullopt, fmt::format("devrt ({})", o.layout_text))) return 1;
  if (!one(t, baseline_kind::cuda_malloc_async, "cudaMallocAsync")) return 1;
  trace prefix = t;
  truncate(prefix, std::min<std::uint64_t>(prefix.events.size(), compare_malloc_events));
  if (!one(prefix, baseline_kind::cuda_malloc, "cudaMalloc")) return 1;

  if (o.json) {
    std::string j = "{";
    j += fmt::format(
        "\"trace\": {}, \"path\": {}, \"format\": {}, \"header\": {}, \"trace_events\": {}, "
        "\"skipped\": {}, \"read_seconds\": {:.6f}, \"mode\": \"compare\", \"runs\": [",
        json_string(t.name), json_string(o.trace_path), json_string(to_string(t.format)), json_string(t.header),
        trace_events, t.skipped, read_seconds);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (i != 0) j += ", ";
      j += "{\"name\": " + json_string(rows[i].name) + ", " + run_json(rows[i].r, rows[i].layout) + "}";
    }
    out << j << "]}\n";
  } else {
    out << fmt::format(
        "trace          {} ({} format, {}{})\n", t.name, to_string(t.format),
        o.limit ? fmt::format("first {} of {} events", group_digits(t.events.size()), group_digits(trace_events))
                : fmt::format("{} events", group_digits(t.events.size())),
        t.skipped != 0 ? fmt::format(", {} allocate failures skipped", t.skipped) : "");
    out << fmt::format("device         {}\n", rows.front().r.device);
    out << fmt::format("{:<28} {:>11} {:>10} {:>11} {:>14} {:>7} {:>24} {:>8}\n", "allocator", "events", "ns/event",
                       "peak live", "peak reserved", "ratio", "driver calls", "failures");
    for (const row& w : rows) {
      const replay_result& r = w.r;
      // devrt maps memory (its allocs/frees are pages of other pools); the baselines allocate.
      const std::string calls =
          r.allocator == "devrt"
              ? fmt::format("{} maps / {} unmaps", group_digits(r.maps), group_digits(r.unmaps))
              : fmt::format("{} allocs / {} frees", group_digits(r.driver_allocs), group_digits(r.driver_frees));
      out << fmt::format("{:<28} {:>11} {:>10.1f} {:>11} {:>14} {:>7.3f} {:>24} {:>8}\n", w.name,
                         group_digits(r.events), r.ns_per_event, gib_text(r.peak_live_bytes),
                         gib_text(r.peak_reserved_bytes), r.ratio, calls, group_digits(r.failures));
    }
    for (const row& w : rows) {
      if (w.r.allocator != "devrt") continue;
      const driver_calls c = driver_calls_of(w.r);
      out << fmt::format(
          "devrt's driver calls: {} physical creates, {} maps, {} access calls, {} unmaps, {} releases{} ({} in all); "
          "the floor, the peak live bytes in mappings of 256 MiB: {}\n",
          group_digits(c.creates), group_digits(c.maps), group_digits(c.access), group_digits(c.unmaps),
          group_digits(c.releases),
          c.page_allocs + c.page_frees != 0 ? fmt::format(", {} page allocations, {} page frees",
                                                          group_digits(c.page_allocs), group_digits(c.page_frees))
                                            : std::string(),
          group_digits(c.total()), floor_maps_text(w.r));
      if (w.r.driver_measured) {
        out << fmt::format("devrt's time in the driver ({} maps of a kept physical allocation):\n{}",
                           group_digits(w.r.reused_allocations), driver_times_text(w.r));
      }
    }
    out << "peak reserved: devrt from its statistics; cudaMallocAsync from cudaMemPoolAttrReservedMemHigh; "
           "cudaMalloc from cudaMemGetInfo samples (device-wide)\n";
    for (const row& w : rows) {
      if (w.r.failures != 0) out << fmt::format("first failure  {}: {}\n", w.name, w.r.first_failure);
    }
  }
  for (const row& w : rows) {
    if (w.r.stopped) return 1;
  }
  return 0;
}

}  // namespace

std::string group_digits(std::uint64_t n) {
  std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string usage() {
  return R"(usage: devrt-replay TRACE [options]

Replays an allocation trace against devrt and reports time per event and memory held.

  TRACE                   devrt trace (.trace.gz or plain) or RMM CSV allocation log
  --format devrt|rmm      trace format (default: from the file name, then its first line)
  --device sim|sim-gpu|host|cuda
                          sim: a simulated H200 (default); sim-gpu: the same, with work in
                          queue order and unmaps completing behind it as on a GPU (what the
                          arena does over CUDA storage, without a GPU); host: real host memory,
                          512-byte alignment, pages up to 1 GiB; cuda: GPU 0 through devrt's
                          CUDA storage (cudaMallocAsync pages on one stream; core mode only;
                          CUDA builds)
  --baseline cudaMalloc|cudaMallocAsync
                          replay against the CUDA runtime on GPU 0 instead of devrt (CUDA
                          builds): cudaMalloc/cudaFree, or cudaMallocAsync/cudaFreeAsync on one
                          stream from the default pool with release threshold UINT64_MAX.
                          cudaMalloc costs ~35 us an event: use --limit 200000
  --compare               devrt on cuda, cudaMallocAsync and cudaMalloc (first 200,000 events
                          at most) in one run, one table (CUDA builds)
  --layout LAYOUT         pool layout: auto (default: arena where the device maps memory,
                          sub-slices elsewhere), arena, sub-slices, exclusive-pages, or pools
                          such as "sliced:page=64MiB,slice=8MiB;exclusive:max=1MiB" or
                          "arena:granule=8MiB,slack=64MiB"
  --threads N             actor mode: N client threads of one runtime (ids spread by id % N)
  --wait                  actor mode: reserve().get() per allocation instead of create()
  --strict                stop at the first failed reserve (exit code 1; in actor mode, with --wait)
  --memory-limit L        the device's memory limit: bytes (3GiB), or F times the trace's peak of
                          live bytes (1.05x); devrt's limit (devrt_set_memory_limit), and for a
                          baseline a balloon (cudaMalloc of what is free beyond it) that leaves
                          it exactly L of the GPU
  --gpu-lag N             with --device sim-gpu (core mode): the simulated GPU runs N events
                          behind the requests, as under a training loop, so that unmaps wait
                          behind busy work (default 0: idle, as in a replay on the GPU itself)
  --limit N               replay only the first N events
  --json                  one JSON object on stdout with every figure
  --timeline PREFIX       core mode: write PREFIX.csv (about 2000 samples of live and reserved
                          bytes), PREFIX.gp and, when gnuplot is installed, the plot
  --timeline-format F     png (default), svg or both
  --progress, --no-progress
                          progress line on stderr (default: on when stderr is a terminal)
  --help                  this text

Exit codes: 0 replayed, 1 unreadable or malformed trace, --strict failure, or the CUDA device
cannot be used, 2 bad usage (also: a CUDA option in a build without CUDA).
)";
}

result<cli_options> parse_args(const std::vector<std::string>& args) {
  cli_options o;
  bool format_given = false;
  bool have_trace = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string name = args[i];
    std::optional<std::string> inline_value;
    if (name.starts_with("--")) {
      if (const std::size_t eq = name.find('='); eq != std::string::npos) {
        inline_value = name.substr(eq + 1);
        name.resize(eq);
      }
    }
    const auto value = [&]() -> result<std::string> {
      if (inline_value) return *inline_value;
      if (i + 1 >= args.size()) return usage_error(fmt::format("option {} needs a value", name));
      return args[++i];
    };
    const auto flag = [&](bool& target) -> result<void> {
      if (inline_value) return usage_error(fmt::format("option {} takes no value", name));
      target = true;
      return {};
    };
    result<void> ok;
    if (name == "--help" || name == "-h") {
      o.help = true;
    } else if (name == "--format") {
      auto v = value();
      if (!v) return std::move(v).err();
      auto f = parse_trace_format(*v);
      if (!f) return usage_error(fmt::format("bad value for --format: '{}' (expected devrt or rmm)", *v));
      o.format = *f;
    } else if (name == "--device") {
      auto v = value();
      if (!v) return std::move(v).err();
      if (*v == "sim") {
        o.device = device_choice::sim;
      } else if (*v == "sim-gpu") {
        o.device = device_choice::sim_gpu;
      } else if (*v == "host") {
        o.device = device_choice::host;
      } else if (*v == "cuda") {
        if (!built_with_cuda()) return usage_error("--device cuda: this devrt-replay was built without CUDA");
        o.device = device_choice::cuda;
      } else {
        return usage_error(fmt::format("bad value for --device: '{}' (expected sim, sim-gpu, host or cuda)", *v));
      }
      o.device_given = true;
    } else if (name == "--baseline") {
      auto v = value();
      if (!v) return std::move(v).err();
      if (*v == "cudaMalloc") {
        o.baseline = baseline_kind::cuda_malloc;
      } else if (*v == "cudaMallocAsync") {
        o.baseline = baseline_kind::cuda_malloc_async;
      } else {
        return usage_error(fmt::format("bad value for --baseline: '{}' (expected cudaMalloc or cudaMallocAsync)", *v));
      }
      if (!built_with_cuda()) return usage_error("--baseline: this devrt-replay was built without CUDA");
    } else if (name == "--compare") {
      ok = flag(o.compare);
      if (ok && !built_with_cuda()) return usage_error("--compare: this devrt-replay was built without CUDA");
    } else if (name == "--layout") {
      auto v = value();
      if (!v) return std::move(v).err();
      o.layout_text = *v;
    } else if (name == "--threads") {
      auto v = value();
      if (!v) return std::move(v).err();
      std::uint64_t n = 0;
      if (!parse_count(*v, n) || n == 0 || n > 1024) {
        return usage_error(fmt::format("bad value for --threads: '{}' (expected 1 to 1024)", *v));
      }
      o.threads = n;
    } else if (name == "--memory-limit") {
      auto v = value();
      if (!v) return std::move(v).err();
      const std::string& text = *v;
      bool ok_limit = false;
      if (!text.empty() && (text.back() == 'x' || text.back() == 'X')) {
        const std::string number = text.substr(0, text.size() - 1);
        char* end = nullptr;
        const double f = number.empty() ? 0.0 : std::strtod(number.c_str(), &end);
        ok_limit = end != nullptr && *end == '\0' && f > 0.0 && f <= 1000.0;
        o.memory_limit_factor = f;
      } else if (auto b = memory::parse_size(text); b && *b != 0) {
        o.memory_limit = *b;
        ok_limit = true;
      }
      if (!ok_limit) {
        return usage_error(fmt::format(
            "bad value for --memory-limit: '{}' (expected bytes such as 3GiB, or F times the trace's peak of live "
            "bytes such as 1.05x)",
            text));
      }
    } else if (name == "--gpu-lag") {
      auto v = value();
      if (!v) return std::move(v).err();
      std::uint64_t n = 0;
      if (!parse_count(*v, n) || n > 1'000'000) {
        return usage_error(fmt::format("bad value for --gpu-lag: '{}' (expected 0 to 1000000 events)", *v));
      }
      o.gpu_lag = n;
    } else if (name == "--limit") {
      auto v = value();
      if (!v) return std::move(v).err();
      std::uint64_t n = 0;
      if (!parse_count(*v, n) || n == 0) {
        return usage_error(fmt::format("bad value for --limit: '{}' (expected a positive number of events)", *v));
      }
      o.limit = n;
    } else if (name == "--timeline") {
      auto v = value();
      if (!v) return std::move(v).err();
      if (v->empty()) return usage_error("bad value for --timeline: the prefix is empty");
      o.timeline_prefix = *v;
    } else if (name == "--timeline-format") {
      auto v = value();
      if (!v) return std::move(v).err();
      format_given = true;
      o.timeline_png = *v == "png" || *v == "both";
      o.timeline_svg = *v == "svg" || *v == "both";
      if (!o.timeline_png && !o.timeline_svg) {
        return usage_error(fmt::format("bad value for --timeline-format: '{}' (expected png, svg or both)", *v));
      }
    } else if (name == "--wait") {
      ok = flag(o.wait);
    } else if (name == "--strict") {
      ok = flag(o.strict);
    } else if (name == "--json") {
      ok = flag(o.json);
    } else if (name == "--progress" || name == "--no-progress") {
      bool unused = false;
      ok = flag(unused);
      o.progress = name == "--progress";
    } else if (name.starts_with("-") && name != "-") {
      return usage_error(fmt::format("unknown option '{}'", args[i]));
    } else {
      if (have_trace) return usage_error(fmt::format("more than one trace given: '{}' and '{}'", o.trace_path, name));
      o.trace_path = name;
      have_trace = true;
    }
    if (!ok) return std::move(ok).err();
  }
  if (o.help) return o;
  if (!have_trace) return usage_error("no trace given");
  if (o.wait && o.threads == 0) return usage_error("--wait needs --threads (it applies to actor mode)");
  if (o.timeline_prefix && o.threads != 0) {
    return usage_error("--timeline works in core mode only (the actor's reserved bytes are not sampled)");
  }
  if (o.baseline && o.compare) return usage_error("--baseline and --compare do not go together");
  if (o.baseline || o.compare) {
    const char* what = o.compare ? "--compare" : "--baseline";
    if (o.device_given && o.device != device_choice::cuda) {
      return usage_error(fmt::format("{} runs on the GPU: --device {} does not apply", what, to_string(o.device)));
    }
    if (o.threads != 0) return usage_error(fmt::format("{} works in core mode only (no --threads)", what));
    if (o.timeline_prefix) return usage_error(fmt::format("{} does not write a timeline", what));
    if (o.compare) o.device = device_choice::cuda;
  }
  if (o.device == device_choice::cuda && o.threads != 0) {
    return usage_error("--device cuda works in core mode only (no --threads)");
  }
  if (o.gpu_lag != 0 && (o.device != device_choice::sim_gpu || o.threads != 0)) {
    return usage_error("--gpu-lag needs --device sim-gpu in core mode (no --threads)");
  }
  if (format_given && !o.timeline_prefix) return usage_error("--timeline-format needs --timeline PREFIX");
  if (o.strict && o.threads != 0 && !o.wait) {
    return usage_error(
        "--strict in actor mode needs --wait: create() reports a failed reserve only when its handle is used");
  }
  auto layout = memory::parse_layout(o.layout_text);
  if (!layout) return usage_error(fmt::format("bad value for --layout: {}", layout.err().message()));
  // A GPU's properties are known only once it is opened: the manager validates the layout then.
  if (o.device == device_choice::cuda) {
    o.layout = *layout;
    return o;
  }
  if (auto resolved = memory::resolve_layout(*layout, properties_of(o.device)); !resolved) {
    return usage_error(
        fmt::format("bad value for --layout on the {} device: {}", to_string(o.device), resolved.err().message()));
  }
  o.layout = *layout;
  return o;
}

int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err, bool err_is_terminal) {
  auto parsed = parse_args(args);
  if (!parsed) {
    err << "devrt-replay: " << trace_error_text(parsed.err()) << "\n(see devrt-replay --help)\n";
    return 2;
  }
  cli_options o = *parsed;  // --memory-limit Fx is resolved once the trace is read
  if (o.help) {
    out << usage();
    return 0;
  }

  const auto read_start = std::chrono::steady_clock::now();
  auto t = read_trace(o.trace_path, o.format);
  const double read_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - read_start).count();
  if (!t) {
    err << "devrt-replay: " << trace_error_text(t.err()) << "\n";
    return 1;
  }
  const std::uint64_t trace_events = t->events.size();
  if (trace_events == 0) {
    err << "devrt-replay: " << o.trace_path << ": the trace has no events\n";
    return 1;
  }
  if (o.limit) truncate(*t, *o.limit);
  if (o.memory_limit_factor > 0) {
    const std::uint64_t peak = summarize(*t).peak_live_bytes;
    const double bytes = static_cast<double>(peak) * o.memory_limit_factor;
    // A limit of 0 bytes would mean none, and one past 2^64 cannot be set.
    if (bytes < 1 || bytes >= 18446744073709551616.0) {
      err << fmt::format(
          "devrt-replay: --memory-limit {}x of the trace's peak of live bytes ({}) is {} byte(s): give a factor "
          "whose limit is at least 1 byte and below 2^64, or a number of bytes\n(see devrt-replay --help)\n",
          o.memory_limit_factor, peak, bytes < 1 ? "under 1" : "2^64 or more");
      return 2;
    }
    o.memory_limit = static_cast<std::uint64_t>(bytes);
  }

  if (o.compare) return run_compare(o, *t, trace_events, read_seconds, out, err, err_is_terminal);

  progress_line bar(err);
  replay_options ro;
  ro.baseline = o.baseline;
  ro.device = o.device;
  ro.layout = o.layout;
  ro.threads = o.threads;
  ro.wait = o.wait;
  ro.strict = o.strict;
  ro.gpu_lag = o.gpu_lag;
  ro.memory_limit = o.memory_limit;
  ro.timeline_samples = o.timeline_prefix ? 2000 : 0;
  if (o.progress.value_or(err_is_terminal)) {
    ro.progress = [&bar](std::uint64_t done, std::uint64_t total) { bar.show(done, total); };
  }
  auto r = replay(*t, ro);
  bar.clear();
  if (!r) {
    // Layouts were validated with the arguments (on cuda: by the manager, against the GPU); what
    // is left is the runtime failing to start or the GPU that cannot be used.
    err << "devrt-replay: " << replay_error_text(r.err()) << "\n";
    return 1;
  }

  std::vector<std::string> timeline_lines;
  std::string timeline_error;
  if (o.timeline_prefix) {
    auto w = write_timeline(o, *t, *r);
    if (w) {
      timeline_lines = std::move(*w);
    } else {
      timeline_error = trace_error_text(w.err());
    }
  }

  const std::string mode = o.baseline ? std::string("baseline")
                           : r->actor ? fmt::format("actor, {} thread{}, {}", r->threads, r->threads == 1 ? "" : "s",
                                                    o.wait ? "reserve().get()" : "create()")
                                      : std::string("core");
  if (o.json) {
    std::string j = "{";
    const auto field = [&j](std::string_view key, const std::string& v) {
      if (j.size() > 1) j += ", ";
      j += json_string(key);
      j += ": ";
      j += v;
    };
    field("trace", json_string(t->name));
    field("path", json_string(o.trace_path));
    field("format", json_string(to_string(t->format)));
    field("header", json_string(t->header));
    field("trace_events", std::to_string(trace_events));
    field("skipped", std::to_string(t->skipped));
    field("read_seconds", fmt::format("{:.6f}", read_seconds));
    field("mode", json_string(o.baseline ? "baseline" : r->actor ? "actor" : "core"));
    field("allocator", json_string(r->allocator));
    field("peak_reserved_source", json_string(r->peak_reserved_source));
    field("device", json_string(r->device));
    field("layout", json_string(o.layout_text));
    field("threads", std::to_string(r->threads));
    field("wait", o.wait ? "true" : "false");
    field("events", std::to_string(r->events));
    field("allocations", std::to_string(r->allocations));
    field("frees", std::to_string(r->frees));
    field("deferred_frees", std::to_string(r->deferred_frees));
    field("seconds", fmt::format("{:.6f}", r->seconds));
    field("ns_per_event", fmt::format("{:.1f}", r->ns_per_event));
    field("events_per_second", fmt::format("{:.0f}", r->events_per_second));
    field("peak_live_bytes", std::to_string(r->peak_live_bytes));
    field("peak_live_gib", fmt::format("{:.3f}", static_cast<double>(r->peak_live_bytes) / gib));
    field("peak_in_use_bytes", std::to_string(r->peak_in_use_bytes));
    field("peak_reserved_bytes", std::to_string(r->peak_reserved_bytes));
    field("peak_reserved_gib", fmt::format("{:.3f}", static_cast<double>(r->peak_reserved_bytes) / gib));
    field("ratio", fmt::format("{:.3f}", r->ratio));
    field("reserved_at_end_bytes", std::to_string(r->reserved_at_end));
    field("driver_allocs", std::to_string(r->driver_allocs));
    field("driver_frees", std::to_string(r->driver_frees));
    field("maps", std::to_string(r->maps));
    field("unmaps", std::to_string(r->unmaps));
    if (r->allocator == "devrt") field("floor_maps", std::to_string(floor_maps(*r)));
    field("memory_limit_bytes", std::to_string(r->memory_limit));
    field("gpu_lag", std::to_string(o.gpu_lag));
    if (r->driver_measured) {
      field("physical_creates", std::to_string(r->physical_creates));
      field("reused_allocations", std::to_string(r->reused_allocations));
      field("driver_time", driver_times_json(*r));
    }
    field("failures", std::to_string(r->failures));
    field("first_failure", json_string(r->first_failure));
    field("stopped", r->stopped ? "true" : "false");
    if (o.timeline_prefix) {
      std::string files = "[";
      for (std::size_t i = 0; i < timeline_lines.size(); ++i) {
        if (i != 0) files += ", ";
        files += json_string(timeline_lines[i]);
      }
      field("timeline", files + "]");
      field("timeline_error", json_string(timeline_error));
    }
    out << j << "}\n";
  } else {
    out << fmt::format(
        "trace          {} ({} format{}{})\n", t->name, to_string(t->format),
        t->skipped != 0 ? fmt::format(", {} allocate failures skipped", t->skipped) : "",
        o.limit ? fmt::format(", first {} of {} events", group_digits(t->events.size()), group_digits(trace_events))
                : "");
    if (o.baseline) {
      out << fmt::format("replay         {} directly, {}\n", baseline_text(*o.baseline), r->device);
    } else {
      out << fmt::format("replay         {}, {}, layout {}{}\n", mode, r->device, o.layout_text,
                         o.gpu_lag != 0 ? fmt::format(", the GPU {} events behind", o.gpu_lag) : "");
    }
    out << fmt::format(
        "events         {} ({} allocations, {} frees{})\n", group_digits(r->events), group_digits(r->allocations),
        group_digits(r->frees),
        r->actor ? fmt::format(", {} of them sent behind their create", group_digits(r->deferred_frees)) : "");
    out << fmt::format("time           {:.3f} s, {:.1f} ns/event, {:.2f} M events/s (read in {:.3f} s)\n", r->seconds,
                       r->ns_per_event, r->events_per_second / 1e6, read_seconds);
    out << fmt::format("peak live      {} ({} bytes){}\n", gib_text(r->peak_live_bytes),
                       group_digits(r->peak_live_bytes), r->actor ? ", in trace order" : "");
    if (r->actor) {
      out << fmt::format("peak in use    {} ({} bytes), as the actor saw it\n", gib_text(r->peak_in_use_bytes),
                         group_digits(r->peak_in_use_bytes));
    }
    out << fmt::format("peak reserved  {} ({} bytes){}\n", gib_text(r->peak_reserved_bytes),
                       group_digits(r->peak_reserved_bytes),
                       r->peak_reserved_source != "manager" ? fmt::format(", from {}", r->peak_reserved_source) : "");
    out << fmt::format("ratio          {:.3f}\n", r->ratio);
    out << fmt::format(
        "driver         {} allocations, {} frees{}\n", group_digits(r->driver_allocs), group_digits(r->driver_frees),
        r->maps + r->unmaps != 0 ? fmt::format("; {} maps, {} unmaps (the floor: {} of 256 MiB)", group_digits(r->maps),
                                               group_digits(r->unmaps), floor_maps_text(*r))
                                 : std::string());
    if (r->memory_limit != 0) {
      out << fmt::format(
          "memory limit   {} ({} bytes, {:.3f} times the peak of live bytes){}\n", gib_text(r->memory_limit),
          group_digits(r->memory_limit),
          r->peak_live_bytes != 0 ? static_cast<double>(r->memory_limit) / static_cast<double>(r->peak_live_bytes)
                                  : 0.0,
          r->peak_reserved_bytes <= r->memory_limit ? ", peak reserved within it" : ", PEAK RESERVED ABOVE IT");
    }
    if (r->driver_measured) {
      out << fmt::format("driver time    {} physical allocations created, {} maps of a kept one\n{}",
                         group_digits(r->physical_creates), group_digits(r->reused_allocations), driver_times_text(*r));
    }
    out << fmt::format("failures       {}{}\n", group_digits(r->failures),
                       r->failures != 0 ? fmt::format(" (first: {})", r->first_failure) : "");
    if (r->stopped) out << "stopped        at the first failure (--strict)\n";
    for (const auto& line : timeline_lines) out << fmt::format("timeline       {}\n", line);
  }
  if (!timeline_error.empty()) {
    err << "devrt-replay: " << timeline_error << "\n";
    return 1;
  }
  return r->stopped ? 1 : 0;
}

}  // namespace devrt::replay
