// libFuzzer target: parse_size on arbitrary text.
//
// Checks, aborting on a violation:
// - errors are malformed_size, echo the whole input and quote it in the message;
// - a parsed value parses back to itself from its decimal form, and format_bytes takes it;
// - the value is exactly the one of a reference parser written here (same grammar, integer
//   arithmetic): fractions round down to the exact floor ("0.0009765625KiB" is 1 byte), and a
//   size above 2^64 - 1 is refused.

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "devrt/memory/config.hpp"

namespace {

using devrt::errc;
using u128 = unsigned __int128;

[[noreturn]] void fail(const std::string& input, const std::string& what) {
  std::fprintf(stderr, "fuzz_size: %s\ninput: '%s'\n", what.c_str(), input.c_str());
  std::abort();
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())) != 0) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back())) != 0) s.remove_suffix(1);
  return s;
}

std::string u128_text(u128 v) {
  if (v == 0) return "0";
  std::string out;
  while (v != 0) {
    out.insert(out.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  }
  return out;
}

/// floor(0.d1d2...dk * 2^shift), exactly, by doubling the decimal fraction `shift` times.
std::uint64_t fraction_times_power_of_two(std::vector<int> digits, unsigned shift) {
  std::uint64_t out = 0;
  for (unsigned s = 0; s < shift; ++s) {
    int carry = 0;
    for (std::size_t i = digits.size(); i-- > 0;) {
      const int v = digits[i] * 2 + carry;
      digits[i] = v % 10;
      carry = v / 10;
    }
    out = out * 2 + static_cast<std::uint64_t>(carry);
  }
  return out;
}

/// The exact value of the text under parse_size's grammar, or nullopt when the grammar refuses it.
/// Values above 2^64 - 1 are returned as they are (the caller compares with the limit).
std::optional<u128> reference(std::string_view text) {
  text = trim(text);
  std::size_t i = 0;
  u128 integer = 0;
  bool digits = false;
  bool too_large = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '_') continue;
    if (c < '0' || c > '9') break;
    digits = true;
    integer = integer * 10 + static_cast<unsigned>(c - '0');
    if (integer > UINT64_MAX) too_large = true;
    if (too_large) integer = u128{UINT64_MAX} + 1;  // stays above the limit without overflowing
  }
  if (!digits) return std::nullopt;
  std::vector<int> fraction;
  bool has_fraction = false;
  if (i < text.size() && text[i] == '.') {
    has_fraction = true;
    ++i;
    for (; i < text.size() && ((text[i] >= '0' && text[i] <= '9') || text[i] == '_'); ++i) {
      if (text[i] != '_') fraction.push_back(text[i] - '0');
    }
    if (fraction.empty()) return std::nullopt;
  }
  std::string unit(trim(text.substr(i)));
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  unsigned shift = 0;
  if (unit.empty() || unit == "b") {
    shift = 0;
  } else if (unit == "k" || unit == "kb" || unit == "kib") {
    shift = 10;
  } else if (unit == "m" || unit == "mb" || unit == "mib") {
    shift = 20;
  } else if (unit == "g" || unit == "gb" || unit == "gib") {
    shift = 30;
  } else if (unit == "t" || unit == "tb" || unit == "tib") {
    shift = 40;
  } else {
    return std::nullopt;
  }
  if (has_fraction && shift == 0) return std::nullopt;
  if (too_large) return u128{UINT64_MAX} + 1;
  return (integer << shift) + fraction_times_power_of_two(std::move(fraction), shift);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);  // NOLINT
  auto r = devrt::memory::parse_size(input);
  const std::optional<u128> want = reference(input);

  if (!r) {
    if (r.code() != errc::malformed_size) fail(input, "error code " + std::string(to_string(r.code())));
    if (r.err().text != input) fail(input, "the error does not echo the input");
    if (r.err().message().find("malformed size '") == std::string::npos) fail(input, "message: " + r.err().message());
    if (want && *want <= UINT64_MAX) {
      fail(input, "refused a size the grammar accepts (exact value " + u128_text(*want) + "): " + r.err().message());
    }
    return 0;
  }

  const std::uint64_t v = *r;
  if (!want) fail(input, "accepted text the grammar refuses, as " + std::to_string(v));
  if (*want > UINT64_MAX) {
    fail(input, "accepted a size above 2^64 - 1 (exact value " + u128_text(*want) + ") as " + std::to_string(v));
  }
  if (u128{v} != *want) {
    fail(input, "parsed as " + std::to_string(v) + ", the exact floor is " + u128_text(*want));
  }
  auto again = devrt::memory::parse_size(std::to_string(v));
  if (!again || *again != v) fail(input, "the decimal form of " + std::to_string(v) + " does not parse back");
  if (devrt::memory::format_bytes(v).empty()) fail(input, "format_bytes gave nothing");
  return 0;
}
