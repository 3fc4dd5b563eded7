#include "devrt/memory/stream_order.hpp"

#include <algorithm>
#include <limits>

namespace devrt::memory {

stream_order::stream_state* stream_order::find(queue_id q) noexcept {
  for (auto& s : streams_) {
    if (s.q == q) return &s;
  }
  return nullptr;
}

const stream_order::stream_state* stream_order::find(queue_id q) const noexcept {
  for (const auto& s : streams_) {
    if (s.q == q) return &s;
  }
  return nullptr;
}

stream_order::stream_state& stream_order::state_of(queue_id q) {
  if (stream_state* s = find(q)) return *s;
  streams_.push_back(stream_state{});
  streams_.back().q = q;
  return streams_.back();
}

std::size_t stream_order::stream_count() const noexcept {
  return static_cast<std::size_t>(
      std::count_if(streams_.begin(), streams_.end(), [](const stream_state& s) { return s.active; }));
}

result<void> stream_order::use(queue_id q) {
  if (!ordered_) return {};
  stream_state* known = find(q);
  if (known != nullptr && known->active) return {};
  // A stream that comes (or comes back: its handle may now name a new stream) must not see memory
  // freed on the streams before it while their work still runs: it waits for all of it first.
  for (auto& s : streams_) {
    if (!s.active || s.q == q) continue;
    auto t = store_.mark(s.q);
    if (!t) return std::move(t).err();
    if (auto j = store_.join(q, *t); !j) return j;
  }
  if (known != nullptr && !known->fences.empty()) {
    // Memory tagged with the old stream of this handle must not reach the new one before the old
    // one's work is done: rare (a stream retired, then a new one with the same handle).
    for (auto& f : known->fences) {
      (void)store_.wait(f.t);
      (void)store_.passed(f.t);
      known->done = f.epoch;
      --pending_fences_;
    }
    known->fences.clear();
    ++waits_;
  }
  const bool others =
      std::any_of(streams_.begin(), streams_.end(), [q](const stream_state& s) { return s.active && s.q != q; });
  if (others || !queue::reusable_in_order(q)) several_ = true;
  stream_state& s = state_of(q);
  s.active = true;
  store_.use_queue(q);
  return {};
}

result<void> stream_order::retire(queue_id q) {
  stream_state* s = find(q);
  if (s == nullptr || !s->active) return {};
  result<void> out;
  if (s->unfenced_epoch != 0) out = fence_one(*s);
  s->active = false;
  store_.retire_queue(q);
  return out;
}

void stream_order::freed_on(queue_id q) {
  stream_state& s = state_of(q);
  s.unfenced_epoch = epoch_;
  ++s.unfenced;
  unfenced_ = true;
}

void stream_order::hold(detail::descriptor* d, const stream_set& streams) {
  const std::uint64_t bytes = d->bytes.load(std::memory_order_relaxed);
  for (const queue_id q : streams) freed_on(q);
  urgent_ = true;  // held memory comes back only through fences
  if (streams.size() == 1) {
    state_of(streams.front()).held.push_back(held_entry{d, epoch_, bytes});
  } else {
    multi_.push_back(multi_entry{d, epoch_, bytes, streams});
  }
  ++held_count_;
  held_bytes_ += bytes;
}

result<void> stream_order::fence_one(stream_state& s) {
  if (!s.active) {
    // Retired: its owner has promised that the stream's work on devrt memory is done.
    s.done = std::max(s.done, s.unfenced_epoch);
    s.unfenced_epoch = 0;
    s.unfenced = 0;
    return {};
  }
  auto t = store_.mark(s.q);
  if (!t) return std::move(t).err();
  s.fences.push_back(fence_entry{*t, s.unfenced_epoch});
  s.unfenced_epoch = 0;
  s.unfenced = 0;
  ++pending_fences_;
  ++fences_;
  return {};
}

result<void> stream_order::fence() {
  if (!unfenced_) return {};
  result<void> out;
  bool left = false;
  for (auto& s : streams_) {
    if (s.unfenced_epoch == 0) continue;
    // One fence in flight per stream: the frees since then wait for it to pass (or for a need).
    if (!urgent_ && (!s.fences.empty() || s.unfenced < fence_after)) {
      left = true;
      continue;
    }
    if (auto r = fence_one(s); !r) {
      left = true;
      if (out) out = std::move(r);
    }
  }
  unfenced_ = left;
  urgent_ = false;
  ++epoch_;
  return out;
}

bool stream_order::poll() {
  if (pending_fences_ == 0) return false;
  bool advanced = false;
  for (auto& s : streams_) {
    while (!s.fences.empty()) {
      auto r = store_.passed(s.fences.front().t);
      // A device error is sticky: the work will never run, so the memory is no longer in use.
      if (r && !*r) break;
      s.done = s.fences.front().epoch;
      s.fences.pop_front();
      --pending_fences_;
      advanced = true;
    }
  }
  return advanced;
}

bool stream_order::wait_all() {
  if (!pending()) return false;
  (void)fence();
  bool waited = false;
  for (auto& s : streams_) {
    for (auto& f : s.fences) {
      (void)store_.wait(f.t);
      (void)store_.passed(f.t);
      s.done = f.epoch;
      --pending_fences_;
      waited = true;
    }
    s.fences.clear();
    // What could not be fenced (a failed record) is waited for as the whole device.
    if (s.unfenced_epoch != 0) {
      s.done = std::max(s.done, s.unfenced_epoch);
      s.unfenced_epoch = 0;
      s.unfenced = 0;
    }
  }
  unfenced_ = false;
  if (waited) ++waits_;
  return true;
}

std::uint64_t stream_order::done(queue_id q) const noexcept {
  const stream_state* s = find(q);
  return s != nullptr ? s->done : 0;
}

bool stream_order::ready(const multi_entry& m) const noexcept {
  return std::all_of(m.streams.begin(), m.streams.end(), [&](queue_id q) { return done(q) >= m.epoch; });
}

}  // namespace devrt::memory
