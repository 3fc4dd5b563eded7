// Sliced pool: device pages carved into slices that are split on reserve and merged with their
// free neighbours as soon as they are freed.
//
// Search is best fit over the free slices of all pages (smallest extent, then lowest page, then
// lowest offset) through an intrusive tree: O(log free slices), no allocation, no scan. A page whose
// slices are all free is one free slice covering it and can be returned to the storage: at an
// explicit cleanup, or when it stayed idle over a whole `dealloc_period` of reserves.
//
// Owner: the memory manager; every call comes from its owner thread.
#pragma once

#include <boost/intrusive/set.hpp>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "devrt/memory/config.hpp"
#include "devrt/memory/pool_context.hpp"
#include "devrt/memory/slot_table.hpp"
#include "devrt/memory/snapshot.hpp"

namespace devrt::memory {

class sliced_pool {
 public:
  sliced_pool(const pool_options& opts, std::uint64_t alignment, std::uint8_t pool_index);
  sliced_pool(const sliced_pool&) = delete;
  sliced_pool& operator=(const sliced_pool&) = delete;
  ~sliced_pool();

  /// Whether this pool serves `size`: up to the largest slice, or (uncapped pools only) a size that
  /// leaves less than a fifth of a page unused.
  [[nodiscard]] bool accept(std::uint64_t size) const noexcept;
  /// The sizes `accept` takes, as inclusive ranges appended to `out` (for error messages).
  void accepted_sizes(std::vector<std::pair<std::uint64_t, std::uint64_t>>& out) const;
  /// A free slice of at least `size`, split to fit; nullptr if none.
  detail::descriptor* try_reserve(pool_context& ctx, std::uint64_t size);
  /// Allocates a new page and reserves from it. Errors: pool_capacity_exceeded, storage errors.
  result<detail::descriptor*> alloc(pool_context& ctx, std::uint64_t size);
  /// The live slice at `loc` lost its last reference: free it and merge it with free neighbours.
  void release(pool_context& ctx, const location& loc);
  /// The slice that `d` refers to, after checking the location and the identity.
  result<slice_view> find(const detail::descriptor* d) const;
  /// Replaces the identity of the slice of `reserved` by `assigned`.
  result<void> bind(pool_context& ctx, detail::descriptor* reserved, detail::descriptor* assigned,
                    std::uint64_t cursor);
  /// Periodic release of pages that stayed free for a whole period (no-op without a period).
  void tick(pool_context& ctx, std::uint64_t reserve_count);
  /// Returns fully free pages (explicit only) and renumbers the pages that remain.
  void cleanup(pool_context& ctx, bool explicit_cleanup);
  /// Returns every page to the storage. Live slices are detached (their handles then resolve to
  /// not_found). Used when the pool is destroyed or replaced.
  void release_all(pool_context& ctx);

  [[nodiscard]] memory_usage usage() const noexcept { return usage_; }
  [[nodiscard]] std::uint64_t bytes_in_use() const noexcept { return usage_.bytes_in_use; }
  [[nodiscard]] std::size_t page_count() const noexcept { return pages_.size(); }
  [[nodiscard]] const pool_options& options() const noexcept { return opts_; }
  [[nodiscard]] std::string report() const;
  /// Appends this pool's segments, block by block (snapshot.hpp).
  void snapshot(storage& store, std::vector<snapshot_segment>& out) const;
  /// Empty when consistent; otherwise the first violation found.
  [[nodiscard]] std::string check_invariants() const;

 private:
  static constexpr std::uint32_t npos = 0xffffffffU;
  using tree_hook = boost::intrusive::set_base_hook<boost::intrusive::optimize_size<true>>;
  // A slice: a range of one page. Free slices are in the tree and have no descriptor; live slices
  // have one. `prev`/`next` link the slices of a page in address order.
  struct slice_node : tree_hook {
    std::uint64_t offset = 0;
    std::uint64_t extent = 0;  // bytes occupied, a multiple of the alignment
    std::uint64_t size = 0;    // bytes requested (live slices)
    std::uint64_t cursor = 0;
    detail::descriptor* desc = nullptr;
    std::uint32_t page = 0;
    std::uint32_t self = 0;  // this slice's slot
    std::uint32_t prev = npos;
    std::uint32_t next = npos;
    bool free = true;
    bool in_use_slot = false;  // slot holds a slice (not on the slot free list)
  };
  struct by_fit {
    bool operator()(const slice_node& a, const slice_node& b) const noexcept {
      if (a.extent != b.extent) return a.extent < b.extent;
      if (a.page != b.page) return a.page < b.page;
      return a.offset < b.offset;
    }
  };
  // Search key: the smallest free slice of at least `extent` bytes.
  struct extent_key {
    std::uint64_t extent;
  };
  struct key_fit {
    bool operator()(const slice_node& a, const extent_key& k) const noexcept { return a.extent < k.extent; }
    bool operator()(const extent_key& k, const slice_node& a) const noexcept { return k.extent < a.extent; }
  };
  using free_tree = boost::intrusive::multiset<slice_node, boost::intrusive::compare<by_fit>>;
  // A page: one storage allocation. `live` counts its live slices.
  struct page_node {
    storage_handle storage;
    std::uint32_t first = npos;
    std::uint32_t live = 0;
    bool idle_at_last_tick = false;
    bool used_since_tick = false;
  };

  std::uint32_t new_slot();
  void free_slot(std::uint32_t slot);
  detail::descriptor* take(pool_context& ctx, slice_node& s, std::uint64_t size);
  void remove_pages(pool_context& ctx, const std::vector<bool>& remove);
  [[nodiscard]] location loc_of(std::uint32_t slot) const noexcept;

  pool_options opts_;
  std::uint64_t alignment_;
  std::uint64_t page_size_;
  std::uint64_t max_alloc_;
  std::optional<std::uint64_t> max_pages_;
  std::uint8_t index_;
  slot_table<slice_node> slots_;
  std::vector<page_node> pages_;
  free_tree tree_;
  memory_usage usage_;
  std::uint64_t last_tick_ = 0;
};

}  // namespace devrt::memory
