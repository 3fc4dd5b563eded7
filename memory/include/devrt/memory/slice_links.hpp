// The address order of a pool's slices. Every slice of a run of memory (the arena's range, one
// page of a sliced pool) is a node in the pool's slot table that names the slices before and
// after it by slot (`prev`, `next`; npos at the ends), so that a freed slice finds the free
// neighbours it merges with in constant time, and a split puts the remainder next to its slice.
//
// These functions change links only. Offsets and extents are the caller's to set, because a pool
// files free slices by extent in an index (the arena's size classes, the sliced pool's tree) that
// must see a node's old extent when it moves; the slot of a node unlinked here is the caller's to
// give back. Owner thread only, like the pools.
#pragma once

#include <cstdint>

namespace devrt::memory::slice_links {

inline constexpr std::uint32_t npos = 0xffffffffU;

/// Puts `slot` right after `at`.
template <class Nodes>
void link_after(Nodes& nodes, std::uint32_t at, std::uint32_t slot) noexcept {
  auto& a = nodes[at];
  auto& s = nodes[slot];
  s.prev = at;
  s.next = a.next;
  if (a.next != npos) nodes[a.next].prev = slot;
  a.next = slot;
}

/// Puts `slot` right before `at`.
template <class Nodes>
void link_before(Nodes& nodes, std::uint32_t at, std::uint32_t slot) noexcept {
  auto& a = nodes[at];
  auto& s = nodes[slot];
  s.next = at;
  s.prev = a.prev;
  if (a.prev != npos) nodes[a.prev].next = slot;
  a.prev = slot;
}

/// Takes `slot` out of the order: its neighbours name each other.
template <class Nodes>
void unlink(Nodes& nodes, std::uint32_t slot) noexcept {
  auto& s = nodes[slot];
  if (s.prev != npos) nodes[s.prev].next = s.next;
  if (s.next != npos) nodes[s.next].prev = s.prev;
  s.prev = s.next = npos;
}

}  // namespace devrt::memory::slice_links
