#include "devrt/runtime/device_actor.hpp"

#include <spdlog/spdlog.h>
#include <boost/asio/defer.hpp>
#include <boost/asio/post.hpp>

#include "devrt/runtime/future.hpp"

namespace devrt::runtime {

const char* to_string(device_kind k) noexcept {
  switch (k) {
    case device_kind::host: return "host";
    case device_kind::sim: return "sim";
    case device_kind::cuda: return "cuda";
  }
  return "unknown";
}

// ---- actor_core ----

actor_core::actor_core(std::unique_ptr<memory::memory_manager> manager, std::shared_ptr<spdlog::logger> log,
                       device_info info)
    : manager_(std::move(manager)), log_(std::move(log)), info_(std::move(info)) {}

result<memory::memory_handle> actor_core::reserve(std::uint64_t size, memory::stream_id q, memory::tag_id tag) {
  // The manager reclaims once and retries on out-of-memory (manager_options).
  auto r = manager_->reserve(size, q, tag);
  if (!r) SPDLOG_LOGGER_INFO(log_, "[{}] reserve({}) failed: {}", info_.name, size, r.err().message());
  return r;
}

void actor_core::create(std::uint64_t size, const memory::memory_handle& handle, memory::stream_id q,
                        memory::tag_id tag) {
  // Straight into the client's handle: no second descriptor, no bind.
  auto r = manager_->reserve_into(size, handle, q, tag);
  if (r) return;
  SPDLOG_LOGGER_INFO(log_, "[{}] create({}) failed: {}", info_.name, size, r.err().message());
  handle.raw()->failure = std::make_unique<const error>(std::move(r).err());
}

error actor_core::explain(const error& e, const memory::memory_binding& b) {
  if (e.code != errc::not_found || b.raw() == nullptr || b.raw()->failure == nullptr) return e;
  return *b.raw()->failure;
}

result<memory::resource> actor_core::get_resource(const memory::memory_binding& b, std::optional<std::uint64_t> start,
                                                  std::optional<std::uint64_t> end) {
  auto r = manager_->get_resource(b, start, end);
  if (!r) return explain(r.err(), b);
  return r;
}

result<std::uint64_t> actor_core::size_of(const memory::memory_binding& b) {
  auto s = manager_->get_storage(b);
  if (!s) return explain(s.err(), b);
  return s->size;
}

result<void> actor_core::refuse_in_capture(const memory::memory_binding& b, const char* what) const {
  const memory::stream_id q = b.raw() != nullptr ? b.raw()->stream : memory::streams::device;
  if (!manager_->capturing() || !manager_->backing_storage().ordered()) return {};
  if (q != memory::streams::device && q != memory::streams::none) return {};
  // The copy would be recorded into the graph (and replayed with every launch) while its staging
  // buffer goes back to the pool: refused before anything is enqueued, the graph stays as it is.
  error e = error::make(errc::capture_active,
                        "the device's stream records a capture: a copy on it would become part of the graph; "
                        "copy before capture_begin or after capture_end");
  e.text = what;
  return e;
}

result<void> actor_core::write(const memory::memory_binding& b, const void* src, std::uint64_t size) {
  if (auto c = refuse_in_capture(b, "write"); !c) return c;
  auto s = manager_->get_storage(b);
  if (!s) return explain(s.err(), b);
  if (size > s->size) {
    error e = error::make(errc::invalid_argument, "more bytes written than the allocation holds");
    e.size = size;
    e.limit = s->size;
    return e;
  }
  return manager_->backing_storage().write_on(s->offset_end(s->size - size), src, b.raw()->stream);
}

result<void> actor_core::read(const memory::memory_binding& b, void* dst, std::uint64_t size) {
  if (auto c = refuse_in_capture(b, "read"); !c) return c;
  auto s = manager_->get_storage(b);
  if (!s) return explain(s.err(), b);
  return manager_->backing_storage().read(s->offset_end(s->size - size), dst);
}

result<memory::event> actor_core::read_async(const memory::memory_binding& b, void* dst, std::uint64_t size) {
  if (auto c = refuse_in_capture(b, "read"); !c) return std::move(c).err();
  auto s = manager_->get_storage(b);
  if (!s) return explain(s.err(), b);
  return manager_->backing_storage().read_async(s->offset_end(s->size - size), dst, b.raw()->stream);
}

result<void> actor_core::use_on_device_stream(const memory::memory_binding& b) {
  if (!manager_->backing_storage().ordered() || b.raw() == nullptr || b.raw()->stream == memory::streams::device) {
    return {};
  }
  return manager_->record_stream(b, memory::streams::device);
}

result<void> actor_core::capture_begin() {
  const bool was_capturing = manager_->capturing();
  manager_->capture_begin();
  if (was_capturing) return {};
  if (auto r = manager_->backing_storage().begin_capture(); !r) {
    (void)manager_->capture_end();  // undo: no window without the device's recording
    return r;
  }
  SPDLOG_LOGGER_INFO(log_, "[{}] capture window opened", info_.name);
  return {};
}

result<std::pair<std::vector<memory::memory_handle>, std::shared_ptr<memory::recorded_work>>>
actor_core::capture_end() {
  if (!manager_->capturing()) {
    return error::make(errc::no_capture, "capture_end was called without capture_begin");
  }
  auto work = manager_->backing_storage().end_capture();
  auto pins = manager_->capture_end();
  if (!work) return std::move(work).err();
  if (!pins) return std::move(pins).err();
  SPDLOG_LOGGER_INFO(log_, "[{}] capture window closed: {} slices pinned{}", info_.name, pins->size(),
                     *work ? ", device work recorded" : "");
  return std::make_pair(std::move(*pins), std::move(*work));
}

void actor_core::enter_persistent() {
  if (persistent_depth_++ == 0) manager_->mode(memory::allocation_mode::persistent);
}

void actor_core::exit_persistent() {
  if (persistent_depth_ > 0 && --persistent_depth_ == 0) manager_->mode(memory::allocation_mode::automatic);
}

void actor_core::park(memory::event t, message then) {
  if (t == 0) {
    then.run(*this);
    return;
  }
  parked_.emplace_back(t, std::move(then));
}

void actor_core::park_until_fences(message then) { fence_waiters_.push_back(std::move(then)); }

void actor_core::run_fence_waiters() {
  if (fence_waiters_.empty() || manager_->order().pending()) return;
  if (manager_->order().reclaimable()) {
    // Only memory of streams whose fences failed is left: a synchronization of the device (a
    // counted wait) covers it, on this rare path.
    (void)manager_->reclaim();
  }
  auto waiters = std::move(fence_waiters_);
  fence_waiters_.clear();
  for (auto& m : waiters) {
    try {
      m.run(*this);  // may park itself again
    } catch (...) {
    }
  }
}

bool actor_core::poll_parked() {
  run_fence_waiters();
  auto& store = manager_->backing_storage();
  for (std::size_t i = 0; i < parked_.size();) {
    auto r = store.query_event(parked_[i].first);
    if (r && !*r) {
      ++i;
      continue;
    }
    message m = std::move(parked_[i].second);
    parked_[i] = std::move(parked_.back());
    parked_.pop_back();
    try {
      if (r) {
        m.run(*this);
      } else {
        m.abort(r.err());
      }
    } catch (...) {
      // Messages complete their own errors; nothing may escape the strand.
    }
  }
  return parked();
}

void actor_core::finish_parked() noexcept {
  const error stop = error::make(errc::shutdown, "the runtime shut down before the request was served");
  for (auto& m : fence_waiters_) m.abort(stop);
  fence_waiters_.clear();
  auto& store = manager_->backing_storage();
  for (auto& [t, m] : parked_) (void)store.wait_event(t);
  while (!parked_.empty()) poll_parked();
}

// ---- device_actor ----

device_actor::device_actor(device_info info, std::unique_ptr<memory::memory_manager> manager,
                           boost::asio::any_io_executor completions, std::shared_ptr<spdlog::logger> log,
                           actor_options options)
    : info_(std::move(info)),
      strand_(boost::asio::make_strand(io_.get_executor())),
      work_(boost::asio::make_work_guard(io_.get_executor())),
      completions_(std::move(completions)),
      log_(log),
      idle_spin_(options.idle_spin),
      serve_in_place_(options.serve_in_place),
      core_(std::make_unique<actor_core>(std::move(manager), std::move(log), info_)),
      poll_timer_(strand_) {
  thread_ = std::thread([this] {
    detail::current_device = this;  // futures of this device refuse to block here (future.hpp)
    // The device's calls run here: what they need on the thread is set once, for good (on CUDA the
    // current device, and a capture mode that a client's capture in global mode does not refuse).
    (void)core_->manager().backing_storage().borrow_thread();
    io_.run();
  });
  SPDLOG_LOGGER_INFO(log_, "[{}] memory actor started: {}", info_.name, core_->manager().report());
}

device_actor::~device_actor() { shutdown(); }

void device_actor::post(message m) {
  switch (mailbox_.push(m)) {
    case mailbox::push_result::queued: return;
    case mailbox::push_result::schedule_drain: schedule_drain(); return;
    case mailbox::push_result::closed: m.abort(stopped_error()); return;
  }
}

void device_actor::run_or_post(message m) {
  if (!serve_in_place_) {
    post(std::move(m));
    return;
  }
  switch (mailbox_.claim_or_push(m)) {
    case mailbox::claim_result::queued: return;
    case mailbox::claim_result::closed: m.abort(stopped_error()); return;
    case mailbox::claim_result::claimed: break;
  }
  bool keep = false;
  {
    // The device's calls run on this thread now: it is the device's thread for the futures'
    // deadlock check, and the storage sets what its calls need (and puts back what was there).
    const void* outer = std::exchange(detail::current_device, this);
    memory::storage& store = core_->manager().backing_storage();
    const std::uint64_t saved = store.borrow_thread();
    try {
      m.run(*core_);
    } catch (...) {
      // Messages complete their own errors; nothing may escape.
    }
    processed_.store(processed_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    after_batch(/*in_place=*/true);
    // Work parked on events is polled by the device thread, and the driver calls of queued
    // deallocations are made there too, after this caller has its answer.
    keep = core_->parked() || core_->manager().deallocations_queued();
    store.return_thread(saved);
    detail::current_device = outer;
  }
  served_in_place_.fetch_add(1, std::memory_order_relaxed);
  // What others queued meanwhile goes to the device thread.
  if (mailbox_.release(keep)) schedule_drain();
}

error device_actor::stopped_error() {
  return error::make(errc::shutdown, "the device actor has stopped; no further memory messages are served");
}

void device_actor::schedule_drain() {
  boost::asio::post(strand_, [self = shared_from_this()] { self->drain(); });
}

void device_actor::drain() {
  drains_.fetch_add(1, std::memory_order_relaxed);
  std::size_t budget = drain_budget;
  while (budget > 0) {
    if (next_ == batch_.size()) {
      batch_.clear();
      next_ = 0;
      if (core_ == nullptr) return;
      if (!mailbox_.take(batch_, /*go_idle=*/false)) {
        after_batch();
        if (!spin_for_messages()) {
          // Read before the actor is given up: a caller may run it from then on.
          const bool parked = core_->parked();
          if (!mailbox_.take(batch_)) {
            if (parked) arm_poll();
            return;  // the mailbox is idle; the next push schedules a drain or runs in place
          }
        }
      }
    }
    message& m = batch_[next_++];
    try {
      m.run(*core_);
    } catch (...) {
      // Messages complete their own errors; nothing may escape the strand.
    }
    // Only the actor's runner writes the count: a plain store, no locked instruction per message.
    processed_.store(processed_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    --budget;
  }
  after_batch();
  boost::asio::defer(strand_, [self = shared_from_this()] { self->drain(); });
}

void device_actor::arm_poll() {
  if (poll_armed_ || stopped_.load(std::memory_order_relaxed)) return;
  poll_armed_ = true;
  poll_timer_.expires_after(poll_delay_);
  poll_timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
    self->poll_armed_ = false;
    if (ec || self->core_ == nullptr) return;
    const mailbox::owner before = self->mailbox_.claim_for_device();
    if (before == mailbox::owner::caller) {
      // A caller runs the actor now; it hands the actor to this thread if work is still parked.
      return;
    }
    if (self->core_->poll_parked()) {
      self->poll_delay_ = std::min(self->poll_delay_ * 2, std::chrono::microseconds(1000));
      self->arm_poll();
    } else {
      self->poll_delay_ = std::chrono::microseconds(20);
    }
    self->after_batch();
    if (before == mailbox::owner::device) return;  // the drain already scheduled gives the actor up
    // Give the actor up again, or serve what was queued meanwhile.
    if (self->mailbox_.take(self->batch_)) self->drain();
  });
}

bool device_actor::spin_for_messages() {
  if (idle_spin_.count() <= 0) return false;
  // A message is served in well under a microsecond, while a sleeping thread takes several to
  // wake: polling a little longer than a client's own wake-up keeps round trips short. The strand
  // is held meanwhile; a shutdown ends the polling at once.
  bool taken = false;
  detail::spin_until(
      [this, &taken] {
        if (stopped_.load(std::memory_order_relaxed)) return true;
        taken = mailbox_.maybe_queued() && mailbox_.take(batch_, /*go_idle=*/false);
        if (!taken && core_ != nullptr && core_->parked()) core_->poll_parked();
        return taken;
      },
      idle_spin_);
  return taken;
}

void device_actor::after_batch(bool in_place) {
  if (core_ == nullptr) return;
  if (core_->parked()) core_->poll_parked();
  // Queued deallocations reach the driver after the batch's requests were served, never in
  // front of them, and from the device thread only (a caller serving in place leaves them).
  // Streams are fenced and what their fences allow is freed, without waiting for the device (a
  // caller in place asks the device how far it got only every few batches: batch_end::in_place).
  using memory::memory_manager;
  const auto by = in_place ? memory_manager::batch_end::in_place : memory_manager::batch_end::device_thread;
  if (auto r = core_->manager().end_batch(by); !r) {
    SPDLOG_LOGGER_INFO(log_, "[{}] end of batch: {}", info_.name, r.err().message());
  }
  core_->run_fence_waiters();
}

void device_actor::shutdown() noexcept {
  if (stopped_.exchange(true)) return;
  const error stop = error::make(errc::shutdown, "the runtime shut down before the request was served");
  for (auto& m : mailbox_.close()) m.abort(stop);
  boost::asio::post(strand_, [this, stop] {
    // A caller that runs a message in place finishes it first; none starts after the close.
    while (mailbox_.claim_for_device() == mailbox::owner::caller) std::this_thread::yield();
    for (; next_ < batch_.size(); ++next_) batch_[next_].abort(stop);
    batch_.clear();
    next_ = 0;
    SPDLOG_LOGGER_INFO(log_, "[{}] memory actor stopping", info_.name);
    poll_timer_.cancel();
    if (core_ != nullptr) core_->finish_parked();
    core_.reset();  // returns every page; handles still held elsewhere stay safe to drop
  });
  work_.reset();
  if (!thread_.joinable()) return;
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // the last reference was dropped by a message on the device thread itself
  } else {
    thread_.join();
  }
}

}  // namespace devrt::runtime
