#include "devrt/memory/exclusive_pool.hpp"

#include <fmt/format.h>
#include <algorithm>

namespace devrt::memory {

namespace {
// Weight of a new request in the running average of request sizes.
constexpr double average_decay = 0.01;
}  // namespace

exclusive_pool::exclusive_pool(const pool_options& opts, std::uint64_t alignment, std::uint8_t pool_index)
    : opts_(opts),
      alignment_(std::max<std::uint64_t>(alignment, 1)),
      max_alloc_(opts.max_alloc_size),
      index_(pool_index),
      average_(static_cast<double>(opts.max_alloc_size) / 2.0) {}

exclusive_pool::~exclusive_pool() { tree_.clear(); }

detail::descriptor* exclusive_pool::take(pool_context& ctx, page_node& p, std::uint64_t size) {
  tree_.erase(tree_.iterator_to(p));
  p.size = size;
  p.extent = slice_extent(size, alignment_);
  p.cursor = 0;
  p.free_count = p.free_count == 0 ? 0 : p.free_count - 1;
  p.desc = ctx.attach_new(location{index_, p.index, 0, true});
  usage_.number_allocs += 1;
  usage_.bytes_in_use += size;
  usage_.bytes_padding += p.extent - size;
  ctx.add_in_use(size);
  return p.desc;
}

detail::descriptor* exclusive_pool::try_reserve(pool_context& ctx, std::uint64_t size) {
  average_ = average_ * (1.0 - average_decay) + static_cast<double>(size) * average_decay;
  auto it = tree_.lower_bound(size_key{slice_extent(size, alignment_)}, key_fit{});
  if (it == tree_.end()) return nullptr;
  return take(ctx, *it, size);
}

result<detail::descriptor*> exclusive_pool::alloc(pool_context& ctx, std::uint64_t size) {
  if (size > max_alloc_) {
    error e = error::make(errc::buffer_too_big);
    e.size = size;
    e.limit = max_alloc_;
    return e;
  }
  // Size the page toward the running average so that it can serve later, larger requests, but
  // never past what the pool accepts.
  const auto avg = static_cast<std::uint64_t>(average_);
  const std::uint64_t page_size =
      std::max(slice_extent(size, alignment_), std::min(align_up(avg, alignment_), align_up(max_alloc_, alignment_)));
  auto page = ctx.alloc_page(page_size);
  if (!page) return std::move(page).err();
  auto node = std::make_unique<page_node>();
  node->storage = *page;
  node->index = static_cast<std::uint32_t>(pages_.size());
  page_node& p = *node;
  pages_.push_back(std::move(node));
  usage_.bytes_reserved += page_size;
  tree_.insert(p);
  detail::descriptor* d = take(ctx, p, size);
  p.free_count = initial_free_count;  // a new page is "suspected unused" until it is reused
  return d;
}

void exclusive_pool::release(pool_context& ctx, const location& loc) {
  page_node& p = *pages_[loc.page];
  ctx.detach(p.desc);
  p.desc = nullptr;
  usage_.number_allocs -= 1;
  usage_.bytes_in_use -= p.size;
  usage_.bytes_padding -= p.extent - p.size;
  ctx.sub_in_use(p.size);
  p.size = 0;
  p.extent = 0;
  tree_.insert(p);
}

result<slice_view> exclusive_pool::find(const detail::descriptor* d) const {
  const location& loc = d->loc;
  if (loc.page >= pages_.size()) return error::make(errc::not_found, "the memory page does not exist");
  if (loc.slice != 0) return error::make(errc::not_found, "the memory slice does not exist");
  const page_node& p = *pages_[loc.page];
  if (p.desc != d) return error::make(errc::not_found, "the location points to a different allocation");
  return slice_view{storage_handle{p.storage.id, 0, p.size}, p.extent - p.size, p.cursor};
}

result<void> exclusive_pool::bind(pool_context& ctx, detail::descriptor* reserved, detail::descriptor* assigned,
                                  std::uint64_t cursor) {
  auto view = find(reserved);
  if (!view) return std::move(view).err();
  page_node& p = *pages_[reserved->loc.page];
  ctx.attach_existing(assigned, reserved->loc);
  p.desc = assigned;
  p.cursor = cursor;
  ctx.detach(reserved);
  return {};
}

void exclusive_pool::tick(pool_context& ctx, std::uint64_t reserve_count) {
  if (!opts_.dealloc_period) return;
  const std::uint64_t check_period = std::max<std::uint64_t>(*opts_.dealloc_period / 5, 1);
  if (reserve_count - last_check_ < check_period) return;
  last_check_ = reserve_count;
  remove_free_pages(ctx, false);
}

void exclusive_pool::cleanup(pool_context& ctx, bool explicit_cleanup) {
  if (explicit_cleanup) remove_free_pages(ctx, true);
}

void exclusive_pool::remove_free_pages(pool_context& ctx, bool explicit_cleanup) {
  if (tree_.empty()) return;
  bool any = false;
  for (auto& p : tree_) {
    p.free_count += 1;
    any = any || explicit_cleanup || p.free_count >= release_at;
  }
  if (!any) return;
  std::uint32_t out = 0;
  for (std::uint32_t i = 0; i < pages_.size(); ++i) {
    page_node& p = *pages_[i];
    if (p.desc == nullptr && (explicit_cleanup || p.free_count >= release_at)) {
      tree_.erase(tree_.iterator_to(p));
      ctx.free_page(p.storage.id, p.storage.size);
      usage_.bytes_reserved -= p.storage.size;
      pages_[i].reset();
      continue;
    }
    if (out != i) {
      p.index = out;
      if (p.desc != nullptr) p.desc->loc.page = out;
      pages_[out] = std::move(pages_[i]);
    }
    ++out;
  }
  pages_.resize(out);
}

void exclusive_pool::release_all(pool_context& ctx) {
  tree_.clear();
  for (auto& p : pages_) {
    if (p->desc != nullptr) {
      ctx.sub_in_use(p->size);
      ctx.detach(p->desc);
    }
    ctx.free_page(p->storage.id, p->storage.size);
  }
  pages_.clear();
  usage_ = memory_usage{};
}

std::string exclusive_pool::report() const {
  std::string out = fmt::format("exclusive pool {}: max allocation {}", index_, format_bytes(max_alloc_));
  if (opts_.dealloc_period) out += fmt::format(", dealloc period {}", *opts_.dealloc_period);
  out += fmt::format("; {} pages ({} free), {} in use, {} reserved\n", pages_.size(), tree_.size(),
                     format_bytes(usage_.bytes_in_use), format_bytes(usage_.bytes_reserved));
  return out;
}

void exclusive_pool::snapshot(storage& store, std::vector<snapshot_segment>& out) const {
  for (const auto& page : pages_) {
    const page_node& p = *page;
    snapshot_segment seg;
    seg.address = snapshot_address(store, p.storage.id, p.storage.offset);
    seg.total_size = p.storage.size;
    seg.pool = fmt::format("exclusive {}", index_);
    if (p.desc == nullptr) {
      seg.blocks.push_back(snapshot_block{seg.address, seg.total_size, 0, block_state::free, streams::none, 0});
    } else {
      seg.blocks.push_back(live_block(seg.address, seg.total_size, p.size, p.desc));
    }
    out.push_back(std::move(seg));
  }
}

std::string exclusive_pool::check_invariants() const {
  memory_usage sum;
  std::size_t free_count = 0;
  for (std::uint32_t i = 0; i < pages_.size(); ++i) {
    const page_node& p = *pages_[i];
    if (p.index != i) return fmt::format("exclusive pool {}: page {} says index {}", index_, i, p.index);
    sum.bytes_reserved += p.storage.size;
    if (p.desc == nullptr) {
      if (!p.is_linked()) return fmt::format("exclusive pool {}: free page {} missing from the free tree", index_, i);
      ++free_count;
      continue;
    }
    if (p.is_linked()) return fmt::format("exclusive pool {}: live page {} is in the free tree", index_, i);
    if (p.desc->loc != location{index_, i, 0, true}) {
      return fmt::format("exclusive pool {}: descriptor of page {} points to page {}", index_, i, p.desc->loc.page);
    }
    if (p.extent > p.storage.size) {
      return fmt::format("exclusive pool {}: page {} holds {} bytes in a {} byte page", index_, i, p.extent,
                         p.storage.size);
    }
    sum.number_allocs += 1;
    sum.bytes_in_use += p.size;
    sum.bytes_padding += p.extent - p.size;
  }
  if (free_count != tree_.size()) {
    return fmt::format("exclusive pool {}: {} free pages but {} in the free tree", index_, free_count, tree_.size());
  }
  return usage_mismatch(usage_, sum, fmt::format("exclusive pool {}", index_));
}

}  // namespace devrt::memory
