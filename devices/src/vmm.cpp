#include "vmm.hpp"

#include <algorithm>

namespace devrt::devices {

vmm::range* vmm::find(memory::storage_id id) noexcept {
  // One range is the common case: remember the last one found.
  if (id == last_id_ && last_ != nullptr) return last_;
  auto it = ranges_.find(id);
  if (it == ranges_.end()) return nullptr;
  last_id_ = id;
  last_ = &it->second;
  return last_;
}

std::uint64_t vmm::base(memory::storage_id id) const noexcept {
  auto it = ranges_.find(id);
  return it == ranges_.end() ? 0 : it->second.base;
}

std::uint64_t vmm::range_size(memory::storage_id id) const noexcept {
  auto it = ranges_.find(id);
  return it == ranges_.end() ? 0 : it->second.size;
}

result<memory::storage_handle> vmm::reserve_range(memory::storage_id id, std::uint64_t size, std::uint64_t unit) {
  if (unit == 0 || unit % granularity_ != 0 || size == 0 || size % unit != 0) {
    error e = error::make(errc::invalid_argument,
                          "an address range is a positive multiple of its unit, and the unit of the granularity");
    e.size = size;
    e.limit = unit;
    return e;
  }
  auto base = driver_.reserve_addresses(size);
  if (!base) {
    error e = std::move(base).err();
    e.size = size;
    return e;
  }
  range r;
  r.base = *base;
  r.size = size;
  r.unit = unit;
  ranges_.emplace(id, std::move(r));
  last_ = nullptr;
  return memory::storage_handle{id, 0, size};
}

bool vmm::covered(memory::storage_id id, std::uint64_t offset, std::uint64_t size) const {
  auto it = ranges_.find(id);
  if (it == ranges_.end()) return false;
  const range& r = it->second;
  const std::uint64_t last = size == 0 ? offset / r.unit : (offset + size - 1) / r.unit;
  std::uint64_t k = offset / r.unit;
  auto m = r.mappings.upper_bound(k);
  if (m == r.mappings.begin()) return false;
  --m;
  while (k <= last) {
    if (m == r.mappings.end() || m->first > k || m->first + m->second.count <= k || m->second.st != state::mapped) {
      return false;
    }
    k = m->first + m->second.count;
    ++m;
  }
  return true;
}

result<void> vmm::map(memory::storage_id id, std::uint64_t offset, std::uint64_t size) {
  range* r = find(id);
  if (r == nullptr) return error::make(errc::not_found, "the address range does not exist");
  if (size == 0 || offset % r->unit != 0 || size % r->unit != 0 || offset > r->size || size > r->size - offset) {
    error e = error::make(errc::invalid_argument, "not whole units inside a reserved address range");
    e.size = offset + size;
    e.limit = r->size;
    return e;
  }
  if (driver_.capturing()) {
    error e = error::make(errc::capture_active, "memory had to be mapped inside a graph capture");
    e.size = size;
    return e;
  }
  // Unmaps whose event passed happen first (their memory is kept for this map).
  if (!batches_.empty()) {
    if (auto c = complete(false, true); !c) return c;
  }
  const std::uint64_t first = offset / r->unit;
  const std::uint64_t count = size / r->unit;
  auto same = r->mappings.find(first);
  if (same != r->mappings.end() && same->second.count == count && same->second.st != state::mapped) {
    // The same mapping again before its unmap happened: it keeps its memory and leaves its batch.
    if (same->second.st == state::unmap_recorded) --recorded_;
    same->second.st = state::mapped;
    same->second.batch = 0;
    --r->in_flight;
    --in_flight_;
    returning_ -= size;
    return {};
  }
  // Every mapping the new one overlaps: mapped is a misuse, an unmap in flight must happen first.
  bool pending = false;
  auto it = r->mappings.upper_bound(first);
  if (it != r->mappings.begin()) {
    auto before = std::prev(it);
    if (before->first + before->second.count > first) it = before;
  }
  for (; it != r->mappings.end() && it->first < first + count; ++it) {
    if (it->second.st == state::mapped) {
      error e = error::make(errc::invalid_argument, "the memory is mapped already");
      e.size = std::max(it->first, first) * r->unit;
      return e;
    }
    pending = true;
  }
  if (pending) {
    // Other bounds over addresses whose unmap has not happened: the device has to reach it first.
    // The arena never asks for this (it maps again exactly what it unmapped); a direct user of the
    // storage waits here, counted.
    if (auto u = record(true); !u) return u;
    if (auto c = complete(true, true); !c) return c;
  }
  // Kept memory of the same size is mapped again at its new address; the rest goes back now,
  // before this mapping counts, so the device never holds both.
  std::uint64_t handle = 0;
  bool reused = false;
  if (auto k = std::find_if(kept_.begin(), kept_.end(), [&](const auto& x) { return x.first == size; });
      k != kept_.end()) {
    handle = k->second;
    kept_bytes_ -= size;
    *k = kept_.back();
    kept_.pop_back();
    reused = true;
    ++reuses_;
  }
  release_kept();
  if (!reused) {
    auto h = driver_.create(size);
    if (!h && h.code() == errc::out_of_memory && (in_flight_ > 0 || !batches_.empty())) {
      // Memory is on its way back: let the device reach the pending unmaps (a counted wait), then
      // try again.
      if (auto u = record(false); !u) return u;
      if (auto c = complete(true, false); !c) return c;
      release_kept();
      h = driver_.create(size);
    }
    if (!h) {
      error e = std::move(h).err();
      e.size = size;
      return e;
    }
    handle = *h;
    ++creates_;
  }
  if (auto m = driver_.map(r->base + offset, size, handle); !m) {
    driver_.release(handle, size);
    error e = std::move(m).err();
    e.size = size;
    return e;
  }
  r->mappings.emplace(first, mapping{count, handle, 0, state::mapped});
  mapped_ += size;
  return {};
}

vmm::mapping* vmm::whole_mapping(memory::storage_id id, std::uint64_t offset, std::uint64_t size, range*& r) {
  r = find(id);
  if (r == nullptr || size == 0 || offset % r->unit != 0) return nullptr;
  auto it = r->mappings.find(offset / r->unit);
  // Only what one map call mapped, whole.
  if (it == r->mappings.end() || it->second.st != state::mapped || it->second.count * r->unit != size) return nullptr;
  return &it->second;
}

void vmm::unmap(memory::storage_id id, std::uint64_t offset, std::uint64_t size) {
  range* r = nullptr;
  mapping* m = whole_mapping(id, offset, size, r);
  if (m == nullptr) {
    ++misuses_;
    return;
  }
  if (!driver_.deferred()) {
    unmap_now(id, *r, offset / r->unit, false);
    return;
  }
  m->st = state::unmap_requested;
  ++r->in_flight;
  ++in_flight_;
  returning_ += size;
  requested_.emplace_back(id, offset / r->unit);
}

void vmm::unmap_idle(memory::storage_id id, std::uint64_t offset, std::uint64_t size) {
  // Where unmaps are not deferred, or a capture records, the plain unmap's rules hold.
  if (!driver_.deferred() || driver_.capturing()) {
    unmap(id, offset, size);
    return;
  }
  range* r = nullptr;
  if (whole_mapping(id, offset, size, r) == nullptr) {
    ++misuses_;
    return;
  }
  unmap_now(id, *r, offset / r->unit, true);
}

void vmm::unmap_now(memory::storage_id id, range& r, std::uint64_t first, bool keep) {
  (void)id;
  auto it = r.mappings.find(first);
  const mapping m = it->second;
  const std::uint64_t bytes = m.count * r.unit;
  driver_.unmap(r.base + first * r.unit, bytes);
  if (keep) {
    // No work can reach the memory any more: a map of the same size before the next flush may take it.
    kept_.emplace_back(bytes, m.handle);
    kept_bytes_ += bytes;
  } else {
    driver_.release(m.handle, bytes);
  }
  if (m.st != state::mapped) {
    --r.in_flight;
    --in_flight_;
    returning_ -= bytes;
    if (m.st == state::unmap_recorded) --recorded_;
  }
  mapped_ -= bytes;
  r.mappings.erase(it);
}

void vmm::release_kept() noexcept {
  for (const auto& [bytes, handle] : kept_) driver_.release(handle, bytes);
  kept_.clear();
  kept_bytes_ = 0;
}

result<void> vmm::record(bool keep) {
  if (requested_.empty() || driver_.capturing()) return {};
  auto behind = driver_.behind_device();
  if (!behind) return std::move(behind).err();
  if (*behind == 0) {
    // Nothing left to run on the device's stream, the waits for the streams returns wait for
    // included: no queued work can touch the memory, so it goes back now, without an event (the
    // common case between bursts of work). The peak then never counts memory that is both on its
    // way back and mapped anew.
    for (const auto& [id, first] : requested_) {
      range* r = find(id);
      if (r == nullptr) continue;
      auto it = r->mappings.find(first);
      if (it == r->mappings.end() || it->second.st != state::unmap_requested) continue;  // mapped again since
      unmap_now(id, *r, first, keep);
    }
    requested_.clear();
    ++idle_releases_;
    return complete(false, keep);
  }
  batch b{*behind, next_batch_++, {}};
  b.mappings.reserve(requested_.size());
  for (const auto& [id, first] : requested_) {
    range* r = find(id);
    if (r == nullptr) continue;
    auto it = r->mappings.find(first);
    if (it == r->mappings.end() || it->second.st != state::unmap_requested) continue;
    it->second.st = state::unmap_recorded;
    it->second.batch = b.seq;
    ++recorded_;
    b.mappings.emplace_back(id, first);
  }
  requested_.clear();
  if (b.mappings.empty()) {
    driver_.release_event(b.e);
  } else {
    batches_.push_back(std::move(b));
  }
  return complete(false, keep);
}

result<void> vmm::complete(bool wait, bool keep) {
  std::size_t done = 0;
  result<void> out;
  if (wait && !batches_.empty()) {
    // The batches' events are all on the device's stream: the newest passing covers the others.
    ++waits_;
    if (auto w = driver_.wait(batches_.back().e); !w) return w;
  }
  for (; done < batches_.size(); ++done) {
    const batch& b = batches_[done];
    auto q = driver_.query(b.e);
    if (!q) {
      out = std::move(q).err();
      break;
    }
    if (!*q) break;
    for (const auto& [id, first] : b.mappings) {
      range* r = find(id);
      if (r == nullptr) continue;
      auto it = r->mappings.find(first);
      // Only the batch that recorded the unmap does it: a mapping mapped again since keeps its
      // memory, and one unmapped again belongs to a newer batch.
      if (it == r->mappings.end() || it->second.st != state::unmap_recorded || it->second.batch != b.seq) continue;
      unmap_now(id, *r, first, keep);
    }
  }
  batches_.erase(batches_.begin(), batches_.begin() + static_cast<std::ptrdiff_t>(done));
  free_dying();
  return out;
}

void vmm::free_dying() {
  for (std::size_t i = 0; i < dying_.size();) {
    auto it = ranges_.find(dying_[i]);
    if (it != ranges_.end() && it->second.in_flight != 0) {
      ++i;
      continue;
    }
    if (it != ranges_.end()) {
      range& r = it->second;
      // Everything in it was unmapped before it died; what is left went back with its unmap.
      while (!r.mappings.empty()) unmap_now(it->first, r, r.mappings.begin()->first, false);
      driver_.free_addresses(r.base, r.size);
      ranges_.erase(it);
      last_ = nullptr;
    }
    dying_[i] = dying_.back();
    dying_.pop_back();
  }
}

void vmm::release_range(memory::storage_id id) {
  range* r = find(id);
  if (r == nullptr) {
    ++misuses_;
    return;
  }
  if (r->dying) return;
  // Everything still mapped is unmapped behind the work in flight (recorded at the next flush);
  // the addresses are freed once no unmap of theirs is pending. Nothing here waits for the device.
  r->dying = true;
  dying_.push_back(id);
  if (!driver_.deferred()) return;  // the flush unmaps and frees it all
  for (auto& [first, m] : r->mappings) {
    if (m.st != state::mapped) continue;
    m.st = state::unmap_requested;
    ++r->in_flight;
    ++in_flight_;
    returning_ += m.count * r->unit;
    requested_.emplace_back(id, first);
  }
}

result<void> vmm::flush() {
  if (driver_.capturing()) return {};
  result<void> out = record(false);
  if (out && !batches_.empty()) out = complete(false, false);
  // Kept memory no map took since the last settle goes back.
  release_kept();
  free_dying();
  return out;
}

result<void> vmm::settle() {
  if (driver_.capturing() || (requested_.empty() && batches_.empty())) return {};
  // What the device takes back now is kept for the maps that follow; the next flush releases
  // what they leave.
  if (auto u = record(true); !u) return u;
  return batches_.empty() ? result<void>{} : complete(false, true);
}

void vmm::teardown() noexcept {
  for (const auto& b : batches_) driver_.release_event(b.e);
  batches_.clear();
  requested_.clear();
  release_kept();
  for (auto& [id, r] : ranges_) {
    for (auto& [first, m] : r.mappings) {
      const std::uint64_t bytes = m.count * r.unit;
      driver_.unmap(r.base + first * r.unit, bytes);
      driver_.release(m.handle, bytes);
    }
    r.mappings.clear();
    driver_.free_addresses(r.base, r.size);
  }
  ranges_.clear();
  dying_.clear();
  last_ = nullptr;
  mapped_ = 0;
  in_flight_ = 0;
  recorded_ = 0;
  returning_ = 0;
}

std::uint64_t vmm::returning_bytes() const noexcept { return returning_ + kept_bytes_; }

}  // namespace devrt::devices
