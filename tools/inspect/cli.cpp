#include "inspect/cli.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <string_view>
#include <utility>
#include <variant>

#include "common/json_text.hpp"
#include "devrt/devices/host_storage.hpp"
#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/config.hpp"
#include "inspect/inspect.hpp"
#if defined(DEVRT_WITH_CUDA)
#include "devrt/devices/cuda_storage.hpp"
#endif

namespace devrt::inspect {

namespace {

error usage_error(std::string what) {
  error e = error::make(errc::malformed_config, "bad command line");
  e.text = std::move(what);
  return e;
}

error device_error(std::string what) {
  error e = error::make(errc::device_error, "the device cannot be used");
  e.text = std::move(what);
  return e;
}

using tools::json_string;

std::string json_number(const std::optional<std::uint64_t>& v) { return v ? std::to_string(*v) : "null"; }

std::string json_ranges(const size_set& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i != 0) out += ", ";
    out += fmt::format("[{}, {}]", s[i].lo, s[i].hi);
  }
  return out + "]";
}

/// `{"key": value, ...}` built field by field; values are JSON already.
class json_object {
 public:
  json_object& field(std::string_view key, const std::string& json_value) {
    if (!body_.empty()) body_ += ", ";
    body_ += json_string(key) + ": " + json_value;
    return *this;
  }
  [[nodiscard]] std::string str() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

std::string json_array(const std::vector<std::string>& items) {
  std::string out = "[";
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i != 0) out += ", ";
    out += items[i];
  }
  return out + "]";
}

/// Left-aligned columns separated by two spaces.
std::string table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(widths[c] - row[c].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

#if defined(DEVRT_WITH_CUDA)
/// Why no GPU can be used, in plain words, with the CUDA runtime's error name, and what to do.
std::string no_gpu_text() {
  const std::string reason = devices::cuda_unavailable_reason();
  std::string error_name;
  if (const std::size_t at = reason.find("returned "); at != std::string::npos) {
    error_name = reason.substr(at + 9, reason.find(' ', at + 9) - (at + 9));
  }
  std::string what;
  if (error_name == "cudaErrorInsufficientDriver") {
    what =
        "no CUDA GPU or driver was found (the NVIDIA driver is missing, or older than the CUDA runtime devrt was "
        "built with; cudaGetDeviceCount returned cudaErrorInsufficientDriver)";
  } else if (error_name == "cudaErrorNoDevice" || reason.empty() || reason == "no CUDA device is present") {
    what = "no CUDA GPU was found (CUDA_VISIBLE_DEVICES applies)";
  } else {
    what = "no CUDA GPU can be used (" + reason + ")";
  }
  return what + "; use --device host, or --device sim for a simulated device (--h200: an H200's properties)";
}
#endif

bool parse_index(std::string_view s, int& out) {
  if (s.empty()) return false;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && out >= 0;
}

// ---- Layouts ----

std::string device_line(const device_entry& d, bool bytes) {
  return fmt::format("{} ({}): pages up to {}, alignment {}, capacity {}, {}", d.name, d.kind,
                     size_text(d.props.max_page_size, bytes), size_text(d.props.alignment, bytes),
                     d.props.capacity != 0 ? size_text(d.props.capacity, bytes) : std::string("unknown"),
                     d.props.map_granularity != 0
                         ? fmt::format("maps memory in {}", size_text(d.props.map_granularity, bytes))
                         : std::string("no memory mapping"));
}

std::string device_json(const device_entry& d) {
  return json_object()
      .field("name", json_string(d.name))
      .field("kind", json_string(d.kind))
      .field("max_page_size", std::to_string(d.props.max_page_size))
      .field("alignment", std::to_string(d.props.alignment))
      .field("capacity", std::to_string(d.props.capacity))
      .str();
}

std::string ranges_text(const std::optional<size_set>& s, bool bytes) {
  if (!s) return "unknown";
  if (s->empty()) return "none";
  std::string out;
  for (const size_range& r : *s) {
    if (!out.empty()) out += ", ";
    out += range_text(r, bytes);
  }
  return out;
}

/// What looks wrong in a valid layout: pools that serve nothing, sizes no pool serves below the
/// largest one served, pools this tool cannot account for.
std::vector<std::string> layout_warnings(const layout_report& r, bool bytes) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < r.pools.size(); ++i) {
    const pool_description& d = r.described[i];
    if (!d.accepts) {
      out.push_back(fmt::format(
          "pool {} is of {}, which this tool does not describe: the sizes it accepts are not known, and the sizes "
          "shown for the pools after it leave it out",
          i, d.kind));
    } else if (r.serves[i] && r.serves[i]->empty()) {
      out.push_back(fmt::format(
          "pool {} serves no request: the pools before it accept every size it accepts; remove it or move it "
          "before them",
          i));
    }
  }
  for (const size_range& gap : r.unserved) {
    if (gap.hi == r.largest_request) continue;  // above every pool: reported on its own
    out.push_back(fmt::format(
        "requests of {} are served by no pool (buffer_too_big): add a pool for them, or raise the max slice/alloc "
        "of a pool",
        range_text(gap, bytes)));
  }
  return out;
}

/// The sizes above every pool, when some are left: the lower end of the last unserved range.
std::optional<std::uint64_t> refused_above(const layout_report& r) {
  if (!r.exact || r.unserved.empty() || r.unserved.back().hi != r.largest_request) return std::nullopt;
  const std::uint64_t lo = r.unserved.back().lo;
  return lo == 0 ? 0 : lo - 1;
}

std::string layout_text_block(const device_entry& d, const memory::memory_layout& layout, const layout_report& r,
                              const std::vector<std::string>& warnings, bool bytes) {
  std::string out;
  const bool is_preset = std::holds_alternative<memory::preset>(layout.value);
  out += fmt::format("device   {}\n", device_line(d, bytes));
  out += fmt::format("layout   {}{}: {} pool{}, in routing order (a request goes to the first pool that accepts it)\n",
                     memory::to_string(layout), is_preset ? " (preset)" : "", r.pools.size(),
                     r.pools.size() == 1 ? "" : "s");
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"pool", "kind", "page", "max slice/alloc", "cap", "period", "serves requests of"});
  for (std::size_t i = 0; i < r.pools.size(); ++i) {
    const pool_description& p = r.described[i];
    std::string cap = "-";
    if (p.cap) {
      cap = size_text(*p.cap, bytes);
      if (p.max_pages) cap += fmt::format(" ({} page{})", *p.max_pages, *p.max_pages == 1 ? "" : "s");
    }
    rows.push_back({std::to_string(i), p.kind, p.page_size ? size_text(*p.page_size, bytes) : "-",
                    p.max_size == UINT64_MAX ? "no limit" : size_text(p.max_size, bytes), cap,
                    p.dealloc_period ? std::to_string(*p.dealloc_period) : "-", ranges_text(r.serves[i], bytes)});
  }
  out += '\n';
  out += table(rows);
  out += '\n';
  if (!r.exact) {
    out += "above    not known: a pool of a kind this tool does not describe may take larger requests\n";
  } else if (const auto above = refused_above(r)) {
    out += fmt::format("above    requests above {} are refused: no pool accepts them (buffer_too_big)\n",
                       size_text(*above, bytes));
  } else {
    out += fmt::format("above    every request up to {} is served\n", size_text(r.largest_request, bytes));
  }
  std::vector<std::string> notes{"(a, b] means request sizes above a, up to and including b"};
  for (const pool_description& p : r.described) {
    if (!p.note.empty() && std::find(notes.begin(), notes.end(), p.note) == notes.end()) notes.push_back(p.note);
  }
  notes.emplace_back(
      "persistent requests (persistent mode, persistent scopes, capture windows) go to the persistent pool, which "
      "takes any size");
  if (d.props.map_granularity != 0) {
    notes.emplace_back(
        "tagged requests (devrt_set_tag, tag_scope) go to an arena of the tag's own, with the first arena's settings "
        "of the layout (else the arena preset's), so that the tag can sleep and wake (devrt_sleep, devrt_wake)");
  } else {
    notes.emplace_back("tags only label requests here: the device cannot map memory, so no tag can sleep");
  }
  for (std::size_t i = 0; i < notes.size(); ++i)
    out += fmt::format("{}{}\n", i == 0 ? "notes    " : "         ", notes[i]);
  for (const auto& w : warnings) out += fmt::format("warning  {}\n", w);
  return out;
}

std::string layout_json(const device_entry& d, const memory::memory_layout& layout, const layout_report& r,
                        const std::vector<std::string>& warnings) {
  std::vector<std::string> pools;
  for (std::size_t i = 0; i < r.pools.size(); ++i) {
    const pool_description& p = r.described[i];
    pools.push_back(json_object()
                        .field("index", std::to_string(i))
                        .field("kind", json_string(p.kind))
                        .field("kind_id", std::to_string(static_cast<unsigned>(r.pools[i].kind)))
                        .field("page_size", json_number(p.page_size))
                        .field("max_size", std::to_string(p.max_size))
                        .field("cap", json_number(p.cap))
                        .field("max_pages", json_number(p.max_pages))
                        .field("dealloc_period", json_number(p.dealloc_period))
                        .field("serves", r.serves[i] ? json_ranges(*r.serves[i]) : "null")
                        .str());
  }
  std::vector<std::string> warning_items;
  warning_items.reserve(warnings.size());
  for (const auto& w : warnings) warning_items.push_back(json_string(w));
  const auto above = refused_above(r);
  return json_object()
      .field("device", device_json(d))
      .field("layout", json_string(memory::to_string(layout)))
      .field("preset", std::holds_alternative<memory::preset>(layout.value) ? "true" : "false")
      .field("valid", "true")
      .field("pools", json_array(pools))
      .field("unserved", json_ranges(r.unserved))
      .field("refused_above", above ? std::to_string(*above) : "null")
      .field("largest_request", std::to_string(r.largest_request))
      .field("exact", r.exact ? "true" : "false")
      .field("warnings", json_array(warning_items))
      .str();
}

/// An invalid layout: the error, the pool it is about, and what to change.
struct diagnosis {
  error e;
  std::optional<std::size_t> pool;
  std::string pool_text;
  std::string hint;
};

diagnosis diagnose(error e, const std::optional<memory::memory_layout>& layout,
                   const memory::device_properties& props) {
  diagnosis d;
  d.pool = error_pool_index(e);
  std::optional<memory::pool_config> pool;
  if (d.pool && layout) {
    if (const auto* list = std::get_if<std::vector<memory::pool_config>>(&layout->value);
        list && *d.pool < list->size()) {
      pool = (*list)[*d.pool];
      d.pool_text = memory::to_string(memory::memory_layout(std::vector<memory::pool_config>{*pool}));
    }
  }
  d.hint = fix_hint(e, props, pool);
  d.e = std::move(e);
  return d;
}

std::string diagnosis_text(const diagnosis& d, const std::string& layout_text, const device_entry* device) {
  std::string out = fmt::format("layout '{}' is invalid{}\n", layout_text,
                                device != nullptr ? fmt::format(" on {}", device->name) : std::string());
  out += fmt::format("error    {}\n", d.e.message());
  out += fmt::format("code     {}\n", to_string(d.e.code));
  if (d.pool) {
    out += fmt::format("pool     {}{}\n", *d.pool, d.pool_text.empty() ? std::string() : ": " + d.pool_text);
  }
  if (!d.hint.empty()) out += fmt::format("fix      {}\n", d.hint);
  return out;
}

std::string error_json(const error& e, const std::string& hint) {
  return json_object()
      .field("code", json_string(to_string(e.code)))
      .field("code_id", std::to_string(static_cast<int>(e.code)))
      .field("message", json_string(e.message()))
      .field("size", std::to_string(e.size))
      .field("limit", std::to_string(e.limit))
      .field("detail", json_string(e.detail))
      .field("text", json_string(e.text))
      .field("fix", json_string(hint))
      .str();
}

std::string diagnosis_json(const diagnosis& d, const std::string& layout_text, const device_entry* device) {
  json_object o;
  if (device != nullptr) o.field("device", device_json(*device));
  o.field("layout", json_string(layout_text)).field("valid", "false");
  o.field("error", error_json(d.e, d.hint));
  o.field("pool", d.pool ? std::to_string(*d.pool) : "null");
  o.field("pool_layout", d.pool_text.empty() ? "null" : json_string(d.pool_text));
  return o.str();
}

/// The layout on every device, or why it is invalid. `check` adds a verdict line per device.
int run_layout(const cli_options& o, std::ostream& out, std::ostream& err) {
  const std::string text = o.check ? *o.check : o.layout.value_or(memory::to_string(memory::memory_layout()));
  auto parsed = memory::parse_layout(text);
  if (!parsed) {
    const diagnosis d = diagnose(std::move(parsed).err(), std::nullopt, memory::device_properties{});
    out << (o.json ? diagnosis_json(d, text, nullptr) + "\n" : diagnosis_text(d, text, nullptr));
    return 1;
  }
  auto devices = devices_of(o);
  if (!devices) {
    err << "devrt-inspect: " << devices.err().text << "\n";
    return 1;
  }
  int rc = 0;
  std::vector<std::string> blocks;
  for (const device_entry& dev : *devices) {
    auto pools = memory::resolve_layout(*parsed, dev.props);
    if (!pools) {
      const diagnosis d = diagnose(std::move(pools).err(), *parsed, dev.props);
      blocks.push_back(o.json ? diagnosis_json(d, text, &dev) : diagnosis_text(d, text, &dev));
      rc = 1;
      continue;
    }
    const layout_report r = report_layout(*pools, dev.props);
    const std::vector<std::string> warnings = layout_warnings(r, o.bytes);
    if (o.json) {
      blocks.push_back(layout_json(dev, *parsed, r, warnings));
      continue;
    }
    std::string block;
    if (o.check) {
      block += fmt::format(
          "layout '{}' is valid on {}: {} pool{}{}\n\n", text, dev.name, pools->size(), pools->size() == 1 ? "" : "s",
          warnings.empty() ? "" : fmt::format(", {} warning{}", warnings.size(), warnings.size() == 1 ? "" : "s"));
    }
    blocks.push_back(block + layout_text_block(dev, *parsed, r, warnings, o.bytes));
  }
  if (o.json) {
    out << (blocks.size() == 1 ? blocks.front() : json_object().field("devices", json_array(blocks)).str()) << "\n";
  } else {
    for (std::size_t i = 0; i < blocks.size(); ++i) out << (i != 0 ? "\n" : "") << blocks[i];
  }
  return rc;
}

// ---- Config files ----

struct setting {
  const char* key;
  std::string value;
  std::string source;
};

// A config file's device list as the file writes it: "all" when none is given.
std::string devices_text(const std::optional<std::vector<int>>& d) {
  if (!d) return "all";
  if (d->empty()) return "none";
  return fmt::format("{}", fmt::join(*d, ","));
}

// A config file's memory limit: bytes, a share of each device, or "none".
std::string limit_text(const std::optional<runtime::memory_limit_spec>& m) {
  if (!m || (m->share <= 0 && m->bytes == 0)) return "none";
  if (m->share > 0) return fmt::format("{:g}%", m->share * 100);
  return memory::format_bytes(m->bytes);
}

int run_config(const cli_options& o, std::ostream& out, const runtime::env_lookup& env) {
  const std::string& path = *o.config;
  const bool readable = std::ifstream(path).good();
  // `file_ok`: the file itself is valid and a DEVRT_* variable is not.
  const auto fail = [&](const error& e, bool file_ok = false) {
    const std::string hint = file_ok ? std::string("give the DEVRT_* variable named above a valid value, or unset it")
                             : readable ? fix_hint(e, memory::device_properties{})
                                        : std::string("check the path, and that the file can be read by this user");
    if (o.json) {
      json_object j;
      j.field("file", json_string(path)).field("valid", file_ok ? "true" : "false");
      if (file_ok) j.field("environment_valid", "false");
      out << j.field("error", error_json(e, hint)).str() << "\n";
      return 1;
    }
    out << fmt::format("config file '{}' is {}\nerror    {}\n", path,
                       file_ok ? "valid, but the environment is not" : "invalid", e.message());
    if (!hint.empty()) out << fmt::format("fix      {}\n", hint);
    return 1;
  };
  // Which settings the file sets: applied over the defaults and over other values, a setting the
  // file sets comes out the same both times.
  runtime::runtime_config from_defaults;
  if (auto r = runtime::apply_config_file(from_defaults, path); !r) return fail(r.err());
  runtime::runtime_config other;
  other.persistent_memory = other.persistent_memory == memory::persistent_policy::enforced
                                ? memory::persistent_policy::enabled
                                : memory::persistent_policy::enforced;
  other.log = other.log == runtime::log_level::full ? runtime::log_level::basic : runtime::log_level::full;
  other.cuda_devices = std::vector<int>{-1};  // no file sets this: it is not a device index
  other.serve_in_place = !other.serve_in_place;
  other.memory_limit = runtime::memory_limit_spec{1, 0};
  if (auto r = runtime::apply_config_file(other, path); !r) return fail(r.err());
  // The file, then the environment: what a runtime started with this file would use.
  auto resolved = runtime::load_config(path, env);
  if (!resolved) return fail(resolved.err(), true);  // the file applied cleanly: a variable is bad

  const auto source = [&](bool from_file, const char* variable) -> std::string {
    if (env(variable)) return fmt::format("environment {}{}", variable, from_file ? ", over the file" : "");
    return from_file ? "file" : "default";
  };
  const std::vector<setting> settings{
      {"persistent_memory", memory::to_string(resolved->persistent_memory),
       source(from_defaults.persistent_memory == other.persistent_memory, "DEVRT_PERSISTENT_MEMORY")},
      {"log_level", runtime::to_string(resolved->log), source(from_defaults.log == other.log, "DEVRT_LOG_LEVEL")},
      {"cuda_devices", devices_text(resolved->cuda_devices),
       source(from_defaults.cuda_devices == other.cuda_devices, "DEVRT_CUDA_DEVICES")},
      {"serve_in_place", resolved->serve_in_place ? "true" : "false",
       source(from_defaults.serve_in_place == other.serve_in_place, "DEVRT_SERVE_IN_PLACE")},
      {"memory_limit", limit_text(resolved->memory_limit),
       source(limit_text(from_defaults.memory_limit) == limit_text(other.memory_limit), "DEVRT_MEMORY_LIMIT")},
  };
  if (o.json) {
    json_object s;
    for (const setting& x : settings) {
      s.field(x.key, json_object().field("value", json_string(x.value)).field("source", json_string(x.source)).str());
    }
    out << json_object().field("file", json_string(path)).field("valid", "true").field("settings", s.str()).str()
        << "\n";
    return 0;
  }
  out << fmt::format("config file '{}' is valid; a runtime started with it uses:\n\n", path);
  std::vector<std::vector<std::string>> rows{{"setting", "value", "from"}};
  for (const setting& x : settings) rows.push_back({x.key, x.value, x.source});
  out << table(rows);
  return 0;
}

}  // namespace

std::string usage() {
  const devices::host_options host{};
  const devices::sim_options sim{};
  return fmt::format(R"(usage: devrt-inspect [--device D] [--layout L] [--json] [--bytes]
       devrt-inspect [--device D] --check L [--json]
       devrt-inspect --config FILE [--json]
       devrt-inspect snapshot --trace FILE [...]   (see devrt-inspect snapshot --help)

Shows how devrt lays out the memory of a device: the pools of a layout in routing order, with
their sizes aligned to the device and the request sizes each one serves.

  --device D        host (default), sim, cuda (every GPU) or cuda:N
  --h200            sim: the properties of an NVIDIA H200 (implies --device sim)
  --page-size S     sim: largest page the layouts may ask for (default {})
  --alignment S     sim: alignment of every slice, a power of two (default {})
  --capacity S      sim: device memory, 0 for unknown (default 0)
  --layout L        a preset (sub-slices, exclusive-pages) or pools in routing order, such as
                    "sliced:page=64MiB,slice=8MiB,cap=1GiB,period=1000;exclusive:max=1MiB"
                    (default: the default preset)
  --check L         whether layout L is valid on the device; if not, what is wrong and what to
                    change
  --config FILE     validate a devrt config file (persistent_memory, log_level, cuda_devices,
                    serve_in_place, memory_limit) and show the settings a runtime started with
                    it uses, DEVRT_* variables included
  snapshot ...      replay an allocation trace and write its memory snapshot (PyTorch's format)
  --json            one JSON object on stdout
  --bytes           sizes as numbers of bytes
  --help            this text

The host device is the one a runtime (and the C interface) creates by default: {}-byte
alignment, pages up to {}, memory mapped in {} (devices::host_options defaults).

Sizes are bytes or binary units: 4096, 64MiB, 1.5GiB.
Exit codes: 0 done (the layout or file is valid), 1 the layout or file is invalid or the device
cannot be used, 2 bad usage.
)",
                     layout_size(sim.props.max_page_size), layout_size(sim.props.alignment), host.alignment,
                     size_text(host.max_page_size), size_text(host.map_granularity));
}

result<cli_options> parse_args(const std::vector<std::string>& args) {
  cli_options o;
  bool sim_property = false;
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
    const auto size = [&](std::optional<std::uint64_t>& target) -> result<void> {
      auto v = value();
      if (!v) return std::move(v).err();
      auto s = memory::parse_size(*v);
      if (!s) return usage_error(fmt::format("bad value for {}: {}", name, s.err().message()));
      target = *s;
      sim_property = true;
      return {};
    };
    result<void> ok;
    if (name == "--help" || name == "-h") {
      ok = flag(o.help);
    } else if (name == "--device") {
      auto v = value();
      if (!v) return std::move(v).err();
      const std::string_view d = *v;
      int index = 0;
      if (d == "host") {
        o.device = device_choice::host;
      } else if (d == "sim") {
        o.device = device_choice::sim;
      } else if (d == "cuda") {
        o.device = device_choice::cuda;
        o.cuda_index.reset();
      } else if (d.starts_with("cuda:") && parse_index(d.substr(5), index)) {
        o.device = device_choice::cuda;
        o.cuda_index = index;
      } else {
        return usage_error(fmt::format("bad value for --device: '{}' (expected host, sim, cuda or cuda:N)", d));
      }
      o.device_given = true;
    } else if (name == "--h200") {
      ok = flag(o.h200);
      sim_property = true;
    } else if (name == "--page-size") {
      ok = size(o.page_size);
      if (ok && *o.page_size == 0) return usage_error("bad value for --page-size: the page size must be above zero");
    } else if (name == "--alignment") {
      ok = size(o.alignment);
      if (ok && (*o.alignment == 0 || (*o.alignment & (*o.alignment - 1)) != 0)) {
        return usage_error(fmt::format("bad value for --alignment: {} is not a power of two", *o.alignment));
      }
    } else if (name == "--capacity") {
      ok = size(o.capacity);
    } else if (name == "--layout" || name == "--check" || name == "--config") {
      auto v = value();
      if (!v) return std::move(v).err();
      (name == "--layout" ? o.layout : name == "--check" ? o.check : o.config) = *v;
    } else if (name == "--json") {
      ok = flag(o.json);
    } else if (name == "--bytes") {
      ok = flag(o.bytes);
    } else if (name.starts_with("-")) {
      return usage_error(fmt::format("unknown option '{}'", args[i]));
    } else {
      return usage_error(fmt::format("unexpected argument '{}' (layouts go after --layout or --check)", name));
    }
    if (!ok) return std::move(ok).err();
  }
  if (o.help) return o;
  if (sim_property) {
    if (o.device_given && o.device != device_choice::sim) {
      return usage_error("--h200, --page-size, --alignment and --capacity describe a simulated device (--device sim)");
    }
    o.device = device_choice::sim;
  }
  if (o.layout && o.check) return usage_error("give the layout once: --layout to show it or --check to validate it");
  if (o.config) {
    if (o.layout || o.check) return usage_error("--config validates a config file: it takes no layout");
    if (o.device_given || sim_property) return usage_error("--config validates a config file: it takes no device");
    if (o.bytes) return usage_error("--bytes applies to layouts, not to --config");
  }
  return o;
}

result<std::vector<device_entry>> devices_of(const cli_options& o) {
  switch (o.device) {
    case device_choice::host: {
      // The host device as a runtime creates it by default.
      const devices::host_storage host{devices::host_options{}};
      return std::vector<device_entry>{{host.name(), "host", host.properties()}};
    }
    case device_choice::sim: {
      devices::sim_options s = o.h200 ? devices::sim_options::h200() : devices::sim_options{};
      if (o.page_size) s.props.max_page_size = *o.page_size;
      if (o.alignment) s.props.alignment = *o.alignment;
      if (o.capacity) s.props.capacity = *o.capacity;
      return std::vector<device_entry>{{s.name, "sim", s.props}};
    }
    case device_choice::cuda: {
#if defined(DEVRT_WITH_CUDA)
      const int count = devices::cuda_device_count();
      if (count == 0) {
        return device_error(fmt::format("--device {}: {}",
                                        o.cuda_index ? fmt::format("cuda:{}", *o.cuda_index) : "cuda", no_gpu_text()));
      }
      if (o.cuda_index && *o.cuda_index >= count) {
        return device_error(fmt::format("--device cuda:{}: there is no such GPU ({} found: cuda:0 to cuda:{})",
                                        *o.cuda_index, count, count - 1));
      }
      std::vector<device_entry> out;
      const int first = o.cuda_index.value_or(0);
      const int last = o.cuda_index ? first + 1 : count;
      for (int i = first; i < last; ++i) {
        try {
          const devices::cuda_storage gpu(i);
          out.push_back({gpu.name(), "cuda", gpu.properties()});
        } catch (const exception& e) {
          return device_error(fmt::format("--device cuda:{}: {}", i, e.what()));
        }
      }
      return out;
#else
      return device_error(
          "--device cuda: this devrt-inspect was built without CUDA (no CUDA toolkit was found when devrt was built); "
          "use --device host, or --device sim for a simulated device (--h200: an H200's properties)");
#endif
    }
  }
  return device_error("unknown device");
}

int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
            const runtime::env_lookup& env) {
  if (!args.empty() && args[0] == "snapshot") return run_snapshot({args.begin() + 1, args.end()}, out, err);
  auto parsed = parse_args(args);
  if (!parsed) {
    err << "devrt-inspect: " << parsed.err().text << "\n(see devrt-inspect --help)\n";
    return 2;
  }
  const cli_options& o = *parsed;
  if (o.help) {
    out << usage();
    return 0;
  }
  if (o.config) return run_config(o, out, env);
  return run_layout(o, out, err);
}

}  // namespace devrt::inspect
