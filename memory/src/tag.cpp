#include "devrt/memory/tag.hpp"

#include <atomic>
#include <mutex>

namespace devrt::memory {

result<tag_name> tag_name::make(std::string_view text) {
  if (text.size() > max_length) {
    error e = error::make(errc::invalid_argument, "a tag has at most 63 bytes");
    e.size = text.size();
    e.limit = max_length;
    return e;
  }
  for (const char c : text) {
    if (c < 0x20 || c > 0x7e) {
      return error::make(errc::invalid_argument, "a tag is printable ASCII (bytes 0x20 to 0x7e)");
    }
  }
  tag_name t;
  if (!text.empty()) std::memcpy(t.bytes_.data(), text.data(), text.size());  // an empty view's data may be null
  t.bytes_[text.size()] = '\0';
  t.length_ = static_cast<std::uint8_t>(text.size());
  return t;
}

tag_name::tag_name(std::string_view text) {
  auto t = make(text);
  if (!t) throw exception(std::move(t).err());
  *this = *t;
}

namespace {

// The process's tags: written under the lock, once each; read without it below `count`.
struct tag_registry {
  std::mutex lock;
  std::array<tag_name, max_tags + 1> names{};  // [0] is the empty tag
  std::atomic<std::size_t> count{0};
};

tag_registry& registry() {
  static tag_registry r;
  return r;
}

}  // namespace

result<tag_id> intern_tag(const tag_name& tag) {
  if (tag.empty()) return tag_id{0};
  tag_registry& r = registry();
  const std::size_t known = r.count.load(std::memory_order_acquire);
  for (std::size_t i = 1; i <= known; ++i) {
    if (r.names[i] == tag) return static_cast<tag_id>(i);
  }
  const std::lock_guard<std::mutex> guard(r.lock);
  const std::size_t n = r.count.load(std::memory_order_relaxed);
  for (std::size_t i = known + 1; i <= n; ++i) {
    if (r.names[i] == tag) return static_cast<tag_id>(i);
  }
  if (n == max_tags) {
    error e = error::make(errc::invalid_argument, "too many distinct tags in this process");
    e.size = n + 1;
    e.limit = max_tags;
    e.text = std::string(tag.view());
    return e;
  }
  r.names[n + 1] = tag;
  r.count.store(n + 1, std::memory_order_release);
  return static_cast<tag_id>(n + 1);
}

const tag_name& tag_of(tag_id id) noexcept {
  tag_registry& r = registry();
  if (id > r.count.load(std::memory_order_acquire)) return r.names[0];
  return r.names[id];
}

const char* to_string(tag_state s) noexcept {
  switch (s) {
    case tag_state::awake: return "awake";
    case tag_state::asleep: return "asleep";
  }
  return "unknown";
}

}  // namespace devrt::memory
