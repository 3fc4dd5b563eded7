#include "devrt/runtime/tag.hpp"

#include "devrt/memory/error.hpp"

namespace devrt::runtime {

namespace {
thread_local memory::tag_id current = 0;
}  // namespace

const memory::tag_name& current_tag() noexcept { return memory::tag_of(current); }

memory::tag_id current_tag_id() noexcept { return current; }

result<void> set_current_tag(const memory::tag_name& tag) {
  auto id = memory::intern_tag(tag);
  if (!id) return std::move(id).err();
  current = *id;
  return {};
}

tag_scope::tag_scope(std::string_view tag) : previous_(current) {
  auto name = memory::tag_name::make(tag);
  if (!name) throw exception(std::move(name).err());
  if (auto r = set_current_tag(*name); !r) throw exception(std::move(r).err());
}

tag_scope::tag_scope(const memory::tag_name& tag) : previous_(current) {
  if (auto r = set_current_tag(tag); !r) throw exception(std::move(r).err());
}

tag_scope::~tag_scope() { current = previous_; }

}  // namespace devrt::runtime
