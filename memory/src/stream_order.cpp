#include "devrt/memory/stream_order.hpp"

#include <algorithm>
#include <utility>

namespace devrt::memory {

namespace detail {

void record_free_fences(const descriptor* d) noexcept {
  if (d->stream_reg != nullptr && d->stream_reg->fence) d->stream_reg->fence->record();
  if (d->more_streams != nullptr) {
    for (stream_state* s : d->more_streams->streams) {
      if (s->fence) s->fence->record();
    }
  }
}

}  // namespace detail

namespace {

stream_kind kind_of(stream_id s) noexcept {
  switch (s) {
    case streams::none:
    case streams::device: return stream_kind::device;
    case streams::legacy: return stream_kind::legacy;
    case streams::per_thread: return stream_kind::per_thread;
    default: return stream_kind::native;
  }
}

stream_id handle_of(stream_kind k, stream_id s) noexcept {
  switch (k) {
    case stream_kind::device: return streams::device;
    case stream_kind::legacy: return streams::legacy;
    case stream_kind::per_thread: return streams::per_thread;
    case stream_kind::native: return s;
  }
  return s;
}

}  // namespace

stream_order::stream_order(storage& store) : store_(store), ordered_(store.ordered()) {}

stream_order::~stream_order() {
  for (auto& r : registrations_) {
    for (const auto& f : r->fences) store_.release_event(f.e);
  }
  store_.release_event(transition_);
}

stream_state* stream_order::find(stream_id s) {
  const stream_kind k = kind_of(s);
  if (k != stream_kind::native) return fixed(k);
  auto id = store_.identify(s);
  if (!id) return nullptr;
  auto it = by_uid_.find(id->uid);
  return it != by_uid_.end() ? it->second : nullptr;
}

result<stream_state*> stream_order::enter(stream_id s) {
  if (!ordered_) return static_cast<stream_state*>(nullptr);
  const stream_kind k = kind_of(s);
  if (k != stream_kind::native) {
    if (stream_state* st = fixed(k)) return st;
    return make(handle_of(k, s), k, stream_identity{});
  }
  auto id = store_.identify(s);
  if (!id) return std::move(id).err();
  if (auto it = by_uid_.find(id->uid); it != by_uid_.end()) {
    it->second->retired = false;  // used again after a retire: it was not destroyed after all
    return it->second;
  }
  return make(s, k, *id);
}

result<stream_state*> stream_order::make(stream_id s, stream_kind k, const stream_identity& id) {
  auto st = std::make_unique<stream_state>();
  st->handle = s;
  st->kind = k;
  st->uid = id.uid;
  st->device = id.device;
  st->foreign = id.foreign;
  if (k == stream_kind::native) {
    auto f = store_.make_free_fence(s, id);
    if (!f) return std::move(f).err();
    st->fence = std::move(*f);
  }
  // While frees are immediate, a new stream other than the first must not see memory the first
  // one freed while its work may still use it: a fence on the first stream, which every stream
  // registered until it passes waits for.
  const bool first = !tagged_ && first_ == nullptr && (k == stream_kind::device || k == stream_kind::legacy);
  event recorded = 0;
  if (!tagged_ && !first && first_ != nullptr) {
    auto t = store_.record_event(first_->handle);
    if (!t) {
      error e = std::move(t).err();
      if (e.code == errc::capture_active) {
        e.detail =
            "a stream used for the first time while the device's stream records a capture: use it once "
            "before capture_begin";
      }
      return e;
    }
    recorded = *t;
  }
  const event wait_for = recorded != 0 ? recorded : transition_;
  if (!first && wait_for != 0) {
    if (auto w = store_.stream_wait_event(s, wait_for); !w) {
      store_.release_event(recorded);
      return std::move(w).err();
    }
  }
  // Committed from here on.
  if (recorded != 0) transition_ = recorded;
  if (first) {
    first_ = st.get();
    // Its frees are reused by no one else, but memory goes back to the driver behind its work.
    if (k == stream_kind::legacy) store_.return_after(streams::legacy);
  } else {
    tagged_ = true;
  }
  st->serial = next_serial_++;
  st->slot = registrations_.size();
  stream_state* raw = st.get();
  registrations_.push_back(std::move(st));
  by_serial_.emplace(raw->serial, raw);
  if (k == stream_kind::native) {
    by_uid_.emplace(raw->uid, raw);
    candidate(*raw);  // forgotten again if no allocation comes to refer to it
  } else {
    fixed_[static_cast<std::size_t>(k)] = raw;
  }
  return raw;
}

result<void> stream_order::retire(stream_id s) {
  if (!ordered_ || kind_of(s) != stream_kind::native) return {};
  stream_state* st = find(s);
  if (st == nullptr) return {};
  // Its frees so far get their fence now (with everyone else's: a fence is only ever taken at the
  // close of an epoch).
  urgent_ = true;
  (void)fence();  // another stream's failure is the batch's to report
  st->retired = true;
  candidate(*st);
  if (st->broken) {
    error e = error::make(errc::device_error,
                          "a free on the stream could not be recorded (was it destroyed before its memory was freed?): "
                          "that memory comes back only after a synchronization of the device");
    e.text = "stream " + std::to_string(s);
    return e;
  }
  return {};
}

void stream_order::unref(stream_state& s) {
  if (s.refs > 0) --s.refs;
  if (s.refs == 0) candidate(s);
}

void stream_order::candidate(stream_state& s) {
  if (s.kind != stream_kind::native || s.candidate) return;
  s.candidate = true;
  candidates_.push_back(&s);
}

void stream_order::freed_on(stream_state& s) {
  if (!s.broken && !s.on_unfenced_list) {
    s.on_unfenced_list = true;
    unfenced_list_.push_back(&s);
  }
  s.unfenced_epoch = epoch_;
  ++s.unfenced;
  s.last_free_epoch = epoch_;
  if (!s.broken) unfenced_ = true;
}

void stream_order::hold(detail::descriptor* d) {
  const std::uint64_t bytes = d->bytes.load(std::memory_order_relaxed);
  d->held = true;
  freed_on(*d->stream_reg);
  if (d->more_streams != nullptr) {
    for (stream_state* s : d->more_streams->streams) freed_on(*s);
  }
  urgent_ = true;  // held memory comes back only through fences
  if (d->more_streams == nullptr) {
    d->stream_reg->held.push_back(stream_state::held_entry{d, epoch_, bytes});
  } else {
    multi_.push_back(stream_state::held_entry{d, epoch_, bytes});
  }
  ++held_count_;
  held_bytes_ += bytes;
}

void stream_order::mark_broken(stream_state& s) noexcept {
  if (s.broken) return;
  s.broken = true;
  ++broken_;
}

void stream_order::advance(stream_state& s, std::uint64_t epoch) noexcept {
  if (epoch <= s.done) return;
  s.done = epoch;
  if (!s.advanced) {
    s.advanced = true;
    advanced_.push_back(&s);
  }
  if (s.refs == 0) candidate(s);
}

void stream_order::note_pending(stream_state& s) {
  ++pending_fences_;
  ++fences_;
  if (!s.on_pending_list) {
    s.on_pending_list = true;
    pending_list_.push_back(&s);
  }
}

result<void> stream_order::fence_one(stream_state& s) {
  if (s.kind == stream_kind::native) {
    auto t = s.fence->take();
    if (!t) {
      // A free's record failed (its stream was destroyed first, or is being captured): those
      // frees are not behind any event. Only a synchronization of the device covers them now.
      mark_broken(s);
      return std::move(t).err();
    }
    if (*t == 0) {
      // Nothing recorded since the last take: every free so far recorded before it, so the event
      // taken then covers them.
      if (!s.fences.empty()) {
        s.fences.back().epoch = s.unfenced_epoch;
      } else {
        advance(s, s.unfenced_epoch);
      }
    } else {
      s.fences.push_back(stream_state::fence_entry{*t, s.unfenced_epoch});
      note_pending(s);
    }
  } else {
    // The device's own, legacy and per-thread streams live as long as the device: recorded now.
    auto t = store_.record_event(s.handle);
    if (!t) return std::move(t).err();  // stays unfenced; retried at the next batch
    s.fences.push_back(stream_state::fence_entry{*t, s.unfenced_epoch});
    note_pending(s);
  }
  s.unfenced_epoch = 0;
  s.unfenced = 0;
  return {};
}

result<void> stream_order::fence() {
  // The epoch closes whatever happens: a free made after this belongs to a newer epoch than every
  // fence taken (or synchronization made) up to here, so nothing covers it by mistake.
  if (!unfenced_) {
    ++epoch_;
    urgent_ = false;
    return {};
  }
  result<void> out;
  std::size_t keep = 0;
  for (std::size_t i = 0; i < unfenced_list_.size(); ++i) {
    stream_state* s = unfenced_list_[i];
    if (s->unfenced_epoch == 0 || s->broken) {
      s->on_unfenced_list = false;
      continue;
    }
    // One fence in flight per stream: the frees since then wait for it to pass (or for a need).
    if (!urgent_ && (!s->fences.empty() || s->unfenced < fence_after)) {
      unfenced_list_[keep++] = s;
      continue;
    }
    if (auto r = fence_one(*s); !r) {
      if (out) out = std::move(r);
      if (!s->broken) {
        unfenced_list_[keep++] = s;
        continue;
      }
    }
    s->on_unfenced_list = false;
  }
  unfenced_list_.resize(keep);
  unfenced_ = keep > 0;
  urgent_ = false;
  ++epoch_;
  return out;
}

bool stream_order::poll() {
  if (transition_ != 0) {
    auto r = store_.query_event(transition_);
    if (!r || *r) transition_ = 0;  // passed (or the device failed, and the event with it)
  }
  if (pending_fences_ == 0) return !advanced_.empty();
  std::size_t keep = 0;
  for (std::size_t i = 0; i < pending_list_.size(); ++i) {
    stream_state* s = pending_list_[i];
    while (!s->fences.empty()) {
      const stream_state::fence_entry f = s->fences.front();
      auto r = store_.query_event(f.e);
      if (r && !*r) break;
      s->fences.pop_front();
      --pending_fences_;
      if (!r) {
        // The event is gone with the error: nothing says the frees passed.
        mark_broken(*s);
        s->unfenced_epoch = std::max(s->unfenced_epoch, f.epoch);
        continue;
      }
      advance(*s, f.epoch);
    }
    if (s->fences.empty()) {
      s->on_pending_list = false;
    } else {
      pending_list_[keep++] = s;
    }
  }
  pending_list_.resize(keep);
  return !advanced_.empty();
}

result<void> stream_order::order_device_after_all() {
  if (!ordered_) return {};
  urgent_ = true;
  if (auto f = fence(); !f) return f;
  bool synchronize = false;
  bool legacy_done = false;
  const auto follow = [&](stream_id q) -> result<void> {
    auto e = store_.record_event(q);
    if (!e) return std::move(e).err();
    auto w = store_.stream_wait_event(streams::device, *e);
    store_.release_event(*e);
    return w;
  };
  for (const auto& r : registrations_) {
    stream_state& s = *r;
    if (s.broken) {
      synchronize = true;
      continue;
    }
    switch (s.kind) {
      case stream_kind::device: break;  // the stream itself
      case stream_kind::legacy:
      case stream_kind::per_thread:  // a blocking stream: the legacy stream orders it
        if (!legacy_done) {
          if (auto f = follow(streams::legacy); !f) return f;
          legacy_done = true;
        }
        break;
      case stream_kind::native: {
        if (s.foreign) {
          synchronize = true;
          break;
        }
        auto id = store_.identify(s.handle);
        if (id && id->uid == s.uid) {
          if (auto f = follow(s.handle); !f) return f;
        } else if (s.refs == 0 && !s.fences.empty()) {
          // Gone, with only frees left: its newest fence follows all of them.
          if (auto w = store_.stream_wait_event(streams::device, s.fences.back().e); !w) return w;
        } else if (s.refs != 0) {
          synchronize = true;  // gone with live memory on it: nothing left to order after
        }
        break;
      }
    }
  }
  if (synchronize) {
    if (auto w = store_.synchronize_device(); !w) return w;
    ++waits_;
  }
  return {};
}

bool stream_order::wait_all() {
  if (!reclaimable()) return false;
  urgent_ = true;
  (void)fence();
  bool waited = false;
  for (stream_state* s : pending_list_) {
    for (const auto& f : s->fences) {
      waited = true;
      if (auto w = store_.wait_event(f.e); w) {
        (void)store_.query_event(f.e);  // passed: gives the event back
        advance(*s, f.epoch);
      } else {
        store_.release_event(f.e);
        mark_broken(*s);
        s->unfenced_epoch = std::max(s->unfenced_epoch, f.epoch);
      }
      --pending_fences_;
    }
    s->fences.clear();
    s->on_pending_list = false;
  }
  pending_list_.clear();
  // What no event covers (a record or query that failed): the whole device, destroyed streams
  // included, has done what was queued before this.
  if (broken_ > 0 || unfenced_) {
    if (store_.synchronize_device()) {
      waited = true;
      for (auto& r : registrations_) {
        stream_state& s = *r;
        if (!s.broken && s.unfenced_epoch == 0) continue;
        advance(s, std::max(s.last_free_epoch, s.unfenced_epoch));
        s.unfenced_epoch = 0;
        s.unfenced = 0;
        s.on_unfenced_list = false;
      }
      unfenced_list_.clear();
      unfenced_ = false;
    }
  }
  if (waited) ++waits_;
  return true;
}

std::uint64_t stream_order::done(std::uint64_t serial) const noexcept {
  auto it = by_serial_.find(serial);
  return it != by_serial_.end() ? it->second->done : 0;
}

bool stream_order::ready(const detail::descriptor* d, std::uint64_t epoch) const noexcept {
  if (d->stream_reg != nullptr && d->stream_reg->done < epoch) return false;
  if (d->more_streams != nullptr) {
    for (const stream_state* s : d->more_streams->streams) {
      if (s->done < epoch) return false;
    }
  }
  return true;
}

std::string stream_order::describe() const {
  static const char* const kinds[] = {"device", "legacy", "per-thread", "native"};
  std::string out;
  for (const auto& r : registrations_) {
    out += std::string(kinds[static_cast<int>(r->kind)]) + " #" + std::to_string(r->serial) + ": refs " +
           std::to_string(r->refs) + ", done " + std::to_string(r->done) + ", last free " +
           std::to_string(r->last_free_epoch) + ", unfenced " + std::to_string(r->unfenced_epoch) + ", fences " +
           std::to_string(r->fences.size()) + ", held " + std::to_string(r->held.size()) +
           (r->broken ? ", broken" : "") + (r->retired ? ", retired" : "") + "\n";
  }
  out += "held for several streams: " + std::to_string(multi_.size()) + ", epoch " + std::to_string(epoch_) + "\n";
  return out;
}

void stream_order::collect() {
  std::size_t keep = 0;
  for (std::size_t i = 0; i < candidates_.size(); ++i) {
    stream_state* s = candidates_[i];
    if (s->refs > 0) {
      s->candidate = false;  // listed again when its last reference goes
      continue;
    }
    const bool idle = s->fences.empty() && s->unfenced_epoch == 0 && s->held.empty() && s->done >= s->last_free_epoch &&
                      !s->advanced && !s->on_unfenced_list && !s->on_pending_list;
    if (!idle) {
      candidates_[keep++] = s;  // its memory is still on its way back
      continue;
    }
    if (s->broken) --broken_;
    by_uid_.erase(s->uid);
    by_serial_.erase(s->serial);
    const std::size_t at = s->slot;
    if (at + 1 != registrations_.size()) {
      registrations_[at] = std::move(registrations_.back());
      registrations_[at]->slot = at;
    }
    registrations_.pop_back();  // `s` is gone from here on
  }
  candidates_.resize(keep);
}

}  // namespace devrt::memory
