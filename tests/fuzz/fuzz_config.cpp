// libFuzzer target: the runtime's configuration parser (config file text and DEVRT_* environment
// values).
//
// The first byte picks what the rest is: a config file's text, or NUL-separated values of
// DEVRT_PERSISTENT_MEMORY and DEVRT_LOG_LEVEL given to load_config.
//
// Checks, aborting on a violation:
// - errors are malformed_config; a file error names the origin and a line number that exists,
//   quoting that line; an environment error names the variable and its value;
// - a text that applies cleanly gives the same configuration when applied again, and the canonical
//   text written from that configuration applies to the same configuration;
// - parse_log_level and parse_persistent_policy round-trip through to_string.

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "devrt/runtime/config.hpp"

namespace {

using devrt::errc;
namespace rt = devrt::runtime;
namespace mem = devrt::memory;

[[noreturn]] void fail(const std::string& input, const std::string& what) {
  std::fprintf(stderr, "fuzz_config: %s\ninput (%zu bytes): '%s'\n", what.c_str(), input.size(), input.c_str());
  std::abort();
}

bool same(const rt::runtime_config& a, const rt::runtime_config& b) {
  return a.persistent_memory == b.persistent_memory && a.log == b.log;
}

std::string lines_of(std::string_view text, std::size_t n) {
  // The n-th line (1-based), without its newline.
  std::size_t line = 1;
  std::size_t start = 0;
  while (line < n) {
    const std::size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) return {};
    start = nl + 1;
    ++line;
  }
  const std::size_t nl = text.find('\n', start);
  return std::string(text.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start));
}

std::size_t count_lines(std::string_view text) {
  if (text.empty()) return 0;
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n')) + (text.back() == '\n' ? 0 : 1);
}

void check_file_text(const std::string& input, std::string_view text) {
  rt::runtime_config cfg;
  auto r = rt::apply_config_text(cfg, text, "fuzz.conf");
  if (!r) {
    const auto& e = r.err();
    if (e.code != errc::malformed_config) fail(input, "error code " + std::string(to_string(e.code)));
    if (e.message().empty()) fail(input, "an error without a message");
    // "fuzz.conf:<line>: <the line without its comment, trimmed>"
    if (e.text.rfind("fuzz.conf:", 0) != 0) fail(input, "the error does not name the origin: " + e.text);
    const std::size_t colon = e.text.find(':', 10);
    if (colon == std::string::npos) fail(input, "the error does not name a line: " + e.text);
    const std::string number = e.text.substr(10, colon - 10);
    if (number.empty() || !std::all_of(number.begin(), number.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      fail(input, "the line number is not a number: " + e.text);
    }
    const std::size_t line = std::stoul(number);
    if (line == 0 || line > count_lines(text)) fail(input, "the error names line " + number + ", which does not exist");
    const std::string quoted = e.text.size() > colon + 2 ? e.text.substr(colon + 2) : std::string();
    if (lines_of(text, line).find(quoted) == std::string::npos) {
      fail(input, "the error quotes '" + quoted + "', which is not on line " + number);
    }
    return;
  }
  rt::runtime_config again;
  if (!rt::apply_config_text(again, text, "fuzz.conf") || !same(cfg, again)) fail(input, "applying twice differs");
  const std::string canonical = std::string("persistent_memory = ") + mem::to_string(cfg.persistent_memory) +
                                "\nlog_level = " + rt::to_string(cfg.log) + "\n";
  rt::runtime_config from_canonical;
  auto c = rt::apply_config_text(from_canonical, canonical, "canonical.conf");
  if (!c) fail(input, "the canonical text is refused: " + c.err().message());
  if (!same(cfg, from_canonical)) fail(input, "the canonical text gives another configuration");
}

void check_environment(const std::string& input, std::string_view text) {
  std::map<std::string, std::string> vars;
  const std::size_t nul = text.find('\0');
  vars["DEVRT_PERSISTENT_MEMORY"] = std::string(text.substr(0, nul));
  if (nul != std::string_view::npos) vars["DEVRT_LOG_LEVEL"] = std::string(text.substr(nul + 1));
  auto r = rt::load_config(std::nullopt, [&vars](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  });
  auto policy = mem::parse_persistent_policy(vars["DEVRT_PERSISTENT_MEMORY"]);
  const bool has_log = vars.count("DEVRT_LOG_LEVEL") != 0;
  auto level = has_log ? rt::parse_log_level(vars["DEVRT_LOG_LEVEL"]) : devrt::result<rt::log_level>(rt::log_level{});
  if (!r) {
    if (r.code() != errc::malformed_config) fail(input, "error code " + std::string(to_string(r.code())));
    const std::string& where = r.err().text;
    if (!policy) {
      if (where != "DEVRT_PERSISTENT_MEMORY=" + vars["DEVRT_PERSISTENT_MEMORY"]) {
        fail(input, "the policy error does not name the variable and value: " + where);
      }
    } else if (has_log && !level) {
      if (where != "DEVRT_LOG_LEVEL=" + vars["DEVRT_LOG_LEVEL"]) {
        fail(input, "the log level error does not name the variable and value: " + where);
      }
    } else {
      fail(input, "load_config refused valid values: " + r.err().message());
    }
    return;
  }
  if (!policy || (has_log && !level)) fail(input, "load_config accepted a value its parser refuses");
  if (r->persistent_memory != *policy) fail(input, "the policy from the environment was not applied");
  if (has_log && r->log != *level) fail(input, "the log level from the environment was not applied");
}

void check_names(const std::string& input, std::string_view text) {
  if (auto l = rt::parse_log_level(text)) {
    auto back = rt::parse_log_level(rt::to_string(*l));
    if (!back || *back != *l) fail(input, "log level round trip");
  } else if (l.code() != errc::malformed_config) {
    fail(input, "parse_log_level error code");
  }
  if (auto p = mem::parse_persistent_policy(text)) {
    auto back = mem::parse_persistent_policy(mem::to_string(*p));
    if (!back || *back != *p) fail(input, "persistent policy round trip");
  } else if (p.code() != errc::malformed_config) {
    fail(input, "parse_persistent_policy error code");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::string input(reinterpret_cast<const char*>(data), size);  // NOLINT
  const std::string_view rest = std::string_view(input).substr(1);
  switch (static_cast<unsigned char>(input[0]) % 3) {
    case 0: check_file_text(input, rest); break;
    case 1: check_environment(input, rest); break;
    default: check_names(input, rest); break;
  }
  return 0;
}
