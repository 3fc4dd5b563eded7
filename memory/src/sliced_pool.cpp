#include "devrt/memory/sliced_pool.hpp"

#include "devrt/memory/slice_links.hpp"

#include <fmt/format.h>
#include <algorithm>

namespace devrt::memory {

sliced_pool::sliced_pool(const pool_options& opts, std::uint64_t alignment, std::uint8_t pool_index)
    : opts_(opts), alignment_(std::max<std::uint64_t>(alignment, 1)), index_(pool_index) {
  page_size_ = std::max(align_up(opts.page_size, alignment_), alignment_);
  if (opts.max_pool_size) {
    const std::uint64_t cap = *opts.max_pool_size;
    // A cap smaller than a page shrinks the page to the cap; a cap below the alignment leaves room
    // for no page at all, so every reserve reports the capacity error.
    if (cap < page_size_) page_size_ = std::max(cap / alignment_ * alignment_, alignment_);
    max_pages_ = std::min<std::uint64_t>(cap / page_size_, max_pages_per_pool);
  }
  max_alloc_ = std::min(opts.max_alloc_size == 0 ? page_size_ : opts.max_alloc_size, page_size_);
}

sliced_pool::~sliced_pool() {
  // The manager returns every page before destroying a pool; unlink what is left so the
  // intrusive tree does not refer to destroyed nodes.
  tree_.clear();
}

bool sliced_pool::accept(std::uint64_t size) const noexcept {
  if (size <= max_alloc_) return true;
  return !max_pages_ && size <= page_size_ && (page_size_ - size) * 5 < page_size_;
}

void sliced_pool::accepted_sizes(std::vector<std::pair<std::uint64_t, std::uint64_t>>& out) const {
  out.emplace_back(0, max_alloc_);
  // A whole page: (page - size) * 5 < page, so above four fifths of it (written without 4 * page,
  // which could wrap).
  if (!max_pages_) out.emplace_back(page_size_ - (page_size_ + 4) / 5 + 1, page_size_);
}

location sliced_pool::loc_of(std::uint32_t slot) const noexcept {
  return location{index_, slots_[slot].page, slot, true};
}

std::uint32_t sliced_pool::new_slot() {
  const std::uint32_t slot = slots_.acquire();
  slots_[slot].self = slot;
  slots_[slot].in_use_slot = true;
  return slot;
}

void sliced_pool::free_slot(std::uint32_t slot) {
  slots_[slot].in_use_slot = false;
  slots_[slot].desc = nullptr;
  slots_.release(slot);
}

detail::descriptor* sliced_pool::take(pool_context& ctx, slice_node& s, std::uint64_t size) {
  const std::uint64_t extent = slice_extent(size, alignment_);
  tree_.erase(tree_.iterator_to(s));
  if (s.extent > extent) {
    // Split: the remainder becomes a free slice right after this one.
    const std::uint32_t self = s.self;
    const std::uint32_t r = new_slot();  // may grow the deque: references stay valid
    slice_links::link_after(slots_, self, r);
    slice_node& cur = slots_[self];
    slice_node& rest = slots_[r];
    rest.offset = cur.offset + extent;
    rest.extent = cur.extent - extent;
    rest.page = cur.page;
    cur.extent = extent;
    tree_.insert(rest);
  }
  s.free = false;
  s.size = size;
  s.cursor = 0;
  page_node& page = pages_[s.page];
  ++page.live;
  page.used_since_tick = true;
  s.desc = ctx.attach_new(loc_of(s.self));
  usage_.number_allocs += 1;
  usage_.bytes_in_use += size;
  usage_.bytes_padding += s.extent - size;
  ctx.add_in_use(size);
  return s.desc;
}

detail::descriptor* sliced_pool::try_reserve(pool_context& ctx, std::uint64_t size) {
  const std::uint64_t extent = slice_extent(size, alignment_);
  auto it = tree_.lower_bound(extent_key{extent}, key_fit{});
  if (it == tree_.end()) return nullptr;
  return take(ctx, *it, size);
}

result<detail::descriptor*> sliced_pool::alloc(pool_context& ctx, std::uint64_t size) {
  if (max_pages_ && pages_.size() >= *max_pages_) {
    error e = error::make(errc::pool_capacity_exceeded);
    e.size = size;
    e.limit = *max_pages_ * page_size_;
    e.in_use = usage_.bytes_in_use;
    return e;
  }
  auto page = ctx.alloc_page(page_size_);
  if (!page) return std::move(page).err();
  const auto page_index = static_cast<std::uint32_t>(pages_.size());
  const std::uint32_t slot = new_slot();
  slice_node& s = slots_[slot];
  s.offset = 0;
  s.extent = page_size_;
  s.page = page_index;
  pages_.push_back(page_node{*page, slot, 0, false, true});
  usage_.bytes_reserved += page_size_;
  tree_.insert(s);
  return take(ctx, slots_[slot], size);
}

void sliced_pool::release(pool_context& ctx, const location& loc) {
  std::uint32_t slot = loc.slice;
  slice_node* s = &slots_[slot];
  ctx.detach(s->desc);
  s->desc = nullptr;
  s->free = true;
  usage_.number_allocs -= 1;
  usage_.bytes_in_use -= s->size;
  usage_.bytes_padding -= s->extent - s->size;
  ctx.sub_in_use(s->size);
  s->size = 0;
  --pages_[s->page].live;
  // Merge with free neighbours, keeping the lower slot of each pair.
  if (s->prev != npos && slots_[s->prev].free) {
    slice_node& p = slots_[s->prev];
    tree_.erase(tree_.iterator_to(p));
    p.extent += s->extent;
    slice_links::unlink(slots_, slot);
    free_slot(slot);
    s = &p;
    slot = p.self;
  }
  if (s->next != npos && slots_[s->next].free) {
    slice_node& n = slots_[s->next];
    tree_.erase(tree_.iterator_to(n));
    s->extent += n.extent;
    const std::uint32_t gone = n.self;
    slice_links::unlink(slots_, gone);
    free_slot(gone);
  }
  tree_.insert(*s);
}

result<slice_view> sliced_pool::find(const detail::descriptor* d) const {
  const location& loc = d->loc;
  if (loc.page >= pages_.size()) return error::make(errc::not_found, "the memory page does not exist");
  if (loc.slice >= slots_.size()) return error::make(errc::not_found, "the memory slice does not exist");
  const slice_node& s = slots_[loc.slice];
  if (!s.in_use_slot || s.free || s.desc != d || s.page != loc.page) {
    return error::make(errc::not_found, "the location points to a different allocation");
  }
  return slice_view{storage_handle{pages_[s.page].storage.id, s.offset, s.size}, s.extent - s.size, s.cursor};
}

result<void> sliced_pool::bind(pool_context& ctx, detail::descriptor* reserved, detail::descriptor* assigned,
                               std::uint64_t cursor) {
  auto view = find(reserved);
  if (!view) return std::move(view).err();
  slice_node& s = slots_[reserved->loc.slice];
  ctx.attach_existing(assigned, reserved->loc);
  s.desc = assigned;
  s.cursor = cursor;
  ctx.detach(reserved);
  return {};
}

void sliced_pool::tick(pool_context& ctx, std::uint64_t reserve_count) {
  if (!opts_.dealloc_period || *opts_.dealloc_period == 0) return;
  if (reserve_count - last_tick_ < *opts_.dealloc_period) return;
  last_tick_ = reserve_count;
  std::vector<bool> remove;
  bool any = false;
  for (auto& p : pages_) {
    const bool idle = p.live == 0;
    const bool drop = idle && p.idle_at_last_tick && !p.used_since_tick;
    remove.push_back(drop);
    any = any || drop;
    p.idle_at_last_tick = idle;
    p.used_since_tick = false;
  }
  if (any) remove_pages(ctx, remove);
}

void sliced_pool::cleanup(pool_context& ctx, bool explicit_cleanup) {
  if (!explicit_cleanup) return;
  std::vector<bool> remove;
  bool any = false;
  for (const auto& p : pages_) {
    remove.push_back(p.live == 0);
    any = any || p.live == 0;
  }
  if (any) remove_pages(ctx, remove);
}

void sliced_pool::remove_pages(pool_context& ctx, const std::vector<bool>& remove) {
  std::uint32_t out = 0;
  for (std::uint32_t i = 0; i < pages_.size(); ++i) {
    page_node& p = pages_[i];
    if (remove[i]) {
      // A page with no live slice is a single free slice covering it.
      slice_node& s = slots_[p.first];
      tree_.erase(tree_.iterator_to(s));
      free_slot(p.first);
      ctx.free_page(p.storage.id, p.storage.size);
      usage_.bytes_reserved -= p.storage.size;
      continue;
    }
    if (out != i) {
      // Renumber: every slice of the page, and the location seen by live handles and bindings.
      for (std::uint32_t k = p.first; k != npos; k = slots_[k].next) {
        slots_[k].page = out;
        if (slots_[k].desc != nullptr) slots_[k].desc->loc.page = out;
      }
      pages_[out] = p;
    }
    ++out;
  }
  pages_.resize(out);
}

void sliced_pool::release_all(pool_context& ctx) {
  tree_.clear();
  for (auto& p : pages_) {
    for (std::uint32_t k = p.first; k != npos; k = slots_[k].next) {
      slice_node& s = slots_[k];
      if (s.desc != nullptr) {
        ctx.sub_in_use(s.size);
        ctx.detach(s.desc);
      }
    }
    ctx.free_page(p.storage.id, p.storage.size);
  }
  pages_.clear();
  slots_.clear();
  usage_ = memory_usage{};
}

std::string sliced_pool::report() const {
  std::string out =
      fmt::format("sliced pool {}: page {}, max slice {}", index_, format_bytes(page_size_), format_bytes(max_alloc_));
  if (max_pages_) out += fmt::format(", cap {} pages", *max_pages_);
  if (opts_.dealloc_period) out += fmt::format(", dealloc period {}", *opts_.dealloc_period);
  out += fmt::format("; {} pages, {} live slices, {} in use, {} reserved\n", pages_.size(), usage_.number_allocs,
                     format_bytes(usage_.bytes_in_use), format_bytes(usage_.bytes_reserved));
  for (std::size_t i = 0; i < pages_.size(); ++i) {
    std::uint64_t free_bytes = 0;
    std::uint64_t slices = 0;
    for (std::uint32_t k = pages_[i].first; k != npos; k = slots_[k].next) {
      ++slices;
      if (slots_[k].free) free_bytes += slots_[k].extent;
    }
    out += fmt::format("  page {}: {} slices ({} live), {} free of {}\n", i, slices, pages_[i].live,
                       format_bytes(free_bytes), format_bytes(pages_[i].storage.size));
  }
  return out;
}

void sliced_pool::snapshot(storage& store, std::vector<snapshot_segment>& out) const {
  for (const page_node& p : pages_) {
    snapshot_segment seg;
    seg.address = snapshot_address(store, p.storage.id, p.storage.offset);
    seg.total_size = p.storage.size;
    seg.pool = fmt::format("sliced {}", index_);
    std::uint64_t end = 0;
    for (std::uint32_t k = p.first; k != npos; k = slots_[k].next) {
      const slice_node& s = slots_[k];
      if (s.free) {
        seg.blocks.push_back(snapshot_block{seg.address + s.offset, s.extent, 0, block_state::free, streams::none, 0});
      } else {
        seg.blocks.push_back(live_block(seg.address + s.offset, s.extent, s.size, s.desc));
      }
      end = s.offset + s.extent;
    }
    if (end < seg.total_size) {
      // The page's tail past its last slice (a page larger than the slices it was cut into).
      seg.blocks.push_back(
          snapshot_block{seg.address + end, seg.total_size - end, 0, block_state::free, streams::none, 0});
    }
    out.push_back(std::move(seg));
  }
}

std::string sliced_pool::check_invariants() const {
  memory_usage sum;
  std::size_t free_count = 0;
  for (std::uint32_t i = 0; i < pages_.size(); ++i) {
    const page_node& p = pages_[i];
    sum.bytes_reserved += p.storage.size;
    std::uint64_t expect_offset = 0;
    std::uint32_t live = 0;
    std::uint32_t prev = npos;
    bool prev_free = false;
    for (std::uint32_t k = p.first; k != npos; k = slots_[k].next) {
      const slice_node& s = slots_[k];
      if (!s.in_use_slot) return fmt::format("pool {} page {}: slot {} is linked but unused", index_, i, k);
      if (s.self != k) return fmt::format("pool {} page {}: slot {} names itself {}", index_, i, k, s.self);
      if (s.page != i) return fmt::format("pool {} page {}: slice {} says page {}", index_, i, k, s.page);
      if (s.prev != prev) return fmt::format("pool {} page {}: slice {} has a broken back link", index_, i, k);
      if (s.offset != expect_offset) {
        return fmt::format("pool {} page {}: slice {} at offset {} but the previous slice ends at {} (overlap or gap)",
                           index_, i, k, s.offset, expect_offset);
      }
      if (s.extent == 0 || s.extent % alignment_ != 0) {
        return fmt::format("pool {} page {}: slice {} has extent {} not a positive multiple of {}", index_, i, k,
                           s.extent, alignment_);
      }
      if (s.free) {
        if (prev_free) return fmt::format("pool {} page {}: two adjacent free slices not merged", index_, i);
        if (s.desc != nullptr) return fmt::format("pool {} page {}: free slice {} has a descriptor", index_, i, k);
        if (!s.is_linked())
          return fmt::format("pool {} page {}: free slice {} missing from the free tree", index_, i, k);
        ++free_count;
      } else {
        if (s.is_linked()) return fmt::format("pool {} page {}: live slice {} is in the free tree", index_, i, k);
        if (s.desc == nullptr) return fmt::format("pool {} page {}: live slice {} has no descriptor", index_, i, k);
        const auto st = s.desc->state.load(std::memory_order_acquire);
        if ((st & detail::descriptor::attached_bit) == 0) {
          return fmt::format("pool {} page {}: live slice {} has a detached descriptor", index_, i, k);
        }
        if (s.desc->loc != location{index_, i, k, true}) {
          return fmt::format("pool {} page {}: descriptor of slice {} points to pool {} page {} slice {}", index_, i, k,
                             s.desc->loc.pool, s.desc->loc.page, s.desc->loc.slice);
        }
        if (s.size > s.extent) return fmt::format("pool {} page {}: slice {} size exceeds extent", index_, i, k);
        ++live;
        sum.number_allocs += 1;
        sum.bytes_in_use += s.size;
        sum.bytes_padding += s.extent - s.size;
      }
      prev_free = s.free;
      prev = k;
      expect_offset += s.extent;
    }
    if (expect_offset != p.storage.size) {
      return fmt::format("pool {} page {}: slices cover {} bytes of a {} byte page", index_, i, expect_offset,
                         p.storage.size);
    }
    if (live != p.live) return fmt::format("pool {} page {}: {} live slices counted as {}", index_, i, live, p.live);
  }
  if (free_count != tree_.size()) {
    return fmt::format("pool {}: {} free slices but {} in the free tree", index_, free_count, tree_.size());
  }
  return usage_mismatch(usage_, sum, fmt::format("pool {}", index_));
}

}  // namespace devrt::memory
