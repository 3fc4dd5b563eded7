#include "devrt/memory/arena_pool.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <bit>

#include "devrt/memory/slice_links.hpp"
#include "devrt/memory/stream_order.hpp"

namespace devrt::memory {

arena_pool::arena_pool(const pool_options& opts, std::uint64_t alignment, std::uint16_t pool_index)
    : opts_(opts), alignment_(std::max<std::uint64_t>(alignment, 1)), index_(pool_index) {
  granule_ = std::max(align_up(std::max<std::uint64_t>(opts.page_size, 1), alignment_), alignment_);
  space_ = std::max(align_up(opts.max_pool_size.value_or(granule_), granule_), granule_);
  max_alloc_ = std::min(opts.max_alloc_size == 0 ? no_size_limit : opts.max_alloc_size, space_);
  chunk_ = std::max<std::uint64_t>(opts.chunk.value_or(granule_) / granule_, 1);
  if (std::has_single_bit(granule_)) granule_shift_ = static_cast<unsigned>(std::countr_zero(granule_));
  if (opts.grow) grow_ = std::max(chunk_, *opts.grow / granule_);
}

arena_pool::~arena_pool() = default;

inline std::uint32_t arena_pool::new_slot() {
  const std::uint32_t slot = slots_.acquire();
  slots_[slot].self = slot;
  slots_[slot].in_use_slot = true;
  return slot;
}

inline void arena_pool::free_slot(std::uint32_t slot) {
  slots_[slot].in_use_slot = false;
  slots_[slot].desc = nullptr;
  slots_.release(slot);
}

result<void> arena_pool::reserve_range(pool_context& ctx) {
  auto r = ctx.store.reserve_range(space_, granule_);
  // A system short of addresses may refuse the space (the default is four times the device): half
  // and then a quarter of it are asked for, and the arena lives with what it got. A refusal of all
  // three reports the first.
  std::uint64_t space = space_;
  for (int halving = 0; !r && r.code() == errc::out_of_memory && halving < 2; ++halving) {
    space = space / 2 / granule_ * granule_;
    if (space < granule_) break;
    if (auto smaller = ctx.store.reserve_range(space, granule_)) {
      space_ = space;
      max_alloc_ = std::min(max_alloc_, space_);
      r = std::move(smaller);
    }
  }
  if (!r) return std::move(r).err();
  range_ = r->id;
  base_known_ = false;
  keep_ghosts_ = ctx.store.ordered();
  // Granule states grow with the highest address used (see alloc), not with the whole range.
  granules_.clear();
  const std::uint32_t slot = new_slot();
  slots_[slot].offset = 0;
  slots_[slot].extent = space_;
  index_insert(slot);
  tail_ = slot;
  return {};
}

inline void arena_pool::index_insert(std::uint32_t slot) {
  slice_node& s = slots_[slot];
  s.indexed = true;
  if (s.tag == 0) {
    untagged_.insert(slots_, slot);
  } else {
    list_of(s.tag).free.insert(slots_, slot);
  }
}

inline void arena_pool::index_erase(std::uint32_t slot) {
  slice_node& s = slots_[slot];
  s.indexed = false;
  if (s.tag == 0) {
    untagged_.erase(slots_, slot);
  } else {
    list_of(s.tag).free.erase(slots_, slot);
  }
}

std::size_t arena_pool::indexed_count() const noexcept {
  std::size_t n = untagged_.size();
  for (const auto& l : tags_) n += l.free.size();
  return n;
}

inline void arena_pool::push_free(std::uint32_t m) {
  mapping_state& s = mappings_[m];
  s.listed = true;
  s.older = newest_free_;
  s.newer = npos;
  if (newest_free_ != npos) {
    mappings_[newest_free_].newer = m;
  } else {
    oldest_free_ = m;
  }
  newest_free_ = m;
  free_mapped_ += s.count;
}

inline void arena_pool::unlink_free(std::uint32_t m) {
  mapping_state& s = mappings_[m];
  if (s.older != npos) {
    mappings_[s.older].newer = s.newer;
  } else {
    oldest_free_ = s.newer;
  }
  if (s.newer != npos) {
    mappings_[s.newer].older = s.older;
  } else {
    newest_free_ = s.older;
  }
  s.older = npos;
  s.newer = npos;
  s.listed = false;
  free_mapped_ -= s.count;
}

void arena_pool::unmap_mapping(pool_context& ctx, std::uint32_t m) {
  mapping_state& s = mappings_[m];
  // A free mapping whose memory every stream has passed goes back at once: behind busy streams it
  // would otherwise count as memory on its way back beside the mapping that replaces it.
  const bool idle = ctx.order != nullptr && ctx.order->frees_fenced();
  ctx.unmap_memory(range_, s.first * granule_, s.count * granule_, idle);
  mapped_ -= s.count;
  usage_.bytes_reserved -= s.count * granule_;
  if (keep_ghosts_ && !idle) {
    s.ghost = true;
    s.used = 0;
    ++ghosts_;
    ghost_list_.push_back(m);
    if (ghost_list_.size() > 2 * ghosts_ + 64) {
      // Behind a device that stays busy the list would keep entries revived since: rebuild it.
      ghost_list_.clear();
      for (std::uint32_t k = 0; k < mappings_.size(); ++k) {
        if (mappings_[k].in_use_slot && mappings_[k].ghost) ghost_list_.push_back(k);
      }
    }
    return;
  }
  for (std::uint64_t g = s.first; g < s.first + s.count; ++g) granules_[g].mapping = npos;
  s.in_use_slot = false;
  mappings_.release(m);
}

result<void> arena_pool::revive(pool_context& ctx, std::uint32_t m) {
  mapping_state& s = mappings_[m];
  auto r = ctx.map_memory(range_, s.first * granule_, s.count * granule_);
  if (!r) return r;
  s.ghost = false;
  s.used = 0;
  s.stamp = map_calls_;
  --ghosts_;
  mapped_ += s.count;
  usage_.bytes_reserved += s.count * granule_;
  return {};
}

void arena_pool::settle_unmaps(pool_context& ctx) {
  // What was just unmapped reaches the device (an idle one takes it back at once); then, if
  // nothing is on its way back, every unmapped range may be mapped again with any bounds.
  ctx.push_unmaps();
  drop_ghosts(ctx);
}

void arena_pool::drop_ghosts(pool_context& ctx) {
  if (ghosts_ == 0 || ctx.store.unmaps_in_flight() != 0) return;
  for (const std::uint32_t m : ghost_list_) {
    mapping_state& s = mappings_[m];
    if (!s.in_use_slot || !s.ghost) continue;  // revived since (or its slot taken by a newer ghost, listed again)
    for (std::uint64_t g = s.first; g < s.first + s.count; ++g) granules_[g].mapping = npos;
    s.ghost = false;
    s.in_use_slot = false;
    mappings_.release(m);
    --ghosts_;
  }
  ghost_list_.clear();
}

void arena_pool::evict(pool_context& ctx, std::uint64_t count) {
  while (count > 0 && oldest_free_ != npos) {
    const std::uint32_t m = oldest_free_;
    unlink_free(m);
    count -= std::min(count, mappings_[m].count);
    unmap_mapping(ctx, m);
  }
}

void arena_pool::evict_to(pool_context& ctx, std::uint64_t limit) {
  if (mapped_ <= limit || oldest_free_ == npos) return;
  // The largest free mappings first (the oldest among equals): the fewest driver calls for the
  // memory. One pass and one sort, next to the driver calls; nothing joins the list meanwhile.
  evict_order_.clear();
  std::uint32_t age = 0;
  for (std::uint32_t k = oldest_free_; k != npos; k = mappings_[k].newer) evict_order_.push_back({k, age++});
  std::sort(evict_order_.begin(), evict_order_.end(), [&](const auto& a, const auto& b) {
    const std::uint64_t ca = mappings_[a.first].count;
    const std::uint64_t cb = mappings_[b.first].count;
    return ca != cb ? ca > cb : a.second < b.second;
  });
  for (const auto& entry : evict_order_) {
    if (mapped_ <= limit) break;
    unlink_free(entry.first);
    unmap_mapping(ctx, entry.first);
  }
}

std::uint64_t arena_pool::budget_granules(std::uint64_t size, std::uint64_t per_mille) const noexcept {
  const std::uint64_t live = std::max(peak_live_, usage_.bytes_in_use + size);
  return (live / 1000 * per_mille + live % 1000 * per_mille / 1000) / granule_;
}

std::uint64_t arena_pool::limit_granules(const pool_context& ctx) const {
  if (ctx.limit == 0) return no_limit;
  const std::uint64_t held = ctx.held();
  const std::uint64_t own = mapped_ * granule_;
  const std::uint64_t others = held > own ? held - own : 0;
  return ctx.limit > others ? (ctx.limit - others) / granule_ : 0;
}

std::uint64_t arena_pool::limit_unit(const pool_context& ctx) const noexcept {
  const std::uint64_t top = std::max(grow_, chunk_);
  std::uint64_t unit = 1;
  while (2 * unit <= top && 2 * unit * granule_ * limit_share <= ctx.limit) unit *= 2;
  return unit;
}

std::uint64_t arena_pool::grow_unit() const noexcept {
  std::uint64_t unit = 1;
  while (2 * unit <= grow_ && 2 * unit * grow_share <= mapped_) unit *= 2;
  return unit;
}

void arena_pool::grow_granules(std::uint64_t count) {
  // Past the highest address used so far: grow the granule states (amortized, at most once per
  // doubling; the steady state allocates nothing).
  const std::uint64_t total = space_ / granule_;
  granules_.resize(std::min(total, std::max<std::uint64_t>(count, 2 * granules_.size())));
}

inline std::uint64_t arena_pool::count_missing(std::uint64_t first, std::uint64_t last, bool ghosts) const noexcept {
  std::uint64_t missing = 0;
  for (std::uint64_t g = first; g <= last;) {
    const std::uint32_t m = granules_[g].mapping;
    if (m == npos || (ghosts && mappings_[m].ghost)) {
      ++missing;
      ++g;
      continue;
    }
    g = mappings_[m].first + mappings_[m].count;
  }
  return missing;
}

void arena_pool::trim(pool_context& ctx, std::uint64_t limit) {
  while (oldest_free_ != npos && free_mapped_ * granule_ > limit) {
    const std::uint32_t m = oldest_free_;
    unlink_free(m);
    unmap_mapping(ctx, m);
  }
}

result<void> arena_pool::map_run(pool_context& ctx, std::uint64_t first, std::uint64_t count) {
  auto r = ctx.map_memory(range_, first * granule_, count * granule_);
  if (!r) return r;
  const std::uint32_t m = mappings_.acquire();
  mappings_[m] = mapping_state{first, count, 0, map_calls_, npos, npos, false, true};
  for (std::uint64_t g = first; g < first + count; ++g) granules_[g].mapping = m;
  mapped_ += count;
  usage_.bytes_reserved += count * granule_;
  return {};
}

result<void> arena_pool::map_granules(pool_context& ctx, std::uint64_t first, std::uint64_t last, bool shared_tail,
                                      std::uint64_t cut, std::uint64_t size) {
  ++map_calls_;
  std::uint64_t g = first;
  while (g <= last) {
    result<void> r;
    std::uint64_t end = g + 1;
    if (const std::uint32_t m = granules_[g].mapping; m != npos) {
      if (!mappings_[m].ghost) {
        ++g;
        continue;
      }
      r = revive(ctx, m);  // exactly the bounds it had: the device may still be unmapping them
      end = mappings_[m].first + mappings_[m].count;
    } else {
      while (end <= last && granules_[end].mapping == npos) ++end;
    }
    if (r && granules_[g].mapping == npos) {
      // With `grow`, a short run keeps its last granule: it pins little memory, and saves a call.
      const std::uint64_t run_start = std::max(g, last / cut * cut);
      const bool apart = shared_tail && end == last + 1 && (grow_ == 0 || last - run_start >= short_run);
      const std::uint64_t whole_end = apart ? last : end;
      // Mappings end at multiples of the chunk, so that a mapping a later slice partly reuses holds
      // at most a chunk of free memory that cannot be unmapped.
      for (std::uint64_t at = g; r && at < whole_end;) {
        const std::uint64_t stop = std::min(whole_end, (at / cut + 1) * cut);
        r = map_run(ctx, at, stop - at);
        at = stop;
      }
      if (r && whole_end != end) r = map_run(ctx, last, 1);
    }
    if (!r) {
      // Give back what this call mapped: none of it was used.
      std::uint64_t given_back = 0;
      for (std::uint64_t k = first; k <= last; ++k) {
        const std::uint32_t m = granules_[k].mapping;
        if (m != npos && !mappings_[m].ghost && mappings_[m].stamp == map_calls_) {
          given_back += mappings_[m].count * granule_;
          unmap_mapping(ctx, m);
        }
      }
      error e = std::move(r).err();
      e.size = size;
      // What the device holds now: what it held when it refused (queued frees of other pools
      // included), less the mappings this call gave back.
      e.in_use = e.in_use > given_back ? e.in_use - given_back : 0;
      return e;
    }
    g = end;
  }
  return {};
}

inline std::uint64_t arena_pool::missing_under(std::uint64_t offset, std::uint64_t extent) const noexcept {
  const std::uint64_t first = granule_of(offset);
  const std::uint64_t last = granule_of(offset + extent - 1);
  if (first >= granules_.size()) return last - first + 1;
  if (last >= granules_.size()) return count_missing(first, granules_.size() - 1) + (last + 1 - granules_.size());
  return count_missing(first, last);
}

bool arena_pool::costs_no_more(std::uint64_t at, std::uint64_t than, std::uint64_t extent) const noexcept {
  const std::uint64_t here = missing_under(at, extent);
  const std::uint64_t there = missing_under(than, extent);
  return here < there || (here == there && placement_cost(at, extent) <= placement_cost(than, extent));
}

inline std::uint32_t arena_pool::best_fit(std::uint64_t extent, std::uint64_t tag) {
  std::uint32_t best = npos;
  if (tag != 0 && tagged_ > 0) {
    if (const tag_list* l = find_list(tag)) best = l->free.best_fit(slots_, extent);
  }
  const std::uint32_t any = untagged_.best_fit(slots_, extent);
  // A stream's own slice wins a tie: memory other streams may not take stays in use.
  if (any != npos && (best == npos || slots_[any].extent < slots_[best].extent)) best = any;
  // The free end below the highest address used so far competes as a hole of that size for slices
  // larger than a granule, as a free block at the end of the address range would in a plain best
  // fit: a slice that fits there tighter than in the smallest hole leaves that hole whole for the
  // next slice of its size, which would otherwise raise the high-water mark (a layer's long-lived
  // output taking the front of the hole its short-lived input left, the next layer's input then
  // mapped past the top). Slices of a granule or less keep to the holes, so that many small ones do
  // not scatter over the free end where large slices grow. The free end wins only where it maps no
  // more granules than the hole would (and, with as many, no more free mappings): its part below
  // the mark is often unmapped and the hole mapped, and a map it adds is a driver call, and near a
  // memory limit memory that the hole had ready.
  if (extent > granule_ && tail_ != npos && slots_[tail_].free && slots_[tail_].tag == 0 &&
      slots_[tail_].offset < high_water_) {
    const std::uint64_t below = high_water_ - slots_[tail_].offset;
    if (below >= extent &&
        (best == npos || best == tail_ ||
         (below < slots_[best].extent && costs_no_more(slots_[tail_].offset, slots_[best].offset, extent))))
      best = tail_;
  }
  return best;
}

void arena_pool::note_churn(std::uint64_t unmapped) {
  if (reserves_ - churn_window_start_ >= churn_window) {
    churn_window_start_ = reserves_;
    churn_bytes_ = 0;
  }
  if (unmapped == 0) return;
  // After a long quiet the share falls back a half step at the next unmap to make room.
  if (reserves_ - last_churn_ >= churn_quiet && share_per_mille_ > roomy_per_mille) {
    share_per_mille_ = std::max(roomy_per_mille, share_per_mille_ - churn_step_per_mille / 2);
  }
  last_churn_ = reserves_;
  churn_bytes_ += unmapped;
  if (churn_bytes_ / 1000 >= peak_live_ / 1000 * churn_per_mille / 1000 && share_per_mille_ < max_share_per_mille) {
    // Within one window more was unmapped to make room than twice the peak of live bytes: the
    // workload cycles over more memory than the share keeps mapped, and each reserve unmaps what
    // the next maps again. Keep more.
    share_per_mille_ = std::min(max_share_per_mille, share_per_mille_ + churn_step_per_mille);
    churn_bytes_ = 0;
    churn_window_start_ = reserves_;
  }
}

result<detail::descriptor*> arena_pool::alloc(pool_context& ctx, std::uint64_t size) {
  if (range_ == 0) {
    if (auto r = reserve_range(ctx); !r) return std::move(r).err();
  }
  const std::uint64_t extent = slice_extent(size, alignment_);
  ++reserves_;
  // Set once the device refused a placement that another would beat: the next one goes where the
  // slice adds the fewest granules.
  bool frugal = false;
  for (bool harvested = false;; harvested = true) {
    std::uint32_t found = best_fit(extent, ctx.reserve_tag);
    if (found == npos) {
      // Memory freed on other streams may be free for all by now.
      if (!harvested && reuse_fenced(ctx)) continue;
      error e = error::make(errc::pool_capacity_exceeded, "no hole in the arena's address range is large enough");
      e.size = size;
      e.limit = space_;
      e.in_use = usage_.bytes_in_use;
      return e;
    }
    if (slots_[found].tag != 0) {
      // Freed on this very stream: stream order makes it safe at once, and its memory is mapped.
      return take(ctx, found, extent, size);
    }
    std::uint64_t at = slots_[found].offset;  // the slice's first byte: the front of the free slice
    std::uint64_t first = granule_of(at);
    std::uint64_t last = granule_of(at + extent - 1);
    cover_granules(last + 1);
    std::uint64_t missing = count_missing(first, last);
    // Every granule mapped (the steady state): take() counts the slice on its mappings.
    if (missing == 0) return take(ctx, found, extent, size);
    // New memory would be mapped: first let memory freed on any stream join the free space if
    // its fence has passed (queried, never waited for), and look again.
    if (!harvested && reuse_fenced(ctx)) continue;
    const std::uint64_t cap = limit_granules(ctx);
    // Under a memory limit and near it, or once the device refused memory, the slice goes where
    // it adds the fewest granules (often mapped free memory that the best fit passed over for a
    // smaller hole): each granule it spares is one the limit keeps for later reserves, and one map
    // fewer. Far from the budget the best fit keeps the holes few.
    if (frugal || (cap != no_limit && !ctx.roomy(missing * granule_))) {
      const placement p = frugal_fit(extent);
      if (p.slot != npos && p.cost < placement_cost(at, extent)) {
        found = p.slot;
        at = p.offset;
        first = granule_of(at);
        last = granule_of(at + extent - 1);
        cover_granules(last + 1);
        missing = count_missing(first, last);
        if (missing == 0)
          return at == slots_[found].offset ? take(ctx, found, extent, size) : take_back(ctx, found, extent, size);
      }
    }
    const slice_node& s = slots_[found];
    std::uint64_t ahead_last = last;  // the last granule mapped ahead of the slice (last: none)
    // Free mappings under the slice leave the free list: they are about to be used, and must not
    // be the ones unmapped to make room.
    for (std::uint64_t g = first; g <= last;) {
      const std::uint32_t m = granules_[g].mapping;
      if (m == npos || mappings_[m].ghost) {
        ++g;
        continue;
      }
      if (mappings_[m].listed) unlink_free(m);
      g = mappings_[m].first + mappings_[m].count;
    }
    // Memory to map: first give back free memory elsewhere so that the memory held does not grow
    // while free memory sits in holes: as much as is mapped (oldest first), or, with `grow`, what
    // would pass the budget (largest first).
    if (missing > 0) {
      // The last granule gets a mapping of its own when the slice ends inside it: a neighbour
      // placed after the slice may share it, and must not keep the slice's other granules mapped.
      const std::uint64_t slice_end = at + extent;
      bool shared_tail = (granule_shift_ != 0 ? slice_end & (granule_ - 1) : slice_end % granule_) != 0;
      std::uint64_t map_last = last;
      std::uint64_t cut = chunk_;
      // Under a memory limit, free mappings give way first (largest first) so that the new ones
      // fit; what the other pools hold counts too.
      if (cap != no_limit) evict_to(ctx, cap > missing ? cap - missing : 0);
      // Near a memory limit, mappings stay small next to it: a device unmaps whole mappings only,
      // so one that a live slice pins keeps its free part mapped for good, and a workload capped
      // just above its peak has no room for such memory (0: no such bound).
      const std::uint64_t fine = cap != no_limit && !ctx.roomy((missing + grow_) * granule_) ? limit_unit(ctx) : 0;
      if (fine != 0) cut = std::min(cut, fine);
      if (grow_ == 0) {
        evict(ctx, missing);
        settle_unmaps(ctx);
      } else {
        // Far from the device's budget, free memory stays mapped up to a looser share of the
        // peak of live bytes and the arena grows in its largest unit: fewer maps, and no unmap
        // that a later map undoes. Near it, the tight shares.
        const bool roomy = ctx.roomy((missing + grow_) * granule_);
        // Far from it, the most the arena has held was needed once and may be again: free mappings
        // also stay while the memory mapped stays within that peak, so that a map unmaps only where
        // it would otherwise raise the peak.
        std::uint64_t budget = budget_granules(size, roomy ? share_per_mille_ : budget_per_mille);
        if (roomy) budget = std::max(budget, peak_mapped_);
        // Behind a device still busy with earlier unmaps, an unmap now lowers nothing before the
        // work queued has passed, and the next map at those addresses revives it (two calls for
        // nothing) or maps beside it: far from the budget, free mappings stay until it caught up.
        if (!roomy || !keep_ghosts_ || ctx.store.unmaps_in_flight() == 0) {
          const std::uint64_t before = mapped_;
          evict_to(ctx, budget > missing ? budget - missing : 0);
          if (roomy) note_churn((before - mapped_) * granule_);
        }
        settle_unmaps(ctx);
        if (found == tail_) {
          // Where the arena grows, map ahead into its free end, in units that grow with the memory
          // mapped, over granules never mapped, within a tighter budget: memory mapped ahead that
          // small long-lived slices pin later cannot be unmapped, so it must not use the headroom
          // that mappings elsewhere need.
          // Far from the budget, mappings of up to `grow`, but at most a quarter of what is left
          // below roomy_below: a large mapping that a small live slice pins later keeps its free
          // part mapped, and near the budget that memory is wanted.
          const std::uint64_t headroom =
              roomy ? (ctx.roomy_below - std::min(ctx.roomy_below, ctx.held())) / granule_ / 4 : 0;
          std::uint64_t unit = roomy ? grow_ : grow_unit();
          // Near a limit, a mapping ahead is no larger than the slice that grows the arena either:
          // slices of one size, every other one freed, then leave no mapping that a live
          // neighbour pins.
          if (fine != 0) unit = std::min({unit, fine, std::max<std::uint64_t>(1, std::bit_floor(extent / granule_))});
          if (roomy) {
            while (unit > 1 && unit > headroom) unit /= 2;
          }
          const std::uint64_t ahead = budget_granules(size, roomy ? roomy_ahead_per_mille : ahead_per_mille);
          std::uint64_t room = ahead > mapped_ + missing ? ahead - mapped_ - missing : 0;
          if (roomy) {
            // A mapping ahead is memory for growth still to come: at most what this slice raises
            // the peak of live bytes by, and at least roomy_ahead_min_bytes. A workload whose last
            // burst raises the peak a little (a prefill's logits) then leaves little mapped for
            // nothing, and a model loading buffer after buffer still maps far ahead.
            const std::uint64_t now = usage_.bytes_in_use + size;
            const std::uint64_t rise = now > peak_live_ ? (now - peak_live_ + granule_ - 1) / granule_ : 0;
            const std::uint64_t most = std::max<std::uint64_t>(1, roomy_ahead_bytes / granule_);
            const std::uint64_t least = std::max<std::uint64_t>(1, roomy_ahead_min_bytes / granule_);
            room = std::min({room, most, std::max(least, rise), headroom});
          }
          if (cap != no_limit) room = std::min(room, cap > mapped_ + missing ? cap - mapped_ - missing : 0);
          const std::uint64_t end = std::min(
              {(last / unit + 1) * unit, last + 1 + room, granule_of(s.offset + s.extent - 1) + 1, space_ / granule_});
          cover_granules(end);
          // Far from the budget, a slice that maps big_slice_units units or more itself gets no
          // mapping ahead, only its own mappings in units: they are most of its cost, a mapping
          // ahead would save one later call at most, and where a growth ends (a model's last large
          // buffers) it would stay mapped for nothing.
          const bool big = roomy && missing >= big_slice_units * unit;
          if (big) cut = unit;
          std::uint64_t e = last + 1;
          while (!big && e < end && granules_[e].mapping == npos) ++e;
          if (e > last + 1) {
            map_last = e - 1;
            cut = unit;
            shared_tail = false;
          }
        }
      }
      // Under a memory limit, a slice whose new memory cannot fit maps nothing: a partial map
      // would be given back at once (driver calls for nothing, and memory on its way back that the
      // reclaim after this refusal would wait for). Ghosts revived cost nothing new.
      result<void> r = cap != no_limit && !ctx.within_limit(count_missing(first, last, false) * granule_, true)
                           ? result<void>(ctx.over_limit(size))
                           : map_granules(ctx, first, map_last, shared_tail, cut, size);
      if (!r) {
        // The free mappings taken off the list go back on it.
        list_unused(first, last);
        // Refused: once more if a placement elsewhere adds fewer granules.
        if (!frugal && r.code() == errc::out_of_memory) {
          const placement p = frugal_fit(extent);
          if (p.slot != npos && p.cost < placement_cost(at, extent)) {
            frugal = true;
            continue;
          }
        }
        if (opts_.slack) trim(ctx, *opts_.slack);
        return std::move(r).err();
      }
      ahead_last = map_last;
      peak_mapped_ = std::max(peak_mapped_, mapped_);
    }
    detail::descriptor* d =
        at == slots_[found].offset ? take(ctx, found, extent, size) : take_back(ctx, found, extent, size);
    // Where the slice's last granule was mapped already, what was mapped ahead of it is a mapping
    // of its own that no slice uses: free, so on the free list.
    if (ahead_last > last) list_unused(last + 1, ahead_last);
    return d;
  }
}

void arena_pool::list_unused(std::uint64_t first, std::uint64_t last) {
  for (std::uint64_t g = first; g <= last;) {
    const std::uint32_t m = granules_[g].mapping;
    if (m == npos || mappings_[m].ghost) {
      ++g;
      continue;
    }
    if (mappings_[m].used == 0 && !mappings_[m].listed) push_free(m);
    g = mappings_[m].first + mappings_[m].count;
  }
}

std::uint64_t arena_pool::placement_cost(std::uint64_t offset, std::uint64_t extent) const noexcept {
  const std::uint64_t last = granule_of(offset + extent - 1);
  std::uint64_t cost = 0;
  for (std::uint64_t g = granule_of(offset); g <= last;) {
    if (g >= granules_.size()) return cost + (last - g + 1);  // never mapped
    const std::uint32_t m = granules_[g].mapping;
    if (m == npos || mappings_[m].ghost) {
      ++cost;
      ++g;
      continue;
    }
    if (mappings_[m].listed) cost += mappings_[m].count;  // free: it could have been unmapped
    g = mappings_[m].first + mappings_[m].count;
  }
  return cost;
}

arena_pool::placement arena_pool::frugal_fit(std::uint64_t extent) const noexcept {
  placement best;
  std::uint64_t best_extent = 0;
  untagged_.for_each_from(slots_, extent, [&](std::uint32_t k) {
    const slice_node& s = slots_[k];
    if (s.extent < extent) return;
    const auto consider = [&](std::uint64_t offset) {
      const std::uint64_t cost = placement_cost(offset, extent);
      if (best.slot == npos || cost < best.cost || (cost == best.cost && s.extent < best_extent)) {
        best = placement{k, offset, cost};
        best_extent = s.extent;
      }
    };
    consider(s.offset);
    // The back: where a live neighbour after the slice holds the granule it ends in. Not at the
    // arena's free end, which runs to the end of the range.
    if (s.extent > extent && k != tail_) consider(s.offset + s.extent - extent);
  });
  return best;
}

inline void arena_pool::resize_free(std::uint32_t slot, std::uint64_t extent) {
  // The index files a slice by its size class: it moves only when the class changes.
  if (size_class_index::class_of(extent) == size_class_index::class_of(slots_[slot].extent)) {
    slots_[slot].extent = extent;
    return;
  }
  index_erase(slot);
  slots_[slot].extent = extent;
  index_insert(slot);
}

detail::descriptor* arena_pool::take(pool_context& ctx, std::uint32_t self, std::uint64_t extent, std::uint64_t size) {
  if (slots_[self].tag == 0 && slots_[self].extent > extent) {
    // Split off the front of a hole free for all: the hole keeps its node (and its place in the
    // index unless its size class changes), the live slice gets a new one.
    const std::uint32_t hole = self;
    self = new_slot();  // may grow the table: references are taken after it
    slice_links::link_before(slots_, hole, self);
    slice_node& h = slots_[hole];
    slice_node& cut = slots_[self];
    cut.offset = h.offset;
    cut.extent = extent;
    h.offset += extent;
    resize_free(hole, h.extent - extent);
    return place(ctx, self, size);
  }
  const bool tagged = slots_[self].tag != 0;
  if (tagged) unuse_mappings(slots_[self]);  // counted again below, as the live slice and the remainder
  index_erase(self);
  std::uint32_t rest_slot = npos;
  if (slots_[self].extent > extent) {
    rest_slot = new_slot();  // may grow the table: references are taken after it
    if (self == tail_) tail_ = rest_slot;
    slice_links::link_after(slots_, self, rest_slot);
    slice_node& cur = slots_[self];
    slice_node& rest = slots_[rest_slot];
    rest.offset = cur.offset + extent;
    rest.extent = cur.extent - extent;
    rest.tag = cur.tag;
    rest.epoch = cur.epoch;
    cur.extent = extent;
    // The remainder keeps the slice's place on its tag list: the list stays in epoch order.
    if (tagged) tag_insert_after(self, rest_slot);
    index_insert(rest_slot);
  }
  if (tagged) {
    tag_unlink(self);
    --tagged_;  // the live part leaves; the remainder (if any) was counted by tag_insert_after
    if (rest_slot != npos) use_mappings(slots_[rest_slot]);
  }
  return place(ctx, self, size);
}

detail::descriptor* arena_pool::take_back(pool_context& ctx, std::uint32_t hole, std::uint64_t extent,
                                          std::uint64_t size) {
  // The free slice keeps its node and its front (and its place in the index unless its size
  // class changes); the live slice gets a new node after it.
  const std::uint32_t self = new_slot();  // may grow the table: references are taken after it
  slice_links::link_after(slots_, hole, self);
  slice_node& h = slots_[hole];
  slice_node& cut = slots_[self];
  cut.offset = h.offset + h.extent - extent;
  cut.extent = extent;
  resize_free(hole, h.extent - extent);
  return place(ctx, self, size);
}

inline detail::descriptor* arena_pool::place(pool_context& ctx, std::uint32_t self, std::uint64_t size) {
  slice_node& live = slots_[self];
  live.tag = 0;
  live.epoch = 0;
  // One more live slice on each mapping under it: one step per mapping, not per granule.
  use_mappings(live);
  live.free = false;
  live.size = size;
  live.cursor = 0;
  live.desc = ctx.attach_new(loc_of(self));
  usage_.number_allocs += 1;
  usage_.bytes_in_use += size;
  peak_live_ = std::max(peak_live_, usage_.bytes_in_use);
  usage_.bytes_padding += live.extent - size;
  high_water_ = std::max(high_water_, live.offset + live.extent);
  ctx.add_in_use(size);
  return live.desc;
}

inline void arena_pool::use_mappings(const slice_node& s) {
  const std::uint64_t first = granule_of(s.offset);
  const std::uint64_t last = granule_of(s.offset + s.extent - 1);
  for (std::uint64_t g = first; g <= last;) {
    mapping_state& m = mappings_[granules_[g].mapping];
    if (m.listed) unlink_free(granules_[g].mapping);
    ++m.used;
    g = m.first + m.count;
  }
}

inline void arena_pool::unuse_mappings(const slice_node& s) {
  const std::uint64_t first = granule_of(s.offset);
  const std::uint64_t last = granule_of(s.offset + s.extent - 1);
  for (std::uint64_t g = first; g <= last;) {
    const std::uint32_t m = granules_[g].mapping;
    mapping_state& ms = mappings_[m];
    g = ms.first + ms.count;
    if (--ms.used != 0) continue;
    if (!ms.asleep) {
      push_free(m);
      continue;
    }
    // Asleep and no longer used: nothing is mapped there, so only the bookkeeping goes.
    sleeping_ -= ms.count;
    for (std::uint64_t k = ms.first; k < ms.first + ms.count; ++k) granules_[k].mapping = npos;
    ms.asleep = false;
    ms.in_use_slot = false;
    mappings_.release(m);
  }
}

void arena_pool::sleep(pool_context& ctx) {
  if (asleep_) return;
  trim(ctx, 0);  // the free mappings go back as in an explicit cleanup
  asleep_list_.clear();
  for (std::uint32_t m = 0; m < mappings_.size(); ++m) {
    mapping_state& s = mappings_[m];
    if (!s.in_use_slot || s.ghost || s.asleep || s.used == 0) continue;
    ctx.unmap_memory(range_, s.first * granule_, s.count * granule_);
    mapped_ -= s.count;
    usage_.bytes_reserved -= s.count * granule_;
    s.asleep = true;
    sleeping_ += s.count;
    asleep_list_.push_back(m);
  }
  asleep_ = true;
}

result<void> arena_pool::wake(pool_context& ctx) {
  if (!asleep_) return {};
  // Where unmaps complete behind queued work, what they left must reach the device first.
  ctx.push_unmaps();
  std::size_t done = 0;
  for (; done < asleep_list_.size(); ++done) {
    const mapping_state& s = mappings_[asleep_list_[done]];
    if (!s.in_use_slot || !s.asleep) continue;  // forgotten while asleep
    if (auto r = ctx.map_memory(range_, s.first * granule_, s.count * granule_); !r) {
      // Back to how it was: what this call mapped is unmapped again.
      for (std::size_t i = 0; i < done; ++i) {
        const mapping_state& u = mappings_[asleep_list_[i]];
        if (u.in_use_slot && u.asleep) ctx.unmap_memory(range_, u.first * granule_, u.count * granule_);
      }
      return r;
    }
  }
  for (const std::uint32_t m : asleep_list_) {
    mapping_state& s = mappings_[m];
    if (!s.in_use_slot || !s.asleep) continue;
    s.asleep = false;
    s.stamp = ++map_calls_;
    mapped_ += s.count;
    usage_.bytes_reserved += s.count * granule_;
  }
  sleeping_ = 0;
  asleep_list_.clear();
  asleep_ = false;
  return {};
}

arena_pool::tag_list* arena_pool::find_list(std::uint64_t tag) noexcept {
  for (auto& l : tags_) {
    if (l.tag == tag) return &l;
  }
  return nullptr;
}

arena_pool::tag_list& arena_pool::list_of(std::uint64_t tag) {
  for (auto& l : tags_) {
    if (l.tag == tag) return l;
  }
  for (auto& l : tags_) {
    if (l.head == npos) {
      l.tag = tag;
      return l;
    }
  }
  tags_.push_back(tag_list{tag, npos, npos, {}});
  return tags_.back();
}

void arena_pool::tag_append(std::uint32_t slot) {
  slice_node& s = slots_[slot];
  tag_list& l = list_of(s.tag);
  s.tag_prev = l.tail;
  s.tag_next = npos;
  if (l.tail != npos) {
    slots_[l.tail].tag_next = slot;
  } else {
    l.head = slot;
  }
  l.tail = slot;
  ++tagged_;
}

void arena_pool::tag_insert_after(std::uint32_t at, std::uint32_t slot) {
  slice_node& a = slots_[at];
  slice_node& s = slots_[slot];
  tag_list& l = list_of(a.tag);
  s.tag_prev = at;
  s.tag_next = a.tag_next;
  if (a.tag_next != npos) {
    slots_[a.tag_next].tag_prev = slot;
  } else {
    l.tail = slot;
  }
  a.tag_next = slot;
  ++tagged_;
}

void arena_pool::tag_unlink(std::uint32_t slot) {
  slice_node& s = slots_[slot];
  tag_list& l = list_of(s.tag);
  if (s.tag_prev != npos) {
    slots_[s.tag_prev].tag_next = s.tag_next;
  } else {
    l.head = s.tag_next;
  }
  if (s.tag_next != npos) {
    slots_[s.tag_next].tag_prev = s.tag_prev;
  } else {
    l.tail = s.tag_prev;
  }
  s.tag_prev = s.tag_next = npos;
}

inline std::uint32_t arena_pool::merge_free(std::uint32_t slot) {
  slice_node* s = &slots_[slot];
  const std::uint64_t tag = s->tag;
  auto absorb = [&](slice_node& n) {
    index_erase(n.self);
    if (tag != 0) {
      tag_unlink(n.self);
      --tagged_;
      unuse_mappings(n);
    }
  };
  if (s->prev != npos && slots_[s->prev].free && slots_[s->prev].tag == tag) {
    slice_node& p = slots_[s->prev];
    absorb(p);
    if (slot == tail_) tail_ = p.self;
    p.extent += s->extent;
    slice_links::unlink(slots_, slot);
    free_slot(slot);
    s = &p;
    slot = p.self;
  }
  if (s->next != npos && slots_[s->next].free && slots_[s->next].tag == tag) {
    slice_node& n = slots_[s->next];
    absorb(n);
    if (n.self == tail_) tail_ = slot;
    s->extent += n.extent;
    const std::uint32_t gone = n.self;
    slice_links::unlink(slots_, gone);
    free_slot(gone);
  }
  return slot;
}

std::uint32_t arena_pool::merge_into_index(std::uint32_t slot) {
  slice_node& s = slots_[slot];
  const std::uint32_t pi = s.prev;
  const std::uint32_t ni = s.next;
  const bool prev_free = pi != npos && slots_[pi].free && slots_[pi].tag == 0;
  const bool next_free = ni != npos && slots_[ni].free && slots_[ni].tag == 0;
  if (!prev_free && !next_free) {
    index_insert(slot);
    return slot;
  }
  if (!prev_free) {
    // The hole after it grows down over it.
    slots_[ni].offset = s.offset;
    const std::uint64_t extent = slots_[ni].extent + s.extent;
    slice_links::unlink(slots_, slot);
    resize_free(ni, extent);
    free_slot(slot);
    return ni;
  }
  // The hole before it grows over it (and over the hole after it).
  std::uint64_t extent = slots_[pi].extent + s.extent;
  if (next_free) {
    index_erase(ni);
    extent += slots_[ni].extent;
    if (ni == tail_) tail_ = pi;
    slice_links::unlink(slots_, ni);
    free_slot(ni);
  }
  if (slot == tail_) tail_ = pi;
  slice_links::unlink(slots_, slot);
  resize_free(pi, extent);
  free_slot(slot);
  return pi;
}

void arena_pool::release(pool_context& ctx, const location& loc, std::uint64_t tag, std::uint64_t epoch) {
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
  // Asleep, the memory is unmapped behind every stream's work queued before the sleep, and no
  // stream may use it until the wake maps new memory there: the free needs no stream's fence.
  if (asleep_) tag = 0;
  s->tag = tag;
  s->epoch = tag == 0 ? 0 : epoch;
  if (tag == 0) {
    unuse_mappings(*s);
    merge_into_index(slot);
  } else {
    // Still counted on its mappings: the stream may be using the memory. The merged slice counts
    // once, with the newest epoch (this free's).
    unuse_mappings(*s);
    slot = merge_free(slot);
    slots_[slot].epoch = epoch;
    use_mappings(slots_[slot]);
    tag_append(slot);
    index_insert(slot);
  }
  if (opts_.slack && tag == 0) trim(ctx, *opts_.slack);
}

void arena_pool::untag(pool_context& ctx, std::uint32_t slot) {
  slice_node& s = slots_[slot];
  index_erase(slot);
  tag_unlink(slot);
  --tagged_;
  unuse_mappings(s);
  s.tag = 0;
  s.epoch = 0;
  merge_into_index(slot);
  (void)ctx;
}

bool arena_pool::reuse_fenced(pool_context& ctx) {
  if (ctx.reuse_streams != nullptr) return ctx.reuse_streams(ctx.reuse_owner);
  return tagged_ > 0 && harvest(ctx, true);
}

std::uint64_t arena_pool::tagged_bytes() const noexcept {
  std::uint64_t n = 0;
  for (const auto& l : tags_) {
    for (std::uint32_t t = l.head; t != npos; t = slots_[t].tag_next) n += slots_[t].extent;
  }
  return n;
}

bool arena_pool::harvest(pool_context& ctx, bool poll) {
  if (tagged_ == 0 || ctx.order == nullptr) return false;
  if (poll) {
    // Memory is wanted now: the streams' fences are checked, and recorded at the end of the batch
    // for what is not fenced yet.
    ctx.order->poll();
    ctx.order->want_fences();
  }
  bool changed = false;
  for (std::size_t i = 0; i < tags_.size(); ++i) {
    const std::uint64_t tag = tags_[i].tag;
    if (tags_[i].head == npos) continue;
    const std::uint64_t done = ctx.order->done(tag);
    // untag may merge list members away, but never the head's successors out of epoch order.
    while (tags_[i].head != npos && slots_[tags_[i].head].epoch <= done) {
      untag(ctx, tags_[i].head);
      changed = true;
    }
  }
  if (changed && opts_.slack) trim(ctx, *opts_.slack);
  return changed;
}

result<slice_view> arena_pool::find(const detail::descriptor* d) const {
  const location& loc = d->loc;
  if (loc.page != 0 || range_ == 0) return error::make(errc::not_found, "the memory page does not exist");
  if (loc.slice >= slots_.size()) return error::make(errc::not_found, "the memory slice does not exist");
  const slice_node& s = slots_[loc.slice];
  if (!s.in_use_slot || s.free || s.desc != d) {
    return error::make(errc::not_found, "the location points to a different allocation");
  }
  return slice_view{storage_handle{range_, s.offset, s.size}, s.extent - s.size, s.cursor};
}

result<void> arena_pool::bind(pool_context& ctx, detail::descriptor* reserved, detail::descriptor* assigned,
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

void arena_pool::cleanup(pool_context& ctx, bool explicit_cleanup) {
  if (!explicit_cleanup) return;
  trim(ctx, 0);
  // Memory given back on request is not taken as needed again.
  peak_mapped_ = mapped_;
  if (tail_ != npos && slots_[tail_].free) high_water_ = std::min(high_water_, slots_[tail_].offset);
}

void arena_pool::release_all(pool_context& ctx) {
  untagged_.clear();
  for (auto& s : slots_) {
    if (s.in_use_slot && !s.free && s.desc != nullptr) {
      ctx.sub_in_use(s.size);
      ctx.detach(s.desc);
      s.desc = nullptr;
    }
  }
  // Unmap every mapping, then give the addresses back.
  for (std::uint32_t m = 0; m < mappings_.size(); ++m) {
    if (mappings_[m].in_use_slot && !mappings_[m].ghost && !mappings_[m].asleep)
      ctx.unmap_memory(range_, mappings_[m].first * granule_, mappings_[m].count * granule_);
  }
  if (range_ != 0) {
    ctx.store.release_range(range_);
    ctx.returns_queued = true;
  }
  range_ = 0;
  tail_ = npos;
  high_water_ = 0;
  peak_live_ = 0;
  peak_mapped_ = 0;
  base_known_ = false;
  slots_.clear();
  granules_.clear();
  mappings_.clear();
  oldest_free_ = newest_free_ = npos;
  mapped_ = free_mapped_ = 0;
  tags_.clear();
  tagged_ = 0;
  ghosts_ = 0;
  ghost_list_.clear();
  asleep_ = false;
  sleeping_ = 0;
  asleep_list_.clear();
  usage_ = memory_usage{};
}

std::string arena_pool::report() const {
  std::uint64_t largest_hole = 0;
  if (const std::uint32_t l = untagged_.largest(slots_); l != npos) largest_hole = slots_[l].extent;
  for (const auto& t : tags_) {
    if (const std::uint32_t l = t.free.largest(slots_); l != npos)
      largest_hole = std::max(largest_hole, slots_[l].extent);
  }
  std::string out = fmt::format(
      "arena pool {}: granule {}, address space {}, free memory kept {}", index_, format_bytes(granule_),
      format_bytes(space_),
      opts_.slack ? "up to " + format_bytes(*opts_.slack)
      : grow_ != 0
          ? std::string("within 1.10x the peak of live bytes (up to 2.00x where the workload "
                        "churns) or the most it held far from the budget, 1.04x near it") +
                (share_per_mille_ != roomy_per_mille ? fmt::format(" (the share far from it now {:.2f}x)",
                                                                   static_cast<double>(share_per_mille_) / 1000.0)
                                                     : std::string())
          : std::string("until needed elsewhere"));
  if (max_alloc_ < space_) out += fmt::format(", max {}", format_bytes(max_alloc_));
  out += fmt::format(
      "; {} live slices, {} in use, {} mapped (at most {} since the last cleanup; {} granules in {} mappings, {} "
      "granules free), {} holes, largest {}\n",
      usage_.number_allocs, format_bytes(usage_.bytes_in_use), format_bytes(usage_.bytes_reserved),
      format_bytes(peak_mapped_ * granule_), mapped_, mapping_count(), free_mapped_, indexed_count(),
      format_bytes(largest_hole));
  return out;
}

void arena_pool::snapshot(storage& store, std::vector<snapshot_segment>& out) const {
  if (range_ == 0 || tail_ == npos) return;
  std::uint32_t k = tail_;
  while (slots_[k].prev != npos) k = slots_[k].prev;
  const std::uint64_t base = snapshot_address(store, range_, 0);
  // Each run of mapped granules is a segment; the slices over it, cut at its ends, its blocks. A
  // live slice lies on mapped granules whole, so only free slices are ever cut.
  std::uint64_t g = 0;
  const std::uint64_t granules = granules_.size();
  while (g < granules) {
    if (!mapped_at(g)) {
      ++g;
      continue;
    }
    std::uint64_t end = g;
    while (end < granules && mapped_at(end)) ++end;
    const std::uint64_t lo = g * granule_;
    const std::uint64_t hi = end * granule_;
    snapshot_segment seg;
    seg.address = base + lo;
    seg.total_size = hi - lo;
    seg.pool = fmt::format("arena {}", index_);
    seg.expandable = true;
    while (k != npos && slots_[k].offset + slots_[k].extent <= lo) k = slots_[k].next;
    for (std::uint32_t j = k; j != npos && slots_[j].offset < hi; j = slots_[j].next) {
      const slice_node& s = slots_[j];
      const std::uint64_t from = std::max(s.offset, lo);
      const std::uint64_t to = std::min(s.offset + s.extent, hi);
      if (s.free) {
        seg.blocks.push_back(snapshot_block{base + from, to - from, 0, block_state::free, streams::none, 0});
      } else {
        seg.blocks.push_back(live_block(base + from, to - from, s.size, s.desc));
      }
    }
    out.push_back(std::move(seg));
    g = end;
  }
}

std::string arena_pool::check_invariants() const {
  if (range_ == 0) {
    if (!slots_.empty() || mapped_ != 0 || !(usage_ == memory_usage{})) {
      return fmt::format("arena {}: state without an address range", index_);
    }
    return {};
  }
  memory_usage sum;
  std::vector<std::uint32_t> live(granules_.size(), 0);
  std::vector<std::uint64_t> slices_on(mappings_.size(), 0);
  std::size_t free_count = 0;
  std::uint64_t expect = 0;
  std::uint32_t prev = npos;
  bool prev_free = false;
  // The first slice is the one without a predecessor; it starts at offset 0.
  std::uint32_t k = npos;
  for (std::uint32_t i = 0; i < slots_.size(); ++i) {
    if (slots_[i].in_use_slot && slots_[i].prev == npos) {
      if (k != npos) return fmt::format("arena {}: two slices without a predecessor", index_);
      k = i;
    }
  }
  std::uint64_t tagged_seen = 0;
  std::uint64_t prev_tag = 0;
  for (; k != npos; k = slots_[k].next) {
    const slice_node& s = slots_[k];
    if (!s.in_use_slot || s.self != k) return fmt::format("arena {}: slot {} is linked but unused", index_, k);
    if (s.prev != prev) return fmt::format("arena {}: slice {} has a broken back link", index_, k);
    if (s.offset != expect) {
      return fmt::format("arena {}: slice {} at offset {} but the previous slice ends at {} (overlap or gap)", index_,
                         k, s.offset, expect);
    }
    if (s.extent == 0 || s.extent % alignment_ != 0) {
      return fmt::format("arena {}: slice {} has extent {}, not a positive multiple of {}", index_, k, s.extent,
                         alignment_);
    }
    if (s.free) {
      if (prev_free && prev_tag == s.tag) {
        return fmt::format("arena {}: two adjacent free slices of one tag not merged at {}", index_, s.offset);
      }
      if (s.desc != nullptr || !s.indexed) {
        return fmt::format("arena {}: free slice {} has a descriptor or is missing from the free index", index_, k);
      }
      ++free_count;
      if (s.tag != 0) ++tagged_seen;
    } else {
      if (s.indexed || s.desc == nullptr) {
        return fmt::format("arena {}: live slice {} is in the free index or has no descriptor", index_, k);
      }
      if ((s.desc->state.load(std::memory_order_acquire) & detail::descriptor::attached_bit) == 0 ||
          s.desc->loc != location{index_, 0, k, true}) {
        return fmt::format("arena {}: descriptor of slice {} is detached or points elsewhere", index_, k);
      }
      if (s.size > s.extent) return fmt::format("arena {}: slice {} size exceeds its extent", index_, k);
      if (s.offset + s.extent > high_water_) {
        return fmt::format("arena {}: live slice {} ends at {}, above the high-water mark {}", index_, k,
                           s.offset + s.extent, high_water_);
      }
      sum.number_allocs += 1;
      sum.bytes_in_use += s.size;
      sum.bytes_padding += s.extent - s.size;
    }
    if (!s.free || s.tag != 0) {
      // Count the live or tagged slice once per mapping it overlaps.
      std::uint32_t last_mapping = npos;
      for (std::uint64_t g = s.offset / granule_; g <= (s.offset + s.extent - 1) / granule_; ++g) {
        ++live[g];
        const std::uint32_t m = g < granules_.size() ? granules_[g].mapping : npos;
        if (m != npos && m != last_mapping && m < slices_on.size()) ++slices_on[m];
        last_mapping = m;
      }
    }
    prev_free = s.free;
    prev_tag = s.tag;
    prev = k;
    expect += s.extent;
  }
  std::uint64_t listed_tagged = 0;
  for (const auto& l : tags_) {
    std::uint32_t before = npos;
    std::uint64_t last_epoch = 0;
    for (std::uint32_t t = l.head; t != npos; t = slots_[t].tag_next) {
      const slice_node& s = slots_[t];
      if (!s.in_use_slot || !s.free || s.tag != l.tag || s.tag_prev != before) {
        return fmt::format("arena {}: the tag list of stream {} is broken at slot {}", index_, l.tag, t);
      }
      if (s.epoch < last_epoch) return fmt::format("arena {}: tag list of stream {} out of epoch order", index_, l.tag);
      last_epoch = s.epoch;
      before = t;
      if (++listed_tagged > slots_.size()) return fmt::format("arena {}: a tag list has a cycle", index_);
    }
    if (l.tail != before) return fmt::format("arena {}: the tag list of stream {} has a wrong tail", index_, l.tag);
  }
  if (tagged_seen != tagged_ || listed_tagged != tagged_) {
    return fmt::format("arena {}: {} tagged free slices, {} listed, counted as {}", index_, tagged_seen, listed_tagged,
                       tagged_);
  }
  if (expect != space_) return fmt::format("arena {}: slices cover {} of {} bytes", index_, expect, space_);
  if (prev != tail_) return fmt::format("arena {}: the last slice is {}, not {}", index_, prev, tail_);
  if (free_count != indexed_count()) {
    return fmt::format("arena {}: {} free slices but {} in the free indexes", index_, free_count, indexed_count());
  }
  // Every index lists exactly the free slices of its tag, each in the class of its extent.
  const auto check_index = [&](const size_class_index& ix, std::uint64_t tag) -> std::string {
    std::size_t seen = 0;
    for (unsigned c = 0; c < size_class_index::class_count; ++c) {
      if ((ix.head(c) != npos) != ix.marked(c))
        return fmt::format("arena {}: size class {} is marked wrongly", index_, c);
      std::uint32_t before = npos;
      for (std::uint32_t t = ix.head(c); t != npos; t = slots_[t].bin_next) {
        const slice_node& s = slots_[t];
        if (!s.in_use_slot || !s.free || !s.indexed || s.tag != tag || s.bin_prev != before ||
            size_class_index::class_of(s.extent) != c) {
          return fmt::format("arena {}: the free index of stream {} is broken at slot {}", index_, tag, t);
        }
        before = t;
        if (++seen > slots_.size()) return fmt::format("arena {}: a free index has a cycle", index_);
      }
    }
    if (seen != ix.size())
      return fmt::format("arena {}: a free index counts {} slices, not {}", index_, ix.size(), seen);
    return {};
  };
  if (auto p = check_index(untagged_, 0); !p.empty()) return p;
  for (const auto& l : tags_) {
    if (auto p = check_index(l.free, l.tag); !p.empty()) return p;
  }
  for (std::uint64_t g = 0; g < granules_.size(); ++g) {
    const granule_state& gs = granules_[g];
    if (live[g] > 0 && (gs.mapping == npos || (gs.mapping < mappings_.size() && mappings_[gs.mapping].ghost))) {
      return fmt::format("arena {}: granule {} is used but not mapped", index_, g);
    }
    if (gs.mapping != npos) {
      if (gs.mapping >= mappings_.size() || !mappings_[gs.mapping].in_use_slot) {
        return fmt::format("arena {}: granule {} names a mapping that does not exist", index_, g);
      }
      const mapping_state& m = mappings_[gs.mapping];
      if (g < m.first || g >= m.first + m.count) {
        return fmt::format("arena {}: granule {} is outside its mapping", index_, g);
      }
    }
  }
  std::uint64_t mapped = 0;
  std::uint64_t free_mapped = 0;
  std::size_t ghosts = 0;
  std::uint64_t asleep_seen = 0;
  for (std::uint32_t mi = 0; mi < mappings_.size(); ++mi) {
    const mapping_state& m = mappings_[mi];
    if (!m.in_use_slot) continue;
    for (std::uint64_t g = m.first; g < m.first + m.count; ++g) {
      if (g >= granules_.size() || granules_[g].mapping != mi) {
        return fmt::format("arena {}: mapping {} does not own its granule {}", index_, mi, g);
      }
    }
    if (m.ghost) {
      if (m.used != 0 || m.listed) return fmt::format("arena {}: ghost mapping {} is used or listed", index_, mi);
      ++ghosts;
      continue;
    }
    const std::uint64_t used = slices_on[mi];
    if (used != m.used)
      return fmt::format("arena {}: mapping {} counts {} live slices, not {}", index_, mi, m.used, used);
    if (m.asleep) {
      if (!asleep_ || m.listed || used == 0)
        return fmt::format("arena {}: asleep mapping {} is listed, unused, or in an awake pool", index_, mi);
      asleep_seen += m.count;
      continue;
    }
    if (m.listed != (used == 0)) {
      return fmt::format("arena {}: mapping {} with {} live slices is {} the free list", index_, mi, used,
                         m.listed ? "on" : "off");
    }
    mapped += m.count;
    if (m.listed) free_mapped += m.count;
  }
  std::uint64_t listed = 0;
  std::uint32_t before = npos;
  for (std::uint32_t mi = oldest_free_; mi != npos; mi = mappings_[mi].newer) {
    if (mappings_[mi].older != before) return fmt::format("arena {}: free mapping list broken at {}", index_, mi);
    if (!mappings_[mi].listed) return fmt::format("arena {}: mapping {} is linked but not listed", index_, k);
    listed += mappings_[mi].count;
    if (listed > mapped) return fmt::format("arena {}: free mapping list has a cycle", index_);
    before = mi;
  }
  if (asleep_seen != sleeping_)
    return fmt::format("arena {}: {} asleep granules counted as {}", index_, asleep_seen, sleeping_);
  if (ghosts != ghosts_) return fmt::format("arena {}: {} ghost mappings counted as {}", index_, ghosts, ghosts_);
  if (mapped != mapped_ || free_mapped != free_mapped_ || listed != free_mapped) {
    return fmt::format("arena {}: {} mapped / {} free granules counted as {} / {} ({} listed)", index_, mapped,
                       free_mapped, mapped_, free_mapped_, listed);
  }
  sum.bytes_reserved = mapped * granule_;
  return usage_mismatch(usage_, sum, fmt::format("arena {}", index_));
}

}  // namespace devrt::memory
