#include "devrt/memory/persistent_pool.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <map>

namespace devrt::memory {

persistent_pool::persistent_pool(std::uint64_t alignment) : alignment_(std::max<std::uint64_t>(alignment, 1)) {}

persistent_pool::~persistent_pool() {
  for (auto& [extent, b] : buckets_) b.free.clear();
}

bool persistent_pool::has_size(std::uint64_t size) const {
  auto it = buckets_.find(slice_extent(size, alignment_));
  return it != buckets_.end() && it->second.count > 0;
}

detail::descriptor* persistent_pool::take(pool_context& ctx, slice_node& s, std::uint64_t size) {
  // The padding follows the new size: a reuse by a smaller request of the same extent keeps the
  // accounting exact.
  s.storage.size = size;
  s.cursor = 0;
  s.desc = ctx.attach_new(location{location::persistent_pool, 0, s.self, true});
  usage_.number_allocs += 1;
  usage_.bytes_in_use += size;
  usage_.bytes_padding += s.extent - size;
  ctx.add_in_use(size);
  touch(s.desc->loc);
  return s.desc;
}

detail::descriptor* persistent_pool::try_reserve(pool_context& ctx, std::uint64_t size) {
  auto it = buckets_.find(slice_extent(size, alignment_));
  if (it == buckets_.end() || it->second.free.empty()) return nullptr;
  slice_node& s = it->second.free.front();
  it->second.free.pop_front();
  return take(ctx, s, size);
}

result<detail::descriptor*> persistent_pool::alloc(pool_context& ctx, std::uint64_t size) {
  const std::uint64_t extent = slice_extent(size, alignment_);
  auto page = ctx.alloc_page(extent);
  if (!page) return std::move(page).err();
  const std::uint32_t slot = slots_.acquire();
  slice_node& s = slots_[slot];
  s.storage = *page;
  s.extent = extent;
  s.self = slot;
  s.exists = true;
  s.touched = false;
  buckets_[extent].count += 1;
  usage_.bytes_reserved += extent;
  return take(ctx, s, size);
}

void persistent_pool::release(pool_context& ctx, const location& loc) {
  slice_node& s = slots_[loc.slice];
  ctx.detach(s.desc);
  s.desc = nullptr;
  usage_.number_allocs -= 1;
  usage_.bytes_in_use -= s.storage.size;
  usage_.bytes_padding -= s.extent - s.storage.size;
  ctx.sub_in_use(s.storage.size);
  buckets_[s.extent].free.push_back(s);
}

result<slice_view> persistent_pool::find(const detail::descriptor* d) const {
  const location& loc = d->loc;
  if (loc.slice >= slots_.size()) return error::make(errc::not_found, "the memory slice does not exist");
  const slice_node& s = slots_[loc.slice];
  if (!s.exists || s.desc != d) return error::make(errc::not_found, "the location points to a different allocation");
  return slice_view{s.storage, s.extent - s.storage.size, s.cursor};
}

result<void> persistent_pool::bind(pool_context& ctx, detail::descriptor* reserved, detail::descriptor* assigned,
                                   std::uint64_t cursor) {
  auto view = find(reserved);
  if (!view) return std::move(view).err();
  slice_node& s = slots_[reserved->loc.slice];
  ctx.attach_existing(assigned, reserved->loc);
  s.desc = assigned;
  s.cursor = cursor;
  ctx.detach(reserved);
  touch(assigned->loc);
  return {};
}

void persistent_pool::touch(const location& loc) {
  if (!recording_) return;
  slice_node& s = slots_[loc.slice];
  if (!s.touched) {
    s.touched = true;
    touched_.push_back(loc.slice);
  }
}

std::vector<memory_handle> persistent_pool::pin_touched(pool_context& ctx) {
  recording_ = false;
  std::vector<memory_handle> pins;
  pins.reserve(touched_.size());
  for (const std::uint32_t slot : touched_) {
    slice_node& s = slots_[slot];
    s.touched = false;
    if (!s.exists) continue;
    if (s.desc != nullptr) {
      s.desc->add_handle();
      pins.push_back(memory_handle::adopt(s.desc));
    } else {
      // Freed inside the window: the graph still uses this memory, so it becomes live again.
      buckets_[s.extent].free.erase(buckets_[s.extent].free.iterator_to(s));
      const std::uint64_t size = s.storage.size;
      pins.push_back(memory_handle::adopt(take(ctx, s, size)));
    }
  }
  touched_.clear();
  recording_ = false;
  return pins;
}

void persistent_pool::cleanup(pool_context& ctx, bool explicit_cleanup) {
  if (!explicit_cleanup) return;
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    bucket& b = it->second;
    while (!b.free.empty()) {
      slice_node& s = b.free.front();
      b.free.pop_front();
      ctx.free_page(s.storage.id, s.extent);
      usage_.bytes_reserved -= s.extent;
      s.exists = false;
      s.touched = false;
      slots_.release(s.self);
      b.count -= 1;
    }
    it = b.count == 0 ? buckets_.erase(it) : std::next(it);
  }
}

void persistent_pool::release_all(pool_context& ctx) {
  for (auto& [extent, b] : buckets_) b.free.clear();
  for (auto& s : slots_) {
    if (!s.exists) continue;
    if (s.desc != nullptr) {
      ctx.sub_in_use(s.storage.size);
      ctx.detach(s.desc);
    }
    ctx.free_page(s.storage.id, s.extent);
  }
  slots_.clear();
  buckets_.clear();
  touched_.clear();
  usage_ = memory_usage{};
}

std::string persistent_pool::report() const {
  std::string out = fmt::format("persistent pool: {} slices, {} in use, {} reserved\n", slice_count(),
                                format_bytes(usage_.bytes_in_use), format_bytes(usage_.bytes_reserved));
  std::map<std::uint64_t, const bucket*> sorted;
  for (const auto& [extent, b] : buckets_) sorted.emplace(extent, &b);
  for (const auto& [extent, b] : sorted) {
    out += fmt::format("  slices of {}: {} free, {} live\n", format_bytes(extent), b->free.size(),
                       b->count - b->free.size());
  }
  return out;
}

void persistent_pool::snapshot(storage& store, std::vector<snapshot_segment>& out) const {
  for (std::uint32_t i = 0; i < slots_.size(); ++i) {
    const slice_node& s = slots_[i];
    if (!s.exists) continue;
    snapshot_segment seg;
    seg.address = snapshot_address(store, s.storage.id, 0);
    seg.total_size = s.extent;
    seg.pool = "persistent";
    if (s.desc == nullptr) {
      seg.blocks.push_back(snapshot_block{seg.address, s.extent, 0, block_state::free, streams::none, 0});
    } else {
      seg.blocks.push_back(live_block(seg.address, s.extent, s.storage.size, s.desc));
    }
    out.push_back(std::move(seg));
  }
}

std::string persistent_pool::check_invariants() const {
  memory_usage sum;
  std::unordered_map<std::uint64_t, std::uint32_t> counts;
  std::size_t free_total = 0;
  for (std::uint32_t i = 0; i < slots_.size(); ++i) {
    const slice_node& s = slots_[i];
    if (!s.exists) {
      if (s.is_linked()) return fmt::format("persistent pool: released slot {} is still on a free list", i);
      continue;
    }
    if (s.self != i) return fmt::format("persistent pool: slot {} names itself {}", i, s.self);
    counts[s.extent] += 1;
    sum.bytes_reserved += s.extent;
    if (s.desc == nullptr) {
      if (!s.is_linked()) return fmt::format("persistent pool: free slice {} is on no free list", i);
      ++free_total;
      continue;
    }
    if (s.is_linked()) return fmt::format("persistent pool: live slice {} is on a free list", i);
    if (s.desc->loc != location{location::persistent_pool, 0, i, true}) {
      return fmt::format("persistent pool: descriptor of slice {} points elsewhere", i);
    }
    if (s.storage.size > s.extent) return fmt::format("persistent pool: slice {} size exceeds its extent", i);
    sum.number_allocs += 1;
    sum.bytes_in_use += s.storage.size;
    sum.bytes_padding += s.extent - s.storage.size;
  }
  std::size_t listed = 0;
  for (const auto& [extent, b] : buckets_) {
    listed += b.free.size();
    if (counts[extent] != b.count) {
      return fmt::format("persistent pool: bucket {} counts {} slices, found {}", extent, b.count, counts[extent]);
    }
    for (const auto& s : b.free) {
      if (s.extent != extent) return fmt::format("persistent pool: slice {} in the wrong bucket", s.self);
    }
  }
  if (listed != free_total) return fmt::format("persistent pool: {} free slices, {} listed", free_total, listed);
  return usage_mismatch(usage_, sum, "persistent pool");
}

}  // namespace devrt::memory
