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
  auto held_by = [&](memory::storage_id id) -> std::uint64_t {
    if (auto it = pages_.find(id); it != pages_.end()) return it->second;
    if (auto r = ranges_.find(id); r != ranges_.end()) {
      std::uint64_t m = 0;
      for (const auto& [first, length] : r->second.mappings) m += length * r->second.unit;
      return m;
    }
    return 0;
  };
  for (const memory::storage_id id : pending_) n += held_by(id);
  for (const auto& f : freeing_) n += held_by(f.id);
  for (const unmapping& u : unmapping_) n += u.bytes;
  return n;
}

void sim_storage::free_now(memory::storage_id id) {
  if (auto r = ranges_.find(id); r != ranges_.end()) {
    for (const auto& [first, length] : r->second.mappings) {
      mapped_ -= length * r->second.unit;
      allocated_ -= length * r->second.unit;
      if (on_give_back) on_give_back(given_back{id, first * r->second.unit, length * r->second.unit});
    }
    give_back_unmaps([&](const unmapping& u) { return u.range == id; });
    ++frees_;
    if (last_range_ == &r->second) last_range_ = nullptr;
    ranges_.erase(r);
    return;
  }
  auto it = pages_.find(id);
  if (it == pages_.end()) return;
  if (on_give_back) on_give_back(given_back{id, 0, it->second});
  allocated_ -= it->second;
  pages_.erase(it);
  ++frees_;
}

template <class Pick>
void sim_storage::give_back_unmaps(Pick pick) {
  std::size_t kept = 0;
  for (std::size_t i = 0; i < unmapping_.size(); ++i) {
    const unmapping u = unmapping_[i];
    if (pick(u)) {
      allocated_ -= u.bytes;
      ++frees_;
      if (on_give_back) on_give_back(given_back{u.range, u.first * ranges_.at(u.range).unit, u.bytes});
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
  if (!opts_.streams) {
    for (const memory::storage_id id : pending_) free_now(id);
    pending_.clear();
    return {};
  }
  // As cudaFreeAsync and deferred unmaps on a GPU: memory goes back behind the work queued on the
  // device's stream, after that stream waited for the streams returns wait for; at once when
  // nothing is left to run anywhere.
  bool idle = false;
  {
    const std::lock_guard lock(mutex_);
    idle = unpassed_.empty();
  }
  const bool unrecorded = !pending_.empty() || std::any_of(unmapping_.begin(), unmapping_.end(),
                                                           [](const unmapping& u) { return u.after == 0; });
  memory::event behind = 0;
  if (unrecorded && !idle) {
    for (const memory::stream_id s : return_after_) {
      if (auto t = record_event(s); t) (void)stream_wait_event(memory::streams::device, *t);
    }
    auto t = record_event(memory::streams::device);
    if (!t) return std::move(t).err();  // kept for the next flush
    behind = *t;
  }
  for (unmapping& u : unmapping_) {
    if (u.after == 0) u.after = behind;
  }
  for (const memory::storage_id id : pending_) freeing_.push_back(freeing{id, behind});
  pending_.clear();
  give_back_unmaps([&](const unmapping& u) { return idle || u.after == 0 || has_passed(u.after); });
  std::size_t kept = 0;
  for (std::size_t i = 0; i < freeing_.size(); ++i) {
    const freeing f = freeing_[i];
    if (idle || f.after == 0 || has_passed(f.after)) {
      free_now(f.id);
    } else {
      freeing_[kept++] = f;
    }
  }
  freeing_.resize(kept);
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
  if (opts_.deferred_unmaps && opts_.streams) {
    unmapping_.push_back(unmapping{id, it->first, it->second, size, 0});
    rg->mappings.erase(it);
    mapped_ -= size;
    return;
  }
  rg->mappings.erase(it);
  mapped_ -= size;
  allocated_ -= size;
  ++frees_;
  if (on_give_back) on_give_back(given_back{id, offset, size});
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

// ---- Simulated streams ----

// One native stream's free-time fences: every record is a new event on the stream, replacing the
// one before (which no one holds); `take` hands the newest to the owner.
class sim_storage::fence_impl final : public memory::free_fence {
 public:
  fence_impl(sim_storage& sim, memory::stream_id handle, std::uint64_t uid) : sim_(sim), handle_(handle), uid_(uid) {}
  void record() noexcept override {
    const std::lock_guard lock(sim_.mutex_);
    ++sim_.free_records_;
    if (sim_.fail_free_record_) {
      sim_.fail_free_record_ = false;
      failed_ = true;
      return;
    }
    // As on a GPU: a record on a destroyed stream fails, and one on a handle the driver gave to a
    // new stream since lands on that stream.
    auto it = sim_.live_.find(handle_);
    if (it == sim_.live_.end()) {
      failed_ = true;
      return;
    }
    if (current_ != 0) sim_.pass_locked(current_);  // superseded: no one holds it
    current_ = sim_.record_locked(it->second);
  }
  result<memory::event> take() override {
    const std::lock_guard lock(sim_.mutex_);
    if (failed_) {
      failed_ = false;
      error e = error::make(errc::device_error, "a free-time event record failed on the simulated stream");
      e.text = "stream uid " + std::to_string(uid_);
      return e;
    }
    return std::exchange(current_, 0);
  }

 private:
  sim_storage& sim_;
  memory::stream_id handle_;
  std::uint64_t uid_;
  memory::event current_ = 0;
  bool failed_ = false;
};

std::uint64_t sim_storage::uid_locked(memory::stream_id s) {
  switch (s) {
    case memory::streams::none:
    case memory::streams::device: return memory::streams::device;
    case memory::streams::legacy: return memory::streams::legacy;
    case memory::streams::per_thread: return memory::streams::per_thread;
    default: break;
  }
  if (auto it = live_.find(s); it != live_.end()) return it->second;
  if (destroyed_.contains(s)) return 0;
  // A handle the test names without creating it: a stream of this device from now on.
  const std::uint64_t uid = next_uid_++;
  live_.emplace(s, uid);
  streams_[uid].device = opts_.device;
  return uid;
}

memory::event sim_storage::record_locked(std::uint64_t uid) {
  ++issued_;
  unpassed_.emplace(issued_, uid);
  of_.emplace(issued_, uid);
  return issued_;
}

void sim_storage::pass_locked(memory::event e) noexcept {
  auto it = unpassed_.find(e);
  if (it == unpassed_.end()) return;
  passed_on_[it->second] = std::max(passed_on_[it->second], e);
  unpassed_.erase(it);
}

result<void> sim_storage::begin_capture() {
  const std::lock_guard lock(mutex_);
  capturing_ = opts_.streams;
  return {};
}

result<std::shared_ptr<memory::recorded_work>> sim_storage::end_capture() {
  const std::lock_guard lock(mutex_);
  capturing_ = false;
  return std::shared_ptr<memory::recorded_work>();
}

result<memory::event> sim_storage::record_event(memory::stream_id s) {
  if (!opts_.streams) return memory::event{0};
  const std::lock_guard lock(mutex_);
  if (fail_record_) {
    fail_record_ = false;
    return error::make(errc::device_error, "injected event record failure");
  }
  if (capturing_ && (s == memory::streams::device || s == memory::streams::none)) {
    return error::make(errc::capture_active, "no event is recorded on the device's stream during a capture");
  }
  const std::uint64_t uid = uid_locked(s == memory::streams::per_thread ? memory::streams::legacy : s);
  if (uid == 0) {
    error e = error::make(errc::device_error, "event record on a destroyed simulated stream");
    e.text = "stream " + std::to_string(s);
    return e;
  }
  return record_locked(uid);
}

result<bool> sim_storage::query_event(memory::event e) {
  const std::lock_guard lock(mutex_);
  if (fail_query_) {
    fail_query_ = false;
    return error::make(errc::device_error, "injected event query failure");
  }
  return unpassed_.count(e) == 0;
}

bool sim_storage::has_passed(memory::event e) const noexcept {
  const std::lock_guard lock(mutex_);
  return unpassed_.count(e) == 0;
}

std::uint64_t sim_storage::uid_of(memory::event e) const noexcept {
  const std::lock_guard lock(mutex_);
  auto it = of_.find(e);
  return it == of_.end() ? 0 : it->second;
}

result<void> sim_storage::wait_event(memory::event e) {
  {
    const std::lock_guard lock(mutex_);
    ++waits_;
  }
  run_until(e);
  return {};
}

void sim_storage::run_until(memory::event e) noexcept {
  const std::lock_guard lock(mutex_);
  run_until_locked(e);
}

void sim_storage::run_until_locked(memory::event e) noexcept {
  auto it = unpassed_.find(e);
  if (it == unpassed_.end()) return;
  const std::uint64_t uid = it->second;
  // What the stream waits for before `e` runs first.
  const auto waits = streams_[uid].waits;
  for (const auto& [before, waited] : waits) {
    if (before < e) run_until_locked(waited);
  }
  // The stream runs in order: everything on it up to e passes.
  for (auto i = unpassed_.begin(); i != unpassed_.end() && i->first <= e;) {
    if (i->second == uid) {
      passed_on_[uid] = std::max(passed_on_[uid], i->first);
      i = unpassed_.erase(i);
    } else {
      ++i;
    }
  }
}

void sim_storage::progress_locked(std::uint64_t uid) noexcept {
  const sim_stream& q = streams_[uid];
  for (auto i = unpassed_.begin(); i != unpassed_.end();) {
    if (i->second != uid) {
      ++i;
      continue;
    }
    // Held back by a wait for an event that has not passed.
    bool blocked = false;
    for (const auto& [before, waited] : q.waits) {
      if (before < i->first && unpassed_.count(waited) != 0) blocked = true;
    }
    if (blocked) return;
    passed_on_[uid] = std::max(passed_on_[uid], i->first);
    i = unpassed_.erase(i);
  }
}

void sim_storage::progress() noexcept {
  const std::lock_guard lock(mutex_);
  // Waits only point back in time, so every event passes.
  for (const auto& [e, uid] : unpassed_) passed_on_[uid] = std::max(passed_on_[uid], e);
  unpassed_.clear();
}

void sim_storage::progress_stream(memory::stream_id s) noexcept {
  const std::lock_guard lock(mutex_);
  const std::uint64_t uid = uid_locked(s);
  if (uid != 0) progress_locked(uid);
}

void sim_storage::progress_uid(std::uint64_t uid) noexcept {
  const std::lock_guard lock(mutex_);
  progress_locked(uid);
}

memory::event sim_storage::issued_events() const noexcept {
  const std::lock_guard lock(mutex_);
  return issued_;
}

memory::event sim_storage::passed_on(memory::stream_id s) {
  const std::lock_guard lock(mutex_);
  auto it = passed_on_.find(uid_locked(s));
  return it == passed_on_.end() ? 0 : it->second;
}

bool sim_storage::ordered_after_locked(std::uint64_t uid, memory::event e, int depth) const noexcept {
  if (unpassed_.count(e) == 0) return true;
  auto of = of_.find(e);
  if (of == of_.end()) return true;
  if (of->second == uid) return true;  // the same stream: stream order
  if (depth > 64) return false;
  auto q = streams_.find(uid);
  if (q == streams_.end()) return false;
  for (const auto& [before, waited] : q->second.waits) {
    // The stream waits for `waited`: ordered after `e` if `waited` is on e's stream and later, or
    // if `waited`'s stream was itself ordered after `e` when it was recorded.
    auto w = of_.find(waited);
    if (w == of_.end()) continue;
    if (w->second == of->second && waited >= e) return true;
    if (ordered_after_locked(w->second, e, depth + 1)) return true;
  }
  return false;
}

bool sim_storage::ordered_after(std::uint64_t uid, memory::event e) const noexcept {
  const std::lock_guard lock(mutex_);
  return ordered_after_locked(uid, e, 0);
}

result<void> sim_storage::stream_wait_event(memory::stream_id s, memory::event e) {
  const std::lock_guard lock(mutex_);
  ++joins_;
  const std::uint64_t uid = uid_locked(s == memory::streams::per_thread ? memory::streams::legacy : s);
  if (uid == 0) {
    error err = error::make(errc::device_error, "a wait on a destroyed simulated stream");
    err.text = "stream " + std::to_string(s);
    return err;
  }
  if (unpassed_.count(e) != 0) streams_[uid].waits.emplace_back(issued_ + 1, e);
  return {};
}

result<memory::stream_identity> sim_storage::identify(memory::stream_id s) {
  const std::lock_guard lock(mutex_);
  if (fail_identify_) {
    fail_identify_ = false;
    return error::make(errc::device_error, "injected failure identifying a stream");
  }
  const std::uint64_t uid = uid_locked(s);
  if (uid == 0) {
    error e = error::make(errc::invalid_argument,
                          "the stream handle names no stream (it was destroyed): allocate for a live stream");
    e.text = "stream " + std::to_string(s);
    return e;
  }
  const int device = streams_[uid].device;
  return memory::stream_identity{uid, device, device != opts_.device};
}

result<std::unique_ptr<memory::free_fence>> sim_storage::make_free_fence(memory::stream_id s,
                                                                         const memory::stream_identity& id) {
  return std::unique_ptr<memory::free_fence>(std::make_unique<fence_impl>(*this, s, id.uid));
}

result<void> sim_storage::synchronize_device() {
  if (capturing_) return error::make(errc::capture_active, "the device cannot be synchronized during a capture");
  {
    const std::lock_guard lock(mutex_);
    ++waits_;
  }
  progress();
  return {};
}

void sim_storage::return_after(memory::stream_id s) {
  if (std::find(return_after_.begin(), return_after_.end(), s) == return_after_.end()) return_after_.push_back(s);
}

std::uint64_t sim_storage::free_records() const noexcept {
  const std::lock_guard lock(mutex_);
  return free_records_;
}

void sim_storage::fail_next_free_record() noexcept {
  const std::lock_guard lock(mutex_);
  fail_free_record_ = true;
}

memory::stream_id sim_storage::create_stream(int device) {
  const std::lock_guard lock(mutex_);
  memory::stream_id h = 0;
  if (!recycled_.empty()) {
    h = recycled_.back();
    recycled_.pop_back();
    destroyed_.erase(h);
  } else {
    h = next_handle_;
    next_handle_ += 0x100;
  }
  const std::uint64_t uid = next_uid_++;
  live_[h] = uid;
  streams_[uid].device = device < 0 ? opts_.device : device;
  return h;
}

void sim_storage::destroy_stream(memory::stream_id s) {
  const std::lock_guard lock(mutex_);
  auto it = live_.find(s);
  if (it == live_.end()) return;
  streams_[it->second].alive = false;
  live_.erase(it);
  destroyed_[s] = true;
  recycled_.push_back(s);
}

std::uint64_t sim_storage::stream_uid(memory::stream_id s) {
  const std::lock_guard lock(mutex_);
  if (s > memory::streams::device && !live_.contains(s)) return 0;
  return uid_locked(s);
}

result<memory::event> sim_storage::read_async(const memory::storage_handle& h, void* dst, memory::stream_id s) {
  if (auto r = read(h, dst); !r) return std::move(r).err();
  return record_event(s);
}

}  // namespace devrt::devices
