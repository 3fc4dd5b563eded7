#include "devrt/devices/sim_storage.hpp"

#include <algorithm>
#include <iterator>
#include <optional>

namespace devrt::devices {

namespace {
// More addresses than any device has: 2^48 bytes.
constexpr std::uint64_t max_range_size = std::uint64_t{1} << 48;
}  // namespace

sim_options sim_options::h200() {
  sim_options o;
  o.props.capacity = 150'109'880'320ULL;
  o.props.alignment = 512;
  o.props.max_page_size = o.props.capacity / 4;
  o.props.map_granularity = 2ULL << 20;
  o.name = "sim-h200";
  return o;
}

sim_storage::sim_storage(sim_options opts) : opts_(std::move(opts)) {
  if (opts_.props.alignment == 0) opts_.props.alignment = 1;
}

result<void> sim_storage::admit(std::uint64_t size) {
  ++alloc_calls_;
  auto refuse = [&](const char* why) {
    error e = error::make(errc::out_of_memory, why);
    e.size = size;
    e.in_use = allocated_;
    e.limit = opts_.props.capacity;
    return e;
  };
  if (fail_at_ && alloc_calls_ == *fail_at_) {
    fail_at_.reset();
    return refuse("injected allocation failure");
  }
  const std::uint64_t cap = opts_.props.capacity;
  if (cap != 0 && (allocated_ > cap || size > cap - allocated_)) return refuse("simulated device capacity reached");
  return {};
}

void sim_storage::charge(std::uint64_t size) noexcept {
  allocated_ += size;
  peak_ = std::max(peak_, allocated_);
  ++allocations_;
}

result<memory::storage_handle> sim_storage::alloc(std::uint64_t size) {
  if (auto a = admit(size); !a) return std::move(a).err();
  const memory::storage_id id = next_id_++;
  pages_.emplace(id, size);
  charge(size);
  return memory::storage_handle{id, 0, size};
}

void sim_storage::dealloc(memory::storage_id id) { pending_.push_back(id); }

std::uint64_t sim_storage::returning_bytes() const noexcept {
  std::uint64_t n = 0;
  for (const memory::storage_id id : pending_) {
    if (auto it = pages_.find(id); it != pages_.end()) {
      n += it->second;
    } else if (auto r = ranges_.find(id); r != ranges_.end()) {
      for (const auto& [first, length] : r->second.mappings) n += length * r->second.unit;
    }
  }
  for (const unmapping& u : unmapping_) n += u.bytes;
  return n;
}

template <class Pick>
void sim_storage::give_back_unmaps(Pick pick) {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < unmapping_.size(); ++i) {
    const unmapping u = unmapping_[i];
    if (pick(u)) {
      allocated_ -= u.bytes;
      ++frees_;
    } else {
      unmapping_[kept++] = u;
    }
  }
  unmapping_.resize(kept);
}

result<void> sim_storage::flush() {
  if (fail_flush_) {
    fail_flush_ = false;
    error e = error::make(errc::device_error, "injected flush failure");
    e.size = pending_.size();
    return e;
  }
  if (!unmapping_.empty()) {
    // Nothing left to run on any queue: every unmap goes back now. Otherwise the ones whose ticket
    // has passed do, and the new ones are recorded behind the device's queue.
    const bool idle = unpassed_.empty();
    std::optional<memory::ticket> behind;
    for (unmapping& u : unmapping_) {
      if (u.after == 0 && !idle) {
        if (!behind) behind = mark(memory::queue::device).value();
        u.after = *behind;
      }
    }
    give_back_unmaps([&](const unmapping& u) { return idle || unpassed_.count(u.after) == 0; });
  }
  for (const memory::storage_id id : pending_) {
    if (auto r = ranges_.find(id); r != ranges_.end()) {
      for (const auto& [first, length] : r->second.mappings) {
        mapped_ -= length * r->second.unit;
        allocated_ -= length * r->second.unit;
      }
      give_back_unmaps([&](const unmapping& u) { return u.range == id; });
      ++frees_;
      if (last_range_ == &r->second) last_range_ = nullptr;
      ranges_.erase(r);
      continue;
    }
    auto it = pages_.find(id);
    if (it == pages_.end()) continue;
    allocated_ -= it->second;
    pages_.erase(it);
    ++frees_;
  }
  pending_.clear();
  return {};
}

result<memory::resource> sim_storage::get(const memory::storage_handle& h) {
  if (auto r = ranges_.find(h.id); r != ranges_.end()) {
    if (h.offset > r->second.size || h.size > r->second.size - h.offset) {
      error e = error::make(errc::invalid_argument, "the view ends past its simulated address range");
      e.size = h.offset + h.size;
      e.limit = r->second.size;
      return e;
    }
    // Every unit of the view is inside a mapping: walk the mappings from the one holding its start.
    const std::uint64_t u = r->second.unit;
    const std::uint64_t last = h.size == 0 ? h.offset / u : (h.offset + h.size - 1) / u;
    std::uint64_t k = h.offset / u;
    auto it = r->second.mappings.upper_bound(k);
    if (it == r->second.mappings.begin()) return error::make(errc::invalid_argument, "the view is not mapped");
    --it;
    while (k <= last) {
      if (it == r->second.mappings.end() || it->first > k || it->first + it->second <= k) {
        return error::make(errc::invalid_argument, "the view is not mapped");
      }
      k = it->first + it->second;
      ++it;
    }
    return memory::resource{nullptr, h.size, h};
  }
  auto it = pages_.find(h.id);
  if (it == pages_.end()) return error::make(errc::not_found, "the simulated page does not exist");
  if (h.offset > it->second || h.size > it->second - h.offset) {
    error e = error::make(errc::invalid_argument, "the view ends past its simulated page");
    e.size = h.offset + h.size;
    e.limit = it->second;
    return e;
  }
  return memory::resource{nullptr, h.size, h};
}

result<void> sim_storage::write(const memory::storage_handle& h, const void* /*src*/) {
  auto r = get(h);
  if (!r) return std::move(r).err();
  return error::make(errc::invalid_argument, "the simulated device has no memory to write to");
}

result<void> sim_storage::read(const memory::storage_handle& h, void* /*dst*/) {
  auto r = get(h);
  if (!r) return std::move(r).err();
  return error::make(errc::invalid_argument, "the simulated device has no memory to read from");
}

result<memory::storage_handle> sim_storage::reserve_range(std::uint64_t size, std::uint64_t unit) {
  const std::uint64_t g = opts_.props.map_granularity;
  if (g == 0) return error::make(errc::unsupported, "this simulated device has no map granularity");
  if (unit == 0 || unit % g != 0 || size == 0 || size % unit != 0) {
    error e = error::make(errc::invalid_argument,
                          "an address range is a positive multiple of its unit, and the unit of the granularity");
    e.size = size;
    e.limit = unit;
    return e;
  }
  if (size > max_range_size) {
    error e = error::make(errc::out_of_memory, "more addresses than the simulated device has");
    e.size = size;
    e.limit = max_range_size;
    return e;
  }
  const memory::storage_id id = next_id_++;
  ranges_.emplace(id, range{size, unit, {}});
  return memory::storage_handle{id, 0, size};
}

result<void> sim_storage::check_granules(const range& r, std::uint64_t offset, std::uint64_t size) const {
  const std::uint64_t u = r.unit;
  if (size == 0 || offset % u != 0 || size % u != 0 || offset > r.size || size > r.size - offset) {
    error e = error::make(errc::invalid_argument, "the mapping is not whole units inside the range");
    e.size = offset + size;
    e.limit = r.size;
    return e;
  }
  return {};
}

result<void> sim_storage::map(memory::storage_id id, std::uint64_t offset, std::uint64_t size) {
  range* rg = find_range(id);
  if (rg == nullptr) return error::make(errc::not_found, "the simulated address range does not exist");
  if (auto c = check_granules(*rg, offset, size); !c) return c;
  const std::uint64_t u = rg->unit;
  if (!unmapping_.empty()) {
    const std::uint64_t first = offset / u;
    const std::uint64_t count = size / u;
    // The same bounds again before the unmap took effect: the mapping keeps its memory.
    for (std::size_t i = 0; i < unmapping_.size(); ++i) {
      const unmapping& p = unmapping_[i];
      if (p.range == id && p.first == first && p.length == count) {
        unmapping_.erase(unmapping_.begin() + static_cast<std::ptrdiff_t>(i));
        rg->mappings.emplace(first, count);
        mapped_ += size;
        return {};
      }
    }
    // Other bounds over memory whose unmap is pending: the queue has to reach it first (a wait).
    bool overlaps = false;
    for (const unmapping& p : unmapping_) {
      overlaps = overlaps || (p.range == id && p.first < first + count && first < p.first + p.length);
    }
    if (overlaps) {
      ++waits_;
      progress();
      give_back_unmaps([&](const unmapping& p) { return p.range == id; });
    }
  }
  {
    // Overlap with the mapping before (it would end past the start) or after (it would start
    // before the end).
    const std::uint64_t first = offset / u;
    const std::uint64_t end = (offset + size) / u;
    auto next = rg->mappings.lower_bound(first);
    const bool before = next != rg->mappings.begin() && std::prev(next)->first + std::prev(next)->second > first;
    if (before || (next != rg->mappings.end() && next->first < end)) {
      error e = error::make(errc::invalid_argument, "the memory is mapped already");
      e.size = offset;
      return e;
    }
  }
  if (auto a = admit(size); !a) return a;
  rg->mappings.emplace(offset / u, size / u);
  mapped_ += size;
  charge(size);
  return {};
}

void sim_storage::unmap(memory::storage_id id, std::uint64_t offset, std::uint64_t size) {
  range* rg = find_range(id);
  if (rg == nullptr || !check_granules(*rg, offset, size)) {
    ++misuses_;
    return;
  }
  const std::uint64_t u = rg->unit;
  auto it = rg->mappings.find(offset / u);
  if (it == rg->mappings.end() || it->second * u != size) {
    ++misuses_;  // not exactly what one map call mapped
    return;
  }
  if (opts_.deferred_unmaps && opts_.queues) {
    unmapping_.push_back(unmapping{id, it->first, it->second, size, 0});
    rg->mappings.erase(it);
    mapped_ -= size;
    return;
  }
  rg->mappings.erase(it);
  mapped_ -= size;
  allocated_ -= size;
  ++frees_;
}

sim_storage::range* sim_storage::find_range(memory::storage_id id) {
  // One range is the common case: remember the last one found.
  if (id == last_range_id_ && last_range_ != nullptr) return last_range_;
  auto it = ranges_.find(id);
  if (it == ranges_.end()) return nullptr;
  last_range_id_ = id;
  last_range_ = &it->second;
  return last_range_;
}

void sim_storage::release_range(memory::storage_id id) {
  if (ranges_.find(id) == ranges_.end()) {
    ++misuses_;
    return;
  }
  pending_.push_back(id);
}

// ---- Simulated queues ----

result<memory::ticket> sim_storage::mark(memory::queue_id q) {
  if (!opts_.queues) return memory::ticket{0};
  unpassed_.emplace(++issued_, q);
  return issued_;
}

result<bool> sim_storage::passed(memory::ticket t) const noexcept { return unpassed_.count(t) == 0; }

result<void> sim_storage::wait(memory::ticket t) noexcept {
  ++waits_;
  run_until(t);
  return {};
}

void sim_storage::run_until(memory::ticket t) noexcept {
  auto it = unpassed_.find(t);
  if (it == unpassed_.end()) return;
  const memory::queue_id q = it->second;
  // The queue runs in order: everything on it up to t passes.
  for (auto i = unpassed_.begin(); i != unpassed_.end() && i->first <= t;) {
    if (i->second == q) {
      passed_on_[q] = std::max(passed_on_[q], i->first);
      i = unpassed_.erase(i);
    } else {
      ++i;
    }
  }
}

void sim_storage::progress() noexcept {
  for (const auto& [t, q] : unpassed_) passed_on_[q] = std::max(passed_on_[q], t);
  unpassed_.clear();
}

void sim_storage::progress_queue(memory::queue_id q) noexcept {
  for (auto i = unpassed_.begin(); i != unpassed_.end();) {
    if (i->second == q) {
      passed_on_[q] = std::max(passed_on_[q], i->first);
      i = unpassed_.erase(i);
    } else {
      ++i;
    }
  }
}

memory::ticket sim_storage::passed_on(memory::queue_id q) const noexcept {
  auto it = passed_on_.find(q);
  return it == passed_on_.end() ? 0 : it->second;
}

result<void> sim_storage::join(memory::queue_id /*q*/, memory::ticket /*t*/) noexcept {
  ++joins_;
  return {};
}

void sim_storage::use_queue(memory::queue_id q) {
  if (std::find(queues_.begin(), queues_.end(), q) == queues_.end()) queues_.push_back(q);
}

void sim_storage::retire_queue(memory::queue_id q) { std::erase(queues_, q); }

result<memory::ticket> sim_storage::read_async(const memory::storage_handle& h, void* dst, memory::queue_id q) {
  if (auto r = read(h, dst); !r) return std::move(r).err();
  return mark(q);
}

}  // namespace devrt::devices
