// Arena pool: one reserved address range, allocations placed best fit, free neighbours merged at
// once, and memory mapped behind the range only where it is needed.
//
// The range is divided into granules (the device's map granularity or a multiple of it). Memory
// is mapped in mappings, each one physical allocation over a run of granules, because a device
// unmaps only whole mappings and its calls cost per mapping, not per byte. When a slice needs
// granules without memory, they are mapped as mappings of the granules the slice covers whole,
// cut at multiples of the chunk (32 MiB by default), and one of its last granule when the slice
// ends inside it (a later neighbour may share that one). So a mapping becomes free when the
// slices that use it are gone, a big allocation costs one driver call per chunk, and a mapping a
// later slice reuses in part keeps at most a chunk of free memory that cannot be unmapped.
//
// Placement: the smallest free slice that fits, at its front. The range's free end (from the last
// live slice to the end of the range) is the largest free slice, taken when no hole fits, except
// that for a slice larger than a granule its part below the highest address used so far (since
// the last explicit cleanup) competes as a hole of that size: a long-lived slice that fits there
// tighter leaves the hole of a short-lived one whole for the next of its size, as a plain best fit
// does (PyTorch's bert_infer: 4.5% less held behind the GPU). Small slices keep to the holes, and
// the free end wins only where it maps no more granules than the hole would.
//
// A free mapping stays mapped and joins a list, oldest first: a later slice placed there needs
// no driver call. When a slice needs new memory, as many free mappings elsewhere are unmapped
// first, oldest first, so the memory held does not grow while free memory sits in holes, and
// repeated work (a training step, a request) maps nothing once warm. With a `slack`, free
// mappings beyond it are unmapped as soon as they are freed; an explicit cleanup unmaps them all.
//
// The growth policy (`grow`, on by default) cuts the driver calls of a workload whose footprint
// grows: free mappings stay mapped while the memory mapped stays within a budget of 1.04 times the
// peak of live bytes, and only what would pass it is unmapped, largest mappings first. Where the
// arena grows (a slice placed at the start of the range's free end), the mapping reaches past the
// slice, in a unit of a power of two of granules up to 1/32 of the memory mapped (at most
// `grow`), as far as 1.01 times the peak of live bytes allows; and a run of fewer than 4 granules
// keeps its last granule rather than mapping it apart. Those are the shares near the device's
// budget (pool_context: its memory limit, else its capacity). Far from it (pool_context::roomy)
// free mappings stay mapped within 1.10 times the peak of live bytes, and the arena maps ahead
// within 1.10 times, at most 128 MiB at once and no more than the slice raises the peak of live
// bytes by (but 64 MiB in any case), in units up to `grow` and a quarter of the headroom, and not
// past a slice that maps four units or more itself (its own mappings are then in units).
// Far from the budget, free mappings also stay while the memory mapped stays within the most the
// arena has held so far (since the last explicit cleanup): memory the workload needed once is kept
// for when it needs it again, and a map unmaps only where it would otherwise raise that peak.
// Where maps far from the budget keep unmapping what later maps take again (more than twice the
// peak of live bytes unmapped within 64 reserves: buffers of a few sizes in turn over more
// addresses than the share keeps mapped), the share rises by 0.10 at a time, up to 2.00, and falls
// back once such unmaps stop (note_churn).
// Under a memory limit and near it, mappings are smaller: at most 1/128 of the limit (a power of two
// of granules), and a mapping ahead of a growing slice no larger than that slice. A device unmaps
// whole mappings only, so the free part of one that a live slice pins stays mapped, and a workload
// capped just above its peak of live bytes has no room for such memory.
// On a device whose unmaps wait behind its queued work, far from the budget, free mappings are
// not unmapped while earlier unmaps are still in flight: an unmap then lowers the memory held only
// once the work has passed, and a map at those addresses before that revives it (two driver calls
// for nothing). Under a memory limit, free mappings give way (largest first) before a map would
// pass it.
//
// Stream order (see stream_order.hpp): with several streams, a slice freed on its own stream
// stays free *for that stream only* (tagged with it) until the stream's fence for its epoch has
// passed; a reserve on that stream may take it at once, any other waits. Tagged free slices merge
// only with neighbours of the same tag, and their mappings count them like live slices, so memory
// that a stream may still use is never unmapped. `harvest` turns tagged slices whose fence passed
// into slices free for all (merging them with their neighbours); a reserve that would map new
// memory first has the manager fence the streams with unfenced frees and query the fences in
// flight (pool_context::reuse_streams, never a wait), so what any stream freed and has passed
// serves it.
//
// Costs: best fit through size classes with bitmaps (size_class_index.hpp: constant time, exact
// best fit while a class holds at most 16 free slices), one index for the free slices and one per
// stream for its tagged ones; per reserve and free, constant work per mapping the slice overlaps
// (one or two for most slices); granule by granule only where memory is mapped or unmapped, next
// to a driver call. No scan of the slices, granules or mappings.
//
// Sleep (tag.hpp): a tag's arena can give all its physical memory back while its live slices keep
// their offsets. `sleep` unmaps the free mappings (an explicit cleanup), then every other mapping,
// which stays *asleep*: its granules still name it and its count of slices is kept, but nothing is
// mapped behind it. A slice freed while asleep lowers the count, and an asleep mapping nothing uses
// any more is forgotten (no driver call). `wake` maps every asleep mapping again with its bounds.
// The manager refuses reserves while asleep.
//
// Owner: the memory manager; every call comes from its owner thread.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "devrt/memory/config.hpp"
#include "devrt/memory/pool_context.hpp"
#include "devrt/memory/size_class_index.hpp"
#include "devrt/memory/slot_table.hpp"
#include "devrt/memory/snapshot.hpp"

namespace devrt::memory {

class arena_pool {
 public:
  arena_pool(const pool_options& opts, std::uint64_t alignment, std::uint16_t pool_index);
  arena_pool(const arena_pool&) = delete;
  arena_pool& operator=(const arena_pool&) = delete;
  ~arena_pool();

  [[nodiscard]] bool accept(std::uint64_t size) const noexcept { return size <= max_alloc_; }
  /// The sizes `accept` takes, as inclusive ranges appended to `out` (for error messages).
  void accepted_sizes(std::vector<std::pair<std::uint64_t, std::uint64_t>>& out) const {
    out.emplace_back(0, max_alloc_);
  }
  /// Always nullptr: placing a slice may need mapping, which can fail, so `alloc` does it all.
  static detail::descriptor* try_reserve(pool_context& /*ctx*/, std::uint64_t /*size*/) noexcept { return nullptr; }
  /// Reserves the address range on first use, places the slice best fit and maps the granules it
  /// needs. Errors: out_of_memory (the device refused memory), pool_capacity_exceeded (no hole of
  /// the address range is large enough), unsupported, device_error. After a failure the pool and
  /// the device agree and no live slice changed; free mappings unmapped to make room stay unmapped.
  result<detail::descriptor*> alloc(pool_context& ctx, std::uint64_t size);
  /// The live slice at `loc` lost its last reference: free it, merge it, release granules. With a
  /// `tag` (a stream), the slice stays free for that stream only until `harvest` finds its
  /// stream's fence for `epoch` passed.
  void release(pool_context& ctx, const location& loc, std::uint64_t tag = 0, std::uint64_t epoch = 0);
  /// Frees for every stream the tagged slices whose fences have passed (polls the fences first
  /// when `poll`). True when any slice changed.
  bool harvest(pool_context& ctx, bool poll);
  /// Before mapping: memory freed on any stream whose fence has passed joins the free space
  /// (through the context's reuse_streams, else the pool's own harvest). True when it did.
  bool reuse_fenced(pool_context& ctx);
  /// Free slices kept for one stream, and their bytes.
  [[nodiscard]] std::size_t tagged_slices() const noexcept { return tagged_; }
  /// (A walk over the tagged slices: for configure and reports, not the reserve path.)
  [[nodiscard]] std::uint64_t tagged_bytes() const noexcept;
  [[nodiscard]] result<slice_view> find(const detail::descriptor* d) const;
  /// The address of the live slice at `slot` without asking the storage, once `learn_base` has
  /// seen one resolved address of the range (a range's addresses are contiguous); false before.
  [[nodiscard]] bool address_of(std::uint32_t slot, void*& ptr) const noexcept {
    if (!base_known_) return false;
    ptr = base_ == 0 ? nullptr : reinterpret_cast<void*>(base_ + slots_[slot].offset);  // NOLINT
    return true;
  }
  /// Remembers the range's base from the address the storage resolved for the slice at `slot`
  /// (nullptr on devices without memory, such as the simulated one: every address is then null).
  void learn_base(std::uint32_t slot, void* ptr) noexcept {
    base_ = ptr == nullptr ? 0 : reinterpret_cast<std::uintptr_t>(ptr) - slots_[slot].offset;  // NOLINT
    base_known_ = true;
  }
  result<void> bind(pool_context& ctx, detail::descriptor* reserved, detail::descriptor* assigned,
                    std::uint64_t cursor);
  /// Nothing periodic: granules are released as they become free.
  void tick(pool_context& /*ctx*/, std::uint64_t /*reserve_count*/) noexcept {}
  /// An explicit cleanup unmaps every free granule (the slack included).
  void cleanup(pool_context& ctx, bool explicit_cleanup);
  /// Unmaps everything and gives the address range back. Live slices are detached. The pool is
  /// destroyed after it (a configure builds new pools), so what it learnt (the churn share, a
  /// halved address space) goes with it.
  void release_all(pool_context& ctx);

  // ---- Sleep (see the top of the file) ----
  /// Unmaps every mapping; live slices keep their offsets. Nothing to do when asleep.
  void sleep(pool_context& ctx);
  /// Maps every asleep mapping again, with its bounds. Errors: those of the storage's map
  /// (out_of_memory, device_error); the mappings this call made are unmapped again, and the pool
  /// stays asleep as it was.
  result<void> wake(pool_context& ctx);
  [[nodiscard]] bool asleep() const noexcept { return asleep_; }
  /// Bytes of the asleep mappings (what a wake maps).
  [[nodiscard]] std::uint64_t sleeping_bytes() const noexcept { return sleeping_ * granule_; }
  /// Calls `f(storage_handle)` for every live slice (range, offset, requested size). A walk over
  /// the slices: for sleep, not the reserve path.
  template <class F>
  void for_each_live(F&& f) const {
    for (std::uint32_t i = 0; i < slots_.size(); ++i) {
      const slice_node& s = slots_[i];
      if (s.in_use_slot && !s.free && s.desc != nullptr) f(storage_handle{range_, s.offset, s.size});
    }
  }

  [[nodiscard]] memory_usage usage() const noexcept { return usage_; }
  [[nodiscard]] std::uint64_t bytes_in_use() const noexcept { return usage_.bytes_in_use; }
  /// 1 once the address range is reserved.
  [[nodiscard]] std::size_t page_count() const noexcept { return range_ != 0 ? 1 : 0; }
  [[nodiscard]] const pool_options& options() const noexcept { return opts_; }
  [[nodiscard]] std::uint64_t granule_size() const noexcept { return granule_; }
  [[nodiscard]] std::uint64_t mapped_granules() const noexcept { return mapped_; }
  [[nodiscard]] std::uint64_t free_mapped_granules() const noexcept { return free_mapped_; }
  [[nodiscard]] std::size_t mapping_count() const noexcept { return mappings_.live() - ghosts_; }
  [[nodiscard]] std::string report() const;
  /// Appends this pool's segments, block by block (snapshot.hpp).
  void snapshot(storage& store, std::vector<snapshot_segment>& out) const;
  /// Empty when consistent; otherwise the first violation found.
  [[nodiscard]] std::string check_invariants() const;

 private:
  static constexpr std::uint32_t npos = 0xffffffffU;
  // A slice of the range. Free slices are in a free index (`untagged_`, or their stream's) and
  // have no descriptor.
  // Invariants: a free slice with a tag is on its stream's tag list (in epoch order) and in its
  // index, and counts on its mappings like a live slice; adjacent free slices always differ in tag.
  struct slice_node {
    std::uint64_t offset = 0;
    std::uint64_t extent = 0;
    std::uint64_t size = 0;
    std::uint64_t cursor = 0;
    detail::descriptor* desc = nullptr;
    std::uint64_t tag = 0;    // free slices: the registration (serial) of the only stream that may take it (0: any)
    std::uint64_t epoch = 0;  // tagged: the epoch of its newest free
    std::uint32_t self = 0;
    std::uint32_t prev = npos;
    std::uint32_t next = npos;
    std::uint32_t tag_prev = npos;  // neighbours on the tag list
    std::uint32_t tag_next = npos;
    std::uint32_t bin_prev = npos;  // neighbours in the free index's size class
    std::uint32_t bin_next = npos;
    bool free = true;
    bool indexed = false;  // in a free index
    bool in_use_slot = false;
  };
  // The tagged free slices of one stream: oldest epoch first on the list, by size in the index.
  struct tag_list {
    std::uint64_t tag = 0;
    std::uint32_t head = npos;
    std::uint32_t tail = npos;
    size_class_index free;
  };
  // A granule: the mapping that holds its memory.
  struct granule_state {
    std::uint32_t mapping = npos;
  };
  // A mapping: a run of granules backed by one physical allocation. `used` counts the live slices
  // that overlap it; a mapping with none is on the free list (oldest first).
  struct mapping_state {
    std::uint64_t first = 0;  // granule index
    std::uint64_t count = 0;  // granules
    std::uint64_t used = 0;
    std::uint64_t stamp = 0;  // the map_granules call that made it
    std::uint32_t older = npos;
    std::uint32_t newer = npos;
    bool listed = false;
    bool in_use_slot = false;
    // Unmapped, but its granules still name it: on a device whose unmaps complete later (behind
    // the streams' work), memory is mapped there again only with exactly these bounds, which the
    // device can revive without waiting for the pending unmap. Never set for a mapping unmapped
    // at once because every stream had passed its memory (stream_order::frees_fenced).
    bool ghost = false;
    // Unmapped by `sleep` while slices use it (`used` > 0): not mapped, not listed, never a ghost;
    // mapped again with these bounds by `wake`, forgotten when its last slice goes.
    bool asleep = false;
  };

  result<void> reserve_range(pool_context& ctx);
  /// The best fitting free slice for a reserve on `tag` (its own tagged slices or untagged ones),
  /// or npos.
  std::uint32_t best_fit(std::uint64_t extent, std::uint64_t tag);
  /// Whether a slice of `extent` bytes at `at` maps fewer granules than at `than`, or as many with
  /// a placement_cost no higher (no more free mappings under it).
  [[nodiscard]] bool costs_no_more(std::uint64_t at, std::uint64_t than, std::uint64_t extent) const noexcept;
  /// The granules without memory (ghosts included) under a slice of `extent` bytes at `offset`,
  /// the granules past those the arena tracks included.
  [[nodiscard]] std::uint64_t missing_under(std::uint64_t offset, std::uint64_t extent) const noexcept;
  /// Takes `extent` bytes of the free slice `slot` (tagged or not) for a new live slice; returns
  /// its descriptor.
  detail::descriptor* take(pool_context& ctx, std::uint32_t slot, std::uint64_t extent, std::uint64_t size);
  /// Takes the last `extent` bytes of the free slice `slot`, free for all and not the arena's
  /// free end, for a new live slice; returns its descriptor.
  detail::descriptor* take_back(pool_context& ctx, std::uint32_t slot, std::uint64_t extent, std::uint64_t size);
  /// Where a slice would add the fewest granules to the memory the arena must hold: granules to
  /// map, and free mappings it would keep from being unmapped (each with all its granules).
  struct placement {
    std::uint32_t slot = npos;  // a free slice free for all
    std::uint64_t offset = 0;   // its first byte (the front) or its last `extent` bytes (the back)
    std::uint64_t cost = 0;     // granules
  };
  /// The granules a slice of `extent` bytes at `offset` adds (see placement).
  [[nodiscard]] std::uint64_t placement_cost(std::uint64_t offset, std::uint64_t extent) const noexcept;
  /// Near the memory limit: the cheapest placement of `extent` bytes at the front or the back of
  /// a free slice free for all, the smaller slice among equals (a walk over the free slices that
  /// fit; it runs only where the best fit would map memory near the limit, or the device refused).
  [[nodiscard]] placement frugal_fit(std::uint64_t extent) const noexcept;
  /// Gives the new live slice `self` its descriptor and counts it.
  detail::descriptor* place(pool_context& ctx, std::uint32_t self, std::uint64_t size);
  /// Frees the untagged slot `slot` (not in an index) into the index, merged with its untagged
  /// free neighbours; returns the surviving slot.
  std::uint32_t merge_into_index(std::uint32_t slot);
  /// Sets the extent of the indexed free slice `slot`, moving it in the index if its class changes.
  void resize_free(std::uint32_t slot, std::uint64_t extent);
  /// Puts a free slice into (takes it out of) the index of its tag.
  void index_insert(std::uint32_t slot);
  void index_erase(std::uint32_t slot);
  [[nodiscard]] std::size_t indexed_count() const noexcept;
  [[nodiscard]] std::uint64_t granule_of(std::uint64_t offset) const noexcept {
    return granule_shift_ != 0 ? offset >> granule_shift_ : offset / granule_;
  }
  /// Merges free slot `slot` with its free neighbours of the same tag (out of the tree and the tag
  /// lists, mappings no longer counted for tagged ones); returns the surviving slot.
  std::uint32_t merge_free(std::uint32_t slot);
  /// Frees the tagged slice `slot` for every stream.
  void untag(pool_context& ctx, std::uint32_t slot);
  tag_list& list_of(std::uint64_t tag);
  tag_list* find_list(std::uint64_t tag) noexcept;
  void tag_append(std::uint32_t slot);
  void tag_insert_after(std::uint32_t at, std::uint32_t slot);
  void tag_unlink(std::uint32_t slot);
  /// One more (or one less) live or tagged slice on each mapping under slice `s`.
  void use_mappings(const slice_node& s);
  void unuse_mappings(const slice_node& s);
  std::uint32_t new_slot();
  void free_slot(std::uint32_t slot);
  /// Maps the granules of [first, last] that have no memory, as mappings (see above). On failure
  /// nothing this call mapped is left.
  result<void> map_granules(pool_context& ctx, std::uint64_t first, std::uint64_t last, bool shared_tail,
                            std::uint64_t cut, std::uint64_t size);
  /// Granule states exist for the first `count` granules.
  void cover_granules(std::uint64_t count) {
    if (count > granules_.size()) grow_granules(count);
  }
  void grow_granules(std::uint64_t count);
  /// Granules of [first, last] without memory: those no mapping covers, and with `ghosts` those
  /// whose unmap is in flight (a map revives them; without `ghosts` they are not counted, since a
  /// revived ghost takes no new memory).
  [[nodiscard]] std::uint64_t count_missing(std::uint64_t first, std::uint64_t last, bool ghosts = true) const noexcept;
  /// `grow`: granules the memory mapped may reach with a new live slice of `size` bytes
  /// (`per_mille` / 1000 of the peak of live bytes), and the mapping unit where the arena grows
  /// (a power of two of granules within 1/grow_share of the memory mapped, up to `grow`).
  [[nodiscard]] std::uint64_t budget_granules(std::uint64_t size, std::uint64_t per_mille) const noexcept;
  [[nodiscard]] std::uint64_t grow_unit() const noexcept;
  /// Near a memory limit: the largest mapping, a power of two of granules within 1/limit_share
  /// of the limit (at least one granule, at most `grow` or the chunk).
  [[nodiscard]] std::uint64_t limit_unit(const pool_context& ctx) const noexcept;
  // Measured on 36 traces (BENCHMARKS.md, "Smaller mappings near a memory limit") capped at 1.05
  // times their peak of live bytes: 1/64 completes every one but the growing caches (4-8 failed
  // reserves each, 14-21 before), in 25% more maps than mappings of up to a chunk; 1/32 leaves
  // odd_sizes_limit failing and the caches at 10 each. 1/128 also completes PyTorch's llama_gen
  // and nine synthetic traces that failed one reserve each at 1/64, in 15% more maps over 72
  // traces (BENCHMARKS.md, "Mappings of 1/128 of a memory limit").
  static constexpr std::uint64_t limit_share = 128;
  /// Granules this arena may have mapped under the device's memory limit (what the other pools
  /// hold subtracted); no_limit without one.
  [[nodiscard]] std::uint64_t limit_granules(const pool_context& ctx) const;
  static constexpr std::uint64_t no_limit = ~std::uint64_t{0};
  // Measured on the six traces (BENCHMARKS.md): free memory stays mapped within 1.04 times the
  // peak of live bytes, mapping ahead stops at 1.01 times it, a mapping ahead is at most 1/32 of
  // the memory mapped, and a run of fewer than 4 granules keeps its last granule. Far from the
  // device's budget (pool_context::roomy), measured on the same traces and llama_serve and
  // gpt2_train against the fastest peer's memory: within 1.15 times, ahead to 1.10 times but at
  // most 128 MiB at once (a model's weights, loaded in a burst and never freed, must not leave a
  // tenth of their size mapped for nothing), in mappings of up to `grow`.
  static constexpr std::uint64_t budget_per_mille = 1040;
  static constexpr std::uint64_t ahead_per_mille = 1010;
  static constexpr std::uint64_t roomy_per_mille = 1100;
  static constexpr std::uint64_t roomy_ahead_per_mille = 1100;
  static constexpr std::uint64_t roomy_ahead_bytes = std::uint64_t{128} << 20;
  // Far from the budget, a mapping ahead is also at most what the slice raises the peak of live
  // bytes by, but never less than this. Measured on PyTorch's llama_gen under devrt (its last
  // prefill's logits raise the peak by 70 MiB and had left 124 MiB mapped ahead for nothing):
  // 1.064 times its peak of live bytes instead of 1.098, below expandable segments' 1.073. The
  // recorded traces map 9-31% more often, and no peak rises by more than 0.3% (BENCHMARKS.md,
  // "Mapping ahead no further than the peak rises"). At 32 MiB they map up to 64% more often; at
  // 96 MiB llama_gen holds 1.081 times.
  static constexpr std::uint64_t roomy_ahead_min_bytes = std::uint64_t{64} << 20;
  // Far from the budget, a slice that maps at least this many units of the arena's growth maps
  // nothing ahead (measured on PyTorch's gpt2_train under devrt: its last 3 GB buffer had left
  // 56 MiB mapped ahead, the peak 0.06% above expandable segments'; with this rule 0.17% below,
  // in 159 maps instead of 149).
  static constexpr std::uint64_t big_slice_units = 4;
  static constexpr std::uint64_t grow_share = 32;
  static constexpr std::uint64_t short_run = 4;
  // Remapping churn far from the budget: when the bytes unmapped to make room within a window of
  // churn_window reserves reach churn_per_mille / 1000 of the peak of live bytes, the share of
  // free memory kept rises by a step, up to max_share_per_mille; after churn_quiet reserves
  // without such an unmap it falls back by half a step, down to roomy_per_mille. Measured
  // (BENCHMARKS.md): 1 GiB and 3 GiB buffers in turn, two live, made 10,088 maps in 2,000 events
  // at 1.10x; the main job's windows stay under 0.35 of its peak, PyTorch's bert_infer under 1.07.
  static constexpr std::uint64_t churn_window = 64;
  static constexpr std::uint64_t churn_per_mille = 2000;
  static constexpr std::uint64_t churn_quiet = 4096;
  static constexpr std::uint64_t churn_step_per_mille = 100;
  static constexpr std::uint64_t max_share_per_mille = 2000;
  /// Counts `unmapped` bytes unmapped far from the budget to make room, and raises the share on churn.
  void note_churn(std::uint64_t unmapped);
  /// Unmaps free mappings, largest first, until at most `limit` granules are mapped or none is free.
  void evict_to(pool_context& ctx, std::uint64_t limit);
  result<void> map_run(pool_context& ctx, std::uint64_t first, std::uint64_t count);
  /// Maps a ghost mapping again, with its bounds.
  // Forgets every ghost once no unmap is in flight on the device (storage::unmaps_in_flight; kept
  // physical memory and queued pages do not count, their addresses are unmapped): its granules
  // may be mapped with any bounds again, as on a device that unmaps at once.
  void drop_ghosts(pool_context& ctx);
  // Before memory is mapped: push_unmaps, then drop_ghosts.
  void settle_unmaps(pool_context& ctx);
  result<void> revive(pool_context& ctx, std::uint32_t m);
  [[nodiscard]] bool mapped_at(std::uint64_t g) const noexcept {
    return granules_[g].mapping != npos && !mappings_[granules_[g].mapping].ghost &&
           !mappings_[granules_[g].mapping].asleep;
  }
  void unmap_mapping(pool_context& ctx, std::uint32_t m);
  void push_free(std::uint32_t m);
  /// Puts every mapping over granules [first, last] that no slice uses on the free list.
  void list_unused(std::uint64_t first, std::uint64_t last);
  void unlink_free(std::uint32_t m);
  /// Unmaps free mappings, oldest first, until `count` granules were given back or none is left.
  void evict(pool_context& ctx, std::uint64_t count);
  /// Unmaps the oldest free mappings until the free ones hold at most `limit` bytes.
  void trim(pool_context& ctx, std::uint64_t limit);
  [[nodiscard]] location loc_of(std::uint32_t slot) const noexcept { return location{index_, 0, slot, true}; }

  pool_options opts_;
  std::uint64_t alignment_;
  std::uint64_t granule_;
  std::uint64_t space_;
  std::uint64_t max_alloc_;
  std::uint64_t chunk_;            // granules: mappings end at multiples of it
  std::uint64_t grow_ = 0;         // granules: the largest mapping where the arena grows (0: no growth policy)
  std::uint64_t peak_live_ = 0;    // the peak of bytes in use
  std::uint64_t peak_mapped_ = 0;  // the most granules mapped at once (since the last explicit cleanup)
  // Remapping churn far from the budget (see note_churn): bytes unmapped to make room within the
  // current window of churn_window reserves, the window's first reserve, the share of the peak of
  // live bytes that free mappings are kept within (roomy_per_mille .. max_share_per_mille), and the
  // reserve of the last window that unmapped anything.
  std::uint64_t reserves_ = 0;
  std::uint64_t churn_bytes_ = 0;
  std::uint64_t churn_window_start_ = 0;
  std::uint64_t share_per_mille_ = roomy_per_mille;
  std::uint64_t last_churn_ = 0;
  std::uint32_t tail_ = npos;  // the last slice of the range (its free end, unless full)
  // Bytes: the end of the highest slice placed since the range was reserved or the last explicit
  // cleanup (best_fit's free end below it). Invariant: no live slice ends above it.
  std::uint64_t high_water_ = 0;
  std::uint16_t index_;
  storage_id range_ = 0;
  std::uintptr_t base_ = 0;  // the range's first address (0: the device gives none)
  bool base_known_ = false;
  unsigned granule_shift_ = 0;                             // log2 of the granule when it is a power of two (0: divide)
  slot_table<slice_node, std::vector<slice_node>> slots_;  // nothing holds a node across an acquire
  size_class_index untagged_;                              // the free slices free for every stream
  std::vector<granule_state> granules_;
  slot_table<mapping_state, std::vector<mapping_state>> mappings_;  // indexed on every reserve
  std::uint32_t oldest_free_ = npos;
  std::uint32_t newest_free_ = npos;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> evict_order_;  // evict_to's free mappings and their age (reused)
  std::uint64_t mapped_ = 0;                                          // granules with memory behind them
  std::uint64_t free_mapped_ = 0;                                     // granules of free mappings
  std::uint64_t map_calls_ = 0;
  std::vector<tag_list> tags_;  // one per stream that has tagged free slices (few)
  bool keep_ghosts_ = false;    // the device completes unmaps later (it has queues)
  std::size_t ghosts_ = 0;
  std::vector<std::uint32_t> ghost_list_;  // mappings made ghosts since the last drop_ghosts (some revived since)
  std::size_t tagged_ = 0;
  bool asleep_ = false;
  std::uint64_t sleeping_ = 0;              // granules of the asleep mappings
  std::vector<std::uint32_t> asleep_list_;  // the mappings `sleep` unmapped (some forgotten since)
  memory_usage usage_;
};

}  // namespace devrt::memory
