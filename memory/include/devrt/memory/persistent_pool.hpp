// Persistent pool: exact-size slices, one storage allocation each, for weights and for graph
// capture. A freed slice is reused only by a request of the same aligned size (a lookup, no scan);
// slices are returned to the storage only by an explicit cleanup. Locations use the fixed pool
// index 255, so persistent memory stays reachable when the dynamic pools are rebuilt.
//
// During a capture window the pool records every slice the window reserves or binds; `pin_touched`
// returns handles that pin exactly those slices, free or live.
//
// Owner: the memory manager; every call comes from its owner thread.
#pragma once

#include <boost/intrusive/list.hpp>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "devrt/memory/config.hpp"
#include "devrt/memory/pool_context.hpp"
#include "devrt/memory/slot_table.hpp"
#include "devrt/memory/snapshot.hpp"

namespace devrt::memory {

class persistent_pool {
 public:
  explicit persistent_pool(std::uint64_t alignment);
  persistent_pool(const persistent_pool&) = delete;
  persistent_pool& operator=(const persistent_pool&) = delete;
  ~persistent_pool();

  /// Whether a slice of this aligned size exists (free or live).
  [[nodiscard]] bool has_size(std::uint64_t size) const;
  detail::descriptor* try_reserve(pool_context& ctx, std::uint64_t size);
  result<detail::descriptor*> alloc(pool_context& ctx, std::uint64_t size);
  void release(pool_context& ctx, const location& loc);
  [[nodiscard]] result<slice_view> find(const detail::descriptor* d) const;
  result<void> bind(pool_context& ctx, detail::descriptor* reserved, detail::descriptor* assigned,
                    std::uint64_t cursor);
  /// Explicit only: returns every free slice to the storage.
  void cleanup(pool_context& ctx, bool explicit_cleanup);
  void release_all(pool_context& ctx);

  /// Starts recording the slices reserved or bound (capture window).
  void begin_touch() noexcept { recording_ = true; }
  /// Records the slice at `loc` if a window is open.
  void touch(const location& loc);
  /// Ends recording and returns one handle per touched slice. A touched slice that is free again
  /// gets a fresh identity so the returned handle pins its memory too.
  std::vector<memory_handle> pin_touched(pool_context& ctx);

  [[nodiscard]] memory_usage usage() const noexcept { return usage_; }
  [[nodiscard]] std::size_t slice_count() const noexcept { return slots_.live(); }
  [[nodiscard]] std::string report() const;
  /// Appends this pool's segments, block by block (snapshot.hpp).
  void snapshot(storage& store, std::vector<snapshot_segment>& out) const;
  [[nodiscard]] std::string check_invariants() const;

 private:
  using list_hook = boost::intrusive::list_base_hook<>;
  struct slice_node : list_hook {
    storage_handle storage;  // offset 0, size = requested bytes
    std::uint64_t extent = 0;
    std::uint64_t cursor = 0;
    detail::descriptor* desc = nullptr;  // nullptr when free
    std::uint32_t self = 0;
    bool exists = false;
    bool touched = false;
  };
  using free_list = boost::intrusive::list<slice_node>;
  struct bucket {
    free_list free;
    std::uint32_t count = 0;  // slices of this extent, free or live
  };

  detail::descriptor* take(pool_context& ctx, slice_node& s, std::uint64_t size);

  std::uint64_t alignment_;
  slot_table<slice_node> slots_;
  std::unordered_map<std::uint64_t, bucket> buckets_;
  std::vector<std::uint32_t> touched_;
  bool recording_ = false;
  memory_usage usage_;
};

}  // namespace devrt::memory
