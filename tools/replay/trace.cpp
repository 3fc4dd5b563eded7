#include "replay/trace.hpp"

#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <limits>
#include <system_error>
#include <unordered_map>

namespace devrt::replay {

namespace {

constexpr std::uint32_t max_line = std::numeric_limits<std::uint32_t>::max();

error trace_error(const char* kind, std::string_view origin, std::uint64_t line, const std::string& what) {
  error e = error::make(errc::malformed_config, kind);
  e.text = line != 0 ? fmt::format("{}:{}: {}", origin, line, what) : fmt::format("{}: {}", origin, what);
  return e;
}

/// Input echoed in errors: long lines and tokens are cut so that a binary file or a runaway number
/// gives a short message.
std::string cut(std::string_view s) {
  constexpr std::size_t most = 60;
  const std::string_view shown = s.substr(0, most);
  // Control bytes and bytes past ASCII are written as escapes: a message (or JSON holding it)
  // stays printable text whatever the file holds.
  std::string out;
  out.reserve(shown.size() + 3);
  for (const char c : shown) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      out += fmt::format("\\x{:02x}", u);
    } else {
      out.push_back(c);
    }
  }
  if (s.size() > most) out += "...";
  return out;
}

/// A line or a token as quoted in errors.
std::string quote(std::string_view s) { return fmt::format("'{}'", cut(s)); }

bool is_blank(char c) noexcept { return c == ' ' || c == '\t'; }

std::string_view trim(std::string_view s) noexcept {
  while (!s.empty() && (is_blank(s.front()) || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (is_blank(s.back()) || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

/// Splits `text` into lines without copying; `fn(line, number)` returns false to stop.
template <class F>
result<void> for_each_line(std::string_view text, F&& fn) {
  const char* p = text.data();
  const char* const end = p + text.size();
  std::uint64_t number = 0;
  while (p < end) {
    const void* nl = std::memchr(p, '\n', static_cast<std::size_t>(end - p));
    const char* stop = nl != nullptr ? static_cast<const char*>(nl) : end;
    std::string_view line(p, static_cast<std::size_t>(stop - p));
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    ++number;
    if (auto r = fn(line, number); !r) return r;
    p = stop + 1;
  }
  return {};
}

/// Reads whitespace-separated tokens of one line.
struct tokens {
  std::string_view rest;
  std::string_view next() noexcept {
    std::size_t i = 0;
    while (i < rest.size() && is_blank(rest[i])) ++i;
    std::size_t j = i;
    while (j < rest.size() && !is_blank(rest[j])) ++j;
    std::string_view t = rest.substr(i, j - i);
    rest.remove_prefix(j);
    return t;
  }
};

bool parse_u64(std::string_view s, std::uint64_t& out, int base = 10) noexcept {
  if (s.empty()) return false;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out, base);
  return ec == std::errc() && ptr == s.data() + s.size();
}

/// Raw id (or pointer) -> dense index + 1. Dense raw ids, the common case, index a vector; sparse
/// ones fall back to a hash map so that one huge id cannot make the table huge.
class id_table {
 public:
  [[nodiscard]] std::uint32_t get(std::uint64_t raw) const {
    if (raw < small_limit) return raw < small_.size() ? small_[raw] : 0;
    auto it = large_.find(raw);
    return it != large_.end() ? it->second : 0;
  }
  void set(std::uint64_t raw, std::uint32_t v) {
    if (raw < small_limit) {
      if (raw >= small_.size()) small_.resize(std::max<std::uint64_t>(raw + 1, small_.size() * 2), 0);
      small_[raw] = v;
      return;
    }
    large_[raw] = v;
  }

 private:
  static constexpr std::uint64_t small_limit = std::uint64_t{1} << 24;
  std::vector<std::uint32_t> small_;
  std::unordered_map<std::uint64_t, std::uint32_t> large_;
};

/// What the reader remembers of one allocation, for the checks and for the size of its free.
struct id_state {
  std::uint64_t size = 0;
  std::uint32_t alloc_line = 0;
  std::uint32_t free_line = 0;  // 0 while live
};

std::uint32_t line32(std::uint64_t n) noexcept { return n > max_line ? max_line : static_cast<std::uint32_t>(n); }

/// Shared bookkeeping of both formats: new dense ids, frees with their sizes.
struct builder {
  static constexpr std::uint64_t max_size = std::uint64_t{1} << 62;  // as devrt_malloc
  trace& out;
  std::vector<id_state> states;
  std::uint64_t live = 0;  // bytes of the allocations not freed yet

  result<std::uint32_t> add_alloc(std::uint64_t size, std::uint64_t line, std::string_view origin) {
    if (states.size() >= std::numeric_limits<std::uint32_t>::max() - 1) {
      return trace_error("too many allocations", origin, line, "more than 4294967294 allocations");
    }
    // No allocation is larger; and the live bytes must have a total.
    if (size > max_size) {
      return trace_error("size too large", origin, line,
                         fmt::format("size {} is larger than an allocation can be ({} bytes, 2^62)", size, max_size));
    }
    if (size > std::numeric_limits<std::uint64_t>::max() - live) {
      return trace_error("live bytes overflow", origin, line,
                         fmt::format("with {} more bytes the live bytes ({}) pass 2^64", size, live));
    }
    live += size;
    const auto id = static_cast<std::uint32_t>(states.size());
    states.push_back(id_state{size, line32(line), 0});
    out.events.push_back(trace_event{size, id, event_kind::alloc});
    return id;
  }
  void add_free(std::uint32_t id, std::uint64_t line) {
    live -= states[id].size;
    states[id].free_line = line32(line);
    out.events.push_back(trace_event{states[id].size, id, event_kind::free});
  }
};

result<trace> parse_devrt(std::string_view text, std::string_view origin) {
  trace t;
  t.format = trace_format::devrt;
  t.events.reserve(text.size() / 12 + 16);
  builder b{t, {}};
  b.states.reserve(text.size() / 24 + 16);
  id_table ids;
  bool first = true;
  auto r = for_each_line(text, [&](std::string_view line, std::uint64_t n) -> result<void> {
    if (line.empty()) return {};
    const bool was_first = std::exchange(first, false);
    if (line[0] == '#') {
      // The first line's comment is the JSON header; later comments are ignored.
      if (was_first) t.header = std::string(trim(line.substr(1)));
      return {};
    }
    const char kind = line[0];
    if ((kind != 'a' && kind != 'f') || (line.size() > 1 && !is_blank(line[1]))) {
      if (trim(line).empty()) return {};
      return trace_error("unknown trace event", origin, n,
                         fmt::format("unknown event {} (expected 'a <id> <bytes>' or 'f <id>')", quote(line)));
    }
    tokens tk{line.substr(1)};
    const std::string_view id_text = tk.next();
    if (id_text.empty()) return trace_error("missing id", origin, n, fmt::format("missing id in {}", quote(line)));
    std::uint64_t raw = 0;
    if (!parse_u64(id_text, raw)) {
      return trace_error("malformed id", origin, n,
                         fmt::format("id {} is not a non-negative integer in {}", quote(id_text), quote(line)));
    }
    const std::uint32_t known = ids.get(raw);
    if (kind == 'a') {
      const std::string_view size_text = tk.next();
      if (size_text.empty()) {
        return trace_error("missing size", origin, n, fmt::format("missing size in {}", quote(line)));
      }
      std::uint64_t size = 0;
      if (!parse_u64(size_text, size)) {
        return trace_error("non-numeric size", origin, n,
                           fmt::format("size {} is not a non-negative integer in {}", quote(size_text), quote(line)));
      }
      if (const std::string_view extra = tk.next(); !extra.empty()) {
        return trace_error("unexpected text", origin, n,
                           fmt::format("unexpected {} after the size in {}", quote(extra), quote(line)));
      }
      if (known != 0) {
        return trace_error(
            "duplicate id", origin, n,
            fmt::format("duplicate id {}: already allocated at line {}", raw, b.states[known - 1].alloc_line));
      }
      auto id = b.add_alloc(size, n, origin);
      if (!id) return std::move(id).err();
      ids.set(raw, *id + 1);
      return {};
    }
    if (const std::string_view extra = tk.next(); !extra.empty()) {
      return trace_error("unexpected text", origin, n,
                         fmt::format("unexpected {} after the id in {}", quote(extra), quote(line)));
    }
    if (known == 0) {
      return trace_error("free of an unknown id", origin, n, fmt::format("free of id {}, never allocated", raw));
    }
    const id_state& s = b.states[known - 1];
    if (s.free_line != 0) {
      return trace_error("double free", origin, n,
                         fmt::format("double free of id {} (allocated at line {}, already freed at line {})", raw,
                                     s.alloc_line, s.free_line));
    }
    b.add_free(known - 1, n);
    return {};
  });
  if (!r) return std::move(r).err();
  t.allocations = static_cast<std::uint32_t>(b.states.size());
  return t;
}

/// Splits a CSV line on commas (RMM never quotes its fields).
std::size_t split_csv(std::string_view line, std::string_view* fields, std::size_t most) {
  std::size_t count = 0;
  while (count < most) {
    const std::size_t comma = line.find(',');
    fields[count++] = trim(line.substr(0, comma));
    if (comma == std::string_view::npos) break;
    line.remove_prefix(comma + 1);
  }
  return count;
}

bool iequals(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return (x | 0x20) == (y | 0x20); });
}

result<trace> parse_rmm(std::string_view text, std::string_view origin) {
  trace t;
  t.format = trace_format::rmm;
  t.events.reserve(text.size() / 40 + 16);
  builder b{t, {}};
  // Pointer -> dense id + 1 of the allocation last made there; stays after its free so that a
  // second free is reported as a double free.
  std::unordered_map<std::uint64_t, std::uint32_t> pointers;
  std::vector<std::uint32_t> live_at_null;  // size-0 allocations may share the null pointer
  constexpr std::size_t max_fields = 16;
  std::string_view fields[max_fields];
  std::size_t col_action = 0;
  std::size_t col_pointer = 0;
  std::size_t col_size = 0;
  std::size_t needed = 0;
  bool have_header = false;
  auto r = for_each_line(text, [&](std::string_view line, std::uint64_t n) -> result<void> {
    if (trim(line).empty()) return {};
    const std::size_t count = split_csv(line, fields, max_fields);
    if (!have_header) {
      have_header = true;
      std::optional<std::size_t> a;
      std::optional<std::size_t> p;
      std::optional<std::size_t> s;
      for (std::size_t i = 0; i < count; ++i) {
        if (iequals(fields[i], "Action")) a = i;
        if (iequals(fields[i], "Pointer")) p = i;
        if (iequals(fields[i], "Size")) s = i;
      }
      if (!a || !p || !s) {
        return trace_error("malformed header", origin, n,
                           fmt::format("the header {} lacks the column '{}' (expected "
                                       "Thread,Time,Action,Pointer,Size,Stream)",
                                       quote(line),
                                       !a   ? "Action"
                                       : !p ? "Pointer"
                                            : "Size"));
      }
      col_action = *a;
      col_pointer = *p;
      col_size = *s;
      needed = std::max({col_action, col_pointer, col_size}) + 1;
      return {};
    }
    if (count < needed) {
      return trace_error("missing field", origin, n,
                         fmt::format("{} fields where the header has at least {}: {}", count, needed, quote(line)));
    }
    const std::string_view action = fields[col_action];
    const bool is_alloc = iequals(action, "allocate");
    if (!is_alloc && !iequals(action, "free")) {
      if (iequals(action, "allocate failure")) {
        ++t.skipped;
        return {};
      }
      return trace_error("unknown action", origin, n,
                         fmt::format("unknown action {} (expected allocate, free or allocate failure)", quote(action)));
    }
    std::string_view ptr_text = fields[col_pointer];
    std::uint64_t ptr = 0;
    std::string_view digits = ptr_text;
    if (digits.size() > 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) digits.remove_prefix(2);
    if (!parse_u64(digits, ptr, 16)) {
      if (iequals(ptr_text, "nullptr") || iequals(ptr_text, "(nil)")) {
        ptr = 0;
      } else {
        return trace_error("malformed pointer", origin, n,
                           fmt::format("pointer {} is not a hex address", quote(ptr_text)));
      }
    }
    const std::string_view size_text = fields[col_size];
    std::uint64_t size = 0;
    if (!parse_u64(size_text, size)) {
      return trace_error("non-numeric size", origin, n,
                         fmt::format("size {} is not a non-negative integer in {}", quote(size_text), quote(line)));
    }
    if (is_alloc) {
      std::uint32_t& slot = pointers[ptr];
      if (ptr != 0 && slot != 0 && b.states[slot - 1].free_line == 0) {
        return trace_error("duplicate pointer", origin, n,
                           fmt::format("allocation at pointer {}, still live since line {}", cut(ptr_text),
                                       b.states[slot - 1].alloc_line));
      }
      auto id = b.add_alloc(size, n, origin);
      if (!id) return std::move(id).err();
      slot = *id + 1;
      if (ptr == 0) live_at_null.push_back(*id);
      return {};
    }
    if (ptr == 0 && !live_at_null.empty()) {
      b.add_free(live_at_null.back(), n);
      live_at_null.pop_back();
      return {};
    }
    auto it = pointers.find(ptr);
    if (it == pointers.end()) {
      return trace_error("free of an unknown pointer", origin, n,
                         fmt::format("free of pointer {}, never allocated", cut(ptr_text)));
    }
    const id_state& s = b.states[it->second - 1];
    if (s.free_line != 0) {
      return trace_error("double free", origin, n,
                         fmt::format("double free of pointer {} (allocated at line {}, already freed at line {})",
                                     cut(ptr_text), s.alloc_line, s.free_line));
    }
    b.add_free(it->second - 1, n);
    return {};
  });
  if (!r) return std::move(r).err();
  if (!have_header) return trace_error("malformed header", origin, 0, "empty file: no CSV header");
  t.allocations = static_cast<std::uint32_t>(b.states.size());
  return t;
}

bool ends_with(std::string_view s, std::string_view suffix) noexcept {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

const char* to_string(trace_format f) noexcept { return f == trace_format::rmm ? "rmm" : "devrt"; }

result<trace_format> parse_trace_format(std::string_view text) {
  if (text == "devrt") return trace_format::devrt;
  if (text == "rmm") return trace_format::rmm;
  error e = error::make(errc::malformed_config, "unknown trace format");
  e.text = fmt::format("unknown trace format '{}' (expected devrt or rmm)", text);
  return e;
}

trace_summary summarize(const trace& t) {
  trace_summary s;
  s.events = t.events.size();
  std::uint64_t live = 0;
  std::uint64_t live_count = 0;
  for (std::size_t i = 0; i < t.events.size(); ++i) {
    const trace_event& e = t.events[i];
    if (e.kind == event_kind::alloc) {
      ++s.allocations;
      ++live_count;
      live += e.size;
      if (live > s.peak_live_bytes) {
        s.peak_live_bytes = live;
        s.peak_live_event = i;
      }
    } else {
      ++s.frees;
      --live_count;
      live -= e.size;
    }
  }
  s.live_at_end = live_count;
  s.live_bytes_at_end = live;
  return s;
}

void truncate(trace& t, std::uint64_t n) {
  if (n >= t.events.size()) return;
  t.events.resize(n);
  // Ids are assigned in allocation order, so the prefix uses exactly the first ones.
  t.allocations = static_cast<std::uint32_t>(std::count_if(
      t.events.begin(), t.events.end(), [](const trace_event& e) { return e.kind == event_kind::alloc; }));
}

result<trace> parse_trace(std::string_view text, trace_format format, std::string_view origin) {
  return format == trace_format::rmm ? parse_rmm(text, origin) : parse_devrt(text, origin);
}

trace_format detect_format(std::string_view path, std::string_view text) {
  if (ends_with(path, ".csv") || ends_with(path, ".csv.gz")) return trace_format::rmm;
  std::size_t i = 0;
  while (i < text.size() && (text[i] == '\n' || text[i] == '\r' || is_blank(text[i]))) ++i;
  const std::string_view first = text.substr(i, text.substr(i).find('\n'));
  if (first.starts_with("Thread") || (first.find(',') != std::string_view::npos && !first.starts_with("#"))) {
    return trace_format::rmm;
  }
  return trace_format::devrt;
}

result<std::string> read_file(const std::string& path) {
  errno = 0;
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return trace_error(
        "unreadable file", path, 0,
        fmt::format("cannot open: {}", errno != 0 ? std::generic_category().message(errno) : "out of memory"));
  }
  // Large reads: inflating in big chunks is what keeps a million-line trace well under a second.
  gzbuffer(f, 1U << 20);
  std::string out;
  std::size_t used = 0;
  constexpr std::size_t chunk = std::size_t{4} << 20;
  for (;;) {
    if (out.size() - used < chunk) out.resize(std::max(out.size() * 2, used + chunk));
    const int n = gzread(f, out.data() + used, static_cast<unsigned>(chunk));
    if (n < 0) {
      int code = 0;
      std::string why = gzerror(f, &code);
      if (code == Z_ERRNO) why = std::generic_category().message(errno);
      gzclose(f);
      return trace_error("unreadable file", path, 0, fmt::format("cannot read: {}", why));
    }
    if (n == 0) break;
    used += static_cast<std::size_t>(n);
  }
  int code = 0;
  const std::string why = gzerror(f, &code);
  gzclose(f);
  if (code != Z_OK) return trace_error("unreadable file", path, 0, fmt::format("cannot read: {}", why));
  out.resize(used);
  return out;
}

result<trace> read_trace(const std::string& path, std::optional<trace_format> format) {
  auto text = read_file(path);
  if (!text) return std::move(text).err();
  const trace_format f = format.value_or(detect_format(path, *text));
  auto t = parse_trace(*text, f, path);
  if (!t) return t;
  const std::size_t slash = path.find_last_of('/');
  t->name = slash == std::string::npos ? path : path.substr(slash + 1);
  return t;
}

std::string trace_error_text(const error& e) {
  if (e.code == errc::malformed_config && !e.text.empty()) return e.text;
  return e.message();
}

}  // namespace devrt::replay
