#include "devrt/runtime/config.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace devrt::runtime {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())) != 0) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) s.remove_suffix(1);
  return s;
}

std::string unquote(std::string_view v) {
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front()) {
    v = v.substr(1, v.size() - 2);
  }
  return std::string(v);
}

error config_error(std::string where, const char* what) {
  error e = error::make(errc::malformed_config, what);
  e.text = std::move(where);
  return e;
}

}  // namespace

result<log_level> parse_log_level(std::string_view text) {
  std::string v(trim(text));
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "disabled" || v == "off") return log_level::disabled;
  if (v == "basic") return log_level::basic;
  if (v == "full") return log_level::full;
  return config_error(std::string(text), "the log level is one of disabled, basic, full");
}

result<std::vector<int>> parse_device_list(std::string_view text) {
  const std::string_view all = trim(text);
  if (all == "none") return std::vector<int>{};
  auto bad = [&](const char* why) { return config_error(std::string(text), why); };
  if (all.empty()) return bad("a list of CUDA device indices such as 0,2 (or none)");
  std::vector<int> out;
  std::string_view rest = all;
  for (;;) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    if (item.empty() || item.size() > 6 ||
        !std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return bad("a CUDA device index is a non-negative integer; write indices separated by commas, such as 0,2");
    }
    const int index = std::stoi(std::string(item));
    if (std::find(out.begin(), out.end(), index) != out.end()) return bad("a CUDA device is listed twice");
    out.push_back(index);
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  return out;
}

result<bool> parse_switch(std::string_view text) {
  std::string v(trim(text));
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  return config_error(std::string(text), "a switch is one of 1, true, on, yes, 0, false, off, no");
}

const char* to_string(log_level l) noexcept {
  switch (l) {
    case log_level::disabled: return "disabled";
    case log_level::basic: return "basic";
    case log_level::full: return "full";
  }
  return "disabled";
}

result<void> apply_config_text(runtime_config& cfg, std::string_view text, std::string_view origin) {
  std::size_t line_no = 0;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    ++line_no;
    if (const std::size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    line = trim(line);
    if (line.empty()) continue;
    const std::string where = fmt::format("{}:{}: {}", origin, line_no, line);
    const std::size_t eq = line.find('=');
    if (eq == std::string_view::npos) return config_error(where, "expected `key = value`");
    const std::string_view key = trim(line.substr(0, eq));
    const std::string value = unquote(trim(line.substr(eq + 1)));
    if (key == "persistent_memory") {
      auto p = memory::parse_persistent_policy(value);
      if (!p) return config_error(where, "persistent_memory is one of enabled, size-match, disabled, enforced");
      cfg.persistent_memory = *p;
    } else if (key == "log_level") {
      auto l = parse_log_level(value);
      if (!l) return config_error(where, "log_level is one of disabled, basic, full");
      cfg.log = *l;
    } else if (key == "cuda_devices") {
      auto d = parse_device_list(value);
      if (!d) return config_error(where, "cuda_devices is a list of CUDA device indices such as 0,2, or none");
      cfg.cuda_devices = std::move(*d);
    } else if (key == "serve_in_place") {
      auto b = parse_switch(value);
      if (!b) return config_error(where, "serve_in_place is true or false (also 1, on, yes, 0, off, no)");
      cfg.serve_in_place = *b;
    } else if (key == "memory_limit") {
      auto m = parse_memory_limit(value);
      if (!m) return config_error(where, "memory_limit is bytes (40GiB) or a share of the device (0.8, 80%), or none");
      cfg.memory_limit = *m;
    } else if (key == "pools" || key == "layout") {
      return config_error(where,
                          "pool layouts are not read from config files; set them with configure() or a "
                          "tool's --layout option");
    } else {
      return config_error(
          where, "unknown setting (known: persistent_memory, log_level, cuda_devices, serve_in_place, memory_limit)");
    }
  }
  return {};
}

result<memory_limit_spec> parse_memory_limit(std::string_view text) {
  const std::string t(trim(text));
  const auto bad = [&] {
    error e = error::make(errc::malformed_config, "bad memory limit");
    e.text = t;
    return e;
  };
  if (t.empty()) return bad();
  if (t == "none" || t == "0") return memory_limit_spec{};
  if (t == "1") return memory_limit_spec{0, 1.0};  // the whole device, not one byte
  const bool percent = t.back() == '%';
  const bool fraction = percent || t.find('.') != std::string::npos;
  if (fraction && (percent || t.find_first_not_of("0123456789.") == std::string::npos)) {
    const std::string number = percent ? t.substr(0, t.size() - 1) : t;
    if (number.empty() || number.find_first_not_of("0123456789.") != std::string::npos) return bad();
    char* end = nullptr;
    double v = std::strtod(number.c_str(), &end);
    if (end == number.c_str() || *end != '\0') return bad();
    if (percent) v /= 100.0;
    if (!(v > 0.0) || v > 1.0) return bad();
    memory_limit_spec m;
    m.share = v;
    return m;
  }
  auto bytes = memory::parse_size(t);
  if (!bytes) return bad();
  return memory_limit_spec{*bytes, 0};
}

result<void> apply_config_file(runtime_config& cfg, const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return config_error(path, "the config file is a directory");
  std::ifstream in(path);
  if (!in) return config_error(path, "the config file cannot be read");
  std::stringstream buf;
  buf << in.rdbuf();
  return apply_config_text(cfg, buf.str(), path);
}

std::optional<std::string> process_env(const char* name) {
  const char* v = std::getenv(name);  // NOLINT(concurrency-mt-unsafe): read once at start-up
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

result<runtime_config> load_config(const std::optional<std::string>& file, const env_lookup& env) {
  runtime_config cfg;
  std::optional<std::string> path = file;
  if (!path) path = env("DEVRT_CONFIG");
  if (path && !path->empty()) {
    if (auto r = apply_config_file(cfg, *path); !r) return std::move(r).err();
  }
  if (auto v = env("DEVRT_PERSISTENT_MEMORY")) {
    auto p = memory::parse_persistent_policy(*v);
    if (!p) {
      return config_error(fmt::format("DEVRT_PERSISTENT_MEMORY={}", *v),
                          "the persistent memory policy is one of enabled, size-match, disabled, enforced");
    }
    cfg.persistent_memory = *p;
  }
  if (auto v = env("DEVRT_LOG_LEVEL")) {
    auto l = parse_log_level(*v);
    if (!l) return config_error(fmt::format("DEVRT_LOG_LEVEL={}", *v), "the log level is one of disabled, basic, full");
    cfg.log = *l;
  }
  if (auto v = env("DEVRT_CUDA_DEVICES")) {
    auto d = parse_device_list(*v);
    if (!d) {
      return config_error(fmt::format("DEVRT_CUDA_DEVICES={}", *v),
                          "a list of CUDA device indices such as 0,2 (as the CUDA runtime numbers them, after "
                          "CUDA_VISIBLE_DEVICES), or none");
    }
    cfg.cuda_devices = std::move(*d);
  }
  if (auto v = env("DEVRT_MEMORY_LIMIT")) {
    auto m = parse_memory_limit(*v);
    if (!m) {
      return config_error(fmt::format("DEVRT_MEMORY_LIMIT={}", *v),
                          "the memory limit is bytes (40GiB, 1073741824) or a share of each device (0.8, 80%), or "
                          "none");
    }
    cfg.memory_limit = *m;
  }
  if (auto v = env("DEVRT_SERVE_IN_PLACE")) {
    auto b = parse_switch(*v);
    if (!b) {
      return config_error(fmt::format("DEVRT_SERVE_IN_PLACE={}", *v),
                          "serving requests in place is switched by 1, true, on, yes or 0, false, off, no");
    }
    cfg.serve_in_place = *b;
  }
  return cfg;
}

}  // namespace devrt::runtime
