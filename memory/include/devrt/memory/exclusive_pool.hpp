// Exclusive pool: one allocation per page. A page is allocated at the larger of the request and
// the running average of requests (so it can serve later, somewhat larger requests) and reused by
// best fit: the free page with the smallest size that fits, through an intrusive tree.
//
// Periodic deallocation: every `dealloc_period / 5` reserves the free pages are checked; a page
// starts as "suspected unused" and is returned when it stays free at its checks, while each reuse
// delays that. Explicit cleanup returns every free page. Surviving pages are renumbered.
//
// Owner: the memory manager; every call comes from its owner thread.
#pragma once

#include <boost/intrusive/set.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "devrt/memory/config.hpp"
#include "devrt/memory/pool_context.hpp"
#include "devrt/memory/snapshot.hpp"

namespace devrt::memory {

class exclusive_pool {
 public:
  exclusive_pool(const pool_options& opts, std::uint64_t alignment, std::uint8_t pool_index);
  exclusive_pool(const exclusive_pool&) = delete;
  exclusive_pool& operator=(const exclusive_pool&) = delete;
  ~exclusive_pool();

  [[nodiscard]] bool accept(std::uint64_t size) const noexcept { return size <= max_alloc_; }
  void accepted_sizes(std::vector<std::pair<std::uint64_t, std::uint64_t>>& out) const {
    out.emplace_back(0, max_alloc_);
  }
  detail::descriptor* try_reserve(pool_context& ctx, std::uint64_t size);
  result<detail::descriptor*> alloc(pool_context& ctx, std::uint64_t size);
  void release(pool_context& ctx, const location& loc);
  [[nodiscard]] result<slice_view> find(const detail::descriptor* d) const;
  result<void> bind(pool_context& ctx, detail::descriptor* reserved, detail::descriptor* assigned,
                    std::uint64_t cursor);
  void tick(pool_context& ctx, std::uint64_t reserve_count);
  void cleanup(pool_context& ctx, bool explicit_cleanup);
  void release_all(pool_context& ctx);

  [[nodiscard]] memory_usage usage() const noexcept { return usage_; }
  [[nodiscard]] std::uint64_t bytes_in_use() const noexcept { return usage_.bytes_in_use; }
  [[nodiscard]] std::size_t page_count() const noexcept { return pages_.size(); }
  [[nodiscard]] const pool_options& options() const noexcept { return opts_; }
  [[nodiscard]] std::string report() const;
  /// Appends this pool's segments, block by block (snapshot.hpp).
  void snapshot(storage& store, std::vector<snapshot_segment>& out) const;
  [[nodiscard]] std::string check_invariants() const;

  /// Free count a new page starts with; a page is returned when its count reaches `release_at`.
  static constexpr std::uint32_t initial_free_count = 4;
  static constexpr std::uint32_t release_at = 5;

 private:
  using tree_hook = boost::intrusive::set_base_hook<boost::intrusive::optimize_size<true>>;
  struct page_node : tree_hook {
    storage_handle storage;  // the whole page: offset 0, size = alloc_size
    std::uint64_t size = 0;  // bytes requested by the live allocation
    std::uint64_t extent = 0;
    std::uint64_t cursor = 0;
    detail::descriptor* desc = nullptr;  // nullptr when free
    std::uint32_t index = 0;
    std::uint32_t free_count = initial_free_count;
  };
  struct by_fit {
    bool operator()(const page_node& a, const page_node& b) const noexcept {
      if (a.storage.size != b.storage.size) return a.storage.size < b.storage.size;
      return a.index < b.index;
    }
  };
  struct size_key {
    std::uint64_t size;
  };
  struct key_fit {
    bool operator()(const page_node& a, const size_key& k) const noexcept { return a.storage.size < k.size; }
    bool operator()(const size_key& k, const page_node& a) const noexcept { return k.size < a.storage.size; }
  };
  using free_tree = boost::intrusive::multiset<page_node, boost::intrusive::compare<by_fit>>;

  detail::descriptor* take(pool_context& ctx, page_node& p, std::uint64_t size);
  void remove_free_pages(pool_context& ctx, bool explicit_cleanup);

  pool_options opts_;
  std::uint64_t alignment_;
  std::uint64_t max_alloc_;
  std::uint8_t index_;
  double average_;
  std::vector<std::unique_ptr<page_node>> pages_;
  free_tree tree_;
  memory_usage usage_;
  std::uint64_t last_check_ = 0;
};

}  // namespace devrt::memory
