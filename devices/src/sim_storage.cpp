#include "devrt/devices/sim_storage.hpp"

#include "vmm.hpp"

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

// The simulated driver under the mapping state machine: physical memory counts against the
// capacity (and fails on request), addresses are numbers, unmaps are seen by `on_give_back`, and
// events are the simulated streams' own.
class sim_storage::driver_impl final : public vmm_driver {
 public:
  explicit driver_impl(sim_storage& sim) : sim_(sim) {}
  result<std::uint64_t> reserve_addresses(std::uint64_t size) override {
    if (size > max_range_size) {
      error e = error::make(errc::out_of_memory, "more addresses than the simulated device has");
      e.size = size;
      e.limit = max_range_size;
      return e;
    }
    const std::uint64_t base = sim_.next_base_;
    sim_.next_base_ += size + std::max<std::uint64_t>(sim_.opts_.props.map_granularity, 1);
    return base;
  }
  void free_addresses(std::uint64_t base, std::uint64_t /*size*/) noexcept override {
    sim_.range_at_.erase(base);
    ++sim_.frees_;
  }
  result<std::uint64_t> create(std::uint64_t size) override {
    if (auto a = sim_.admit(size); !a) return std::move(a).err();
    sim_.charge(size);
    return ++handles_;
  }
  void release(std::uint64_t /*handle*/, std::uint64_t size) noexcept override {
    sim_.allocated_ -= size;
    ++sim_.frees_;
  }
  result<void> map(std::uint64_t /*at*/, std::uint64_t size, std::uint64_t /*handle*/) override {
    if (sim_.fail_map_) {
      sim_.fail_map_ = false;
      error e = error::make(errc::device_error, "injected map failure");
      e.size = size;
      return e;
    }
    return {};
  }
  void unmap(std::uint64_t at, std::uint64_t size) noexcept override {
    if (!sim_.on_give_back) return;
    auto it = sim_.range_at_.upper_bound(at);
    if (it == sim_.range_at_.begin()) return;
    --it;
    sim_.on_give_back(given_back{it->second, at - it->first, size});
  }
  [[nodiscard]] bool deferred() const noexcept override { return sim_.opts_.streams && sim_.opts_.deferred_unmaps; }
  [[nodiscard]] bool capturing() const noexcept override { return sim_.capturing_; }
  result<memory::event> behind_device() override { return sim_.behind_device(); }
  result<bool> query(memory::event e) override { return sim_.query_event(e); }
  result<void> wait(memory::event e) override { return sim_.wait_event(e); }
  void release_event(memory::event /*e*/) noexcept override {}

 private:
  sim_storage& sim_;
  std::uint64_t handles_ = 0;
};

sim_storage::sim_storage(sim_options opts) : opts_(std::move(opts)) {
  if (opts_.props.alignment == 0) opts_.props.alignment = 1;
  driver_ = std::make_unique<driver_impl>(*this);
  vmm_ = std::make_unique<vmm>(*driver_, std::max<std::uint64_t>(opts_.props.map_granularity, 1));
}

sim_storage::~sim_storage() { vmm_->teardown(); }

std::size_t sim_storage::unmaps_in_flight() const noexcept { return vmm_->unmaps_in_flight(); }
std::size_t sim_storage::pending_deallocations() const noexcept {
  return pending_.size() + freeing_.size() + vmm_->pending();
}
std::uint64_t sim_storage::mapped_bytes() const noexcept { return vmm_->mapped_bytes(); }
std::size_t sim_storage::range_count() const noexcept { return vmm_->range_count(); }
std::uint64_t sim_storage::misuses() const noexcept { return misuses_ + vmm_->misuses(); }
std::size_t sim_storage::kept_allocations() const noexcept { return vmm_->kept_allocations(); }
std::uint64_t sim_storage::kept_bytes() const noexcept { return vmm_->kept_bytes(); }
std::uint64_t sim_storage::reused_allocations() const noexcept { return vmm_->reused_allocations(); }

result<memory::event> sim_storage::behind_device() {
  {
    const std::lock_guard lock(mutex_);
    expire_locked();
    if (unpassed_.empty()) return memory::event{0};
  }
  for (const memory::stream_id s : return_after_) {
    if (auto t = record_event(s); t) (void)stream_wait_event(memory::streams::device, *t);
  }
  return record_event(memory::streams::device);
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
  std::uint64_t n = vmm_->returning_bytes();
  for (const memory::storage_id id : pending_) {
    if (auto it = pages_.find(id); it != pages_.end()) n += it->second;
  }
  for (const auto& f : freeing_) {
    if (auto it = pages_.find(f.id); it != pages_.end()) n += it->second;
  }
  return n;
}

void sim_storage::free_now(memory::storage_id id) {
  auto it = pages_.find(id);
  if (it == pages_.end()) return;
  if (on_give_back) on_give_back(given_back{id, 0, it->second});
  allocated_ -= it->second;
  pages_.erase(it);
  ++frees_;
}

result<void> sim_storage::flush() {
  if (!pending_.empty() &&
      std::find(flush_threads_.begin(), flush_threads_.end(), std::this_thread::get_id()) == flush_threads_.end()) {
    flush_threads_.push_back(std::this_thread::get_id());
  }
  if (fail_flush_) {
    fail_flush_ = false;
    error e = error::make(errc::device_error, "injected flush failure");
    e.size = pending_.size();
    return e;
  }
  if (!opts_.streams) {
    for (const memory::storage_id id : pending_) free_now(id);
    pending_.clear();
    return vmm_->flush();
  }
  // As cudaFreeAsync and deferred unmaps on a GPU: memory goes back behind the work queued on the
  // device's stream, after that stream waited for the streams returns wait for; at once when
  // nothing is left to run anywhere.
  if (auto u = vmm_->flush(); !u) return u;
  if (!pending_.empty()) {
    auto behind = behind_device();
    if (!behind) return std::move(behind).err();  // kept for the next flush
    for (const memory::storage_id id : pending_) freeing_.push_back(freeing{id, *behind});
    pending_.clear();
  }
  std::size_t kept = 0;
  for (std::size_t i = 0; i < freeing_.size(); ++i) {
    const freeing f = freeing_[i];
    if (f.after == 0 || has_passed(f.after)) {
      free_now(f.id);
    } else {
      freeing_[kept++] = f;
    }
  }
  freeing_.resize(kept);
  return {};
}

result<void> sim_storage::settle() { return vmm_->settle(); }

result<memory::resource> sim_storage::get(const memory::storage_handle& h) {
  if (vmm_->has_range(h.id)) {
    const std::uint64_t size = vmm_->range_size(h.id);
    if (h.offset > size || h.size > size - h.offset) {
      error e = error::make(errc::invalid_argument, "the view ends past its simulated address range");
      e.size = h.offset + h.size;
      e.limit = size;
      return e;
    }
    if (!vmm_->covered(h.id, h.offset, h.size)) return error::make(errc::invalid_argument, "the view is not mapped");
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
  const memory::storage_id id = next_id_++;
  const std::uint64_t base = next_base_;
  auto r = vmm_->reserve_range(id, size, unit);
  if (r) range_at_.emplace(base, id);
  return r;
}

result<void> sim_storage::map(memory::storage_id id, std::uint64_t offset, std::uint64_t size) {
  if (!vmm_->has_range(id)) return error::make(errc::not_found, "the simulated address range does not exist");
  return vmm_->map(id, offset, size);
}

void sim_storage::unmap(memory::storage_id id, std::uint64_t offset, std::uint64_t size) {
  vmm_->unmap(id, offset, size);
}

void sim_storage::unmap_idle(memory::storage_id id, std::uint64_t offset, std::uint64_t size) {
  vmm_->unmap_idle(id, offset, size);
}

void sim_storage::release_range(memory::storage_id id) { vmm_->release_range(id); }

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
  expire_locked();
  ++issued_;
  unpassed_.emplace(issued_, uid);
  of_.emplace(issued_, uid);
  if (opts_.runs_after.count() > 0) recorded_at_.emplace_back(issued_, std::chrono::steady_clock::now());
  return issued_;
}

void sim_storage::expire_locked() const noexcept {
  if (recorded_at_.empty()) return;
  const auto before = std::chrono::steady_clock::now() - opts_.runs_after;
  while (!recorded_at_.empty() && recorded_at_.front().second <= before) {
    if (auto it = unpassed_.find(recorded_at_.front().first); it != unpassed_.end()) {
      passed_on_[it->second] = std::max(passed_on_[it->second], it->first);
      unpassed_.erase(it);
    }
    recorded_at_.pop_front();
  }
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
  ++queries_;
  expire_locked();
  if (fail_query_) {
    fail_query_ = false;
    return error::make(errc::device_error, "injected event query failure");
  }
  return unpassed_.count(e) == 0;
}

std::uint64_t sim_storage::queries() const noexcept {
  const std::lock_guard lock(mutex_);
  return queries_;
}

bool sim_storage::has_passed(memory::event e) const noexcept {
  const std::lock_guard lock(mutex_);
  expire_locked();
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

result<void> sim_storage::synchronize_stream(memory::stream_id s) {
  auto e = record_event(s);
  if (!e) return std::move(e).err();
  if (*e == 0) return {};  // no streams simulated: nothing is ever queued
  // Events pass in the order recorded, each `runs_after` after its record: once this one is due,
  // everything queued before it on any stream is too (run_until makes sure of it).
  if (opts_.runs_after.count() > 0) std::this_thread::sleep_for(opts_.runs_after);
  run_until(*e);
  return {};
}

void sim_storage::run_until(memory::event e) noexcept {
  const std::lock_guard lock(mutex_);
  expire_locked();
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
  expire_locked();  // a wait for an event that time has passed no longer holds the stream back
  const std::uint64_t uid = uid_locked(s);
  if (uid != 0) progress_locked(uid);
}

void sim_storage::progress_uid(std::uint64_t uid) noexcept {
  const std::lock_guard lock(mutex_);
  expire_locked();
  progress_locked(uid);
}

memory::event sim_storage::issued_events() const noexcept {
  const std::lock_guard lock(mutex_);
  return issued_;
}

memory::event sim_storage::passed_on(memory::stream_id s) {
  const std::lock_guard lock(mutex_);
  expire_locked();
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
  expire_locked();
  return ordered_after_locked(uid, e, 0);
}

result<void> sim_storage::stream_wait_event(memory::stream_id s, memory::event e) {
  const std::lock_guard lock(mutex_);
  expire_locked();
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

result<void> sim_storage::copy_to_host(const memory::storage_handle& h, void* /*dst*/) {
  auto r = get(h);
  if (!r) return std::move(r).err();
  return {};
}

result<void> sim_storage::copy_from_host(const memory::storage_handle& h, const void* /*src*/) {
  auto r = get(h);
  if (!r) return std::move(r).err();
  return {};
}

}  // namespace devrt::devices
