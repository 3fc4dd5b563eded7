// JSON string literals for the tools' --json outputs: quotes, backslashes and control characters
// escaped, and bytes that are not UTF-8 (a file name or a trace header may hold any byte) written
// as U+FFFD, so that the output is valid JSON whatever the input held.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <string>
#include <string_view>

namespace devrt::tools {

/// The length of the UTF-8 sequence at `s[i]` (1 to 4), or 0 when the bytes there are not one.
inline std::size_t utf8_sequence(std::string_view s, std::size_t i) noexcept {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  std::size_t n = 0;
  unsigned min_first_cont = 0x80;
  unsigned max_first_cont = 0xbf;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    if (c == 0xe0) min_first_cont = 0xa0;  // no overlong forms
    if (c == 0xed) max_first_cont = 0x9f;  // no surrogates
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    if (c == 0xf0) min_first_cont = 0x90;
    if (c == 0xf4) max_first_cont = 0x8f;  // nothing past U+10FFFF
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < min_first_cont || b(i + 1) > max_first_cont) return 0;
  for (std::size_t k = 2; k < n; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) return 0;
  }
  return n;
}

/// `s` as a JSON string literal, quotes included.
inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  out.reserve(s.size() + 2);
  for (std::size_t i = 0; i < s.size();) {
    const char c = s[i];
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: {
        const auto u = static_cast<unsigned char>(c);
        if (u < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(u));
        } else if (u < 0x80) {
          out += c;
        } else if (const std::size_t n = utf8_sequence(s, i); n != 0) {
          out.append(s.substr(i, n));
          i += n;
          continue;
        } else {
          out += "\\ufffd";
        }
      }
    }
    ++i;
  }
  return out + "\"";
}

}  // namespace devrt::tools
