#include "devrt/memory/memory_manager.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <thread>
#include <type_traits>

namespace devrt::memory {

namespace {

template <class F>
decltype(auto) visit_pool(dynamic_pool& p, F&& f) {
  return std::visit([&](auto& ptr) -> decltype(auto) { return f(*ptr); }, p);
}
template <class F>
decltype(auto) visit_pool(const dynamic_pool& p, F&& f) {
  return std::visit([&](const auto& ptr) -> decltype(auto) { return f(*ptr); }, p);
}

std::vector<pool_options> resolve_or_throw(const memory_layout& layout, const device_properties& props) {
  auto r = resolve_layout(layout, props);
  if (!r) throw exception(std::move(r).err());
  return std::move(r).value();
}

}  // namespace

template <class F>
void memory_manager::for_each_pool(F&& f) {
  for (auto& p : pools_) f(p);
  for (auto& t : tags_) {
    if (t != nullptr && t->arena() != nullptr) f(t->pool);
  }
}
template <class F>
void memory_manager::for_each_pool(F&& f) const {
  for (const auto& p : pools_) f(p);
  for (const auto& t : tags_) {
    if (t != nullptr && t->arena() != nullptr) f(t->pool);
  }
}

memory_manager::memory_manager(storage store, manager_options opts)
    : store_(std::move(store)),
      opts_(std::move(opts)),
      props_(store_.properties()),
      order_(store_),
      ctx_{store_, stats_, queue_, 0, &order_, streams::none},
      persistent_(store_.alignment()) {
  ctx_.history = &history_;
  ctx_.reuse_streams = [](void* self) { return static_cast<memory_manager*>(self)->reuse_fenced(); };
  ctx_.reuse_owner = this;
  ctx_.set_limit(opts_.memory_limit, props_.capacity);
  layout_ = resolve_or_throw(opts_.layout, props_);
  build_pools(layout_);
  mode_ = opts_.mode.value_or(opts_.policy == persistent_policy::enforced ? allocation_mode::persistent
                                                                          : allocation_mode::automatic);
}

result<std::unique_ptr<memory_manager>> memory_manager::create(storage store, manager_options opts) {
  auto layout = resolve_layout(opts.layout, store.properties());
  if (!layout) return std::move(layout).err();
  return std::make_unique<memory_manager>(std::move(store), std::move(opts));
}

memory_manager::~memory_manager() {
  process_releases();
  // Teardown is the one place that waits for the device: every stream's work on the memory, that
  // of streams destroyed already included, is done before any of it goes back.
  if (order_.ordered() && !capture_) (void)store_.synchronize_device();
  // The storage orders its teardown after the device's work: held slices go back as they are.
  order_.release_all([this](detail::descriptor* d) {
    stats_.bytes_in_use += d->bytes.load(std::memory_order_relaxed);
    d->held = false;
    release_streams(d);
    release_to_pool(d, 0);
  });
  ctx_.detached_in_flight = 0;
  release_pools();
  release_tag_spaces();
  persistent_.release_all(ctx_);
  (void)store_.flush();
  // A drop that was handing a descriptor to the queue when its slice was detached finishes its
  // push within a few instructions; wait for those pushes so no descriptor leaks.
  while (ctx_.detached_in_flight > 0) {
    detail::descriptor* d = queue_.take_all();
    if (d == nullptr) {
      std::this_thread::yield();
      continue;
    }
    while (d != nullptr) {
      detail::descriptor* next = d->next_released;
      release_one(d);
      --ctx_.detached_in_flight;
      d = next;
    }
  }
}

void memory_manager::build_pools(const std::vector<pool_options>& layout) {
  pools_.clear();
  only_arena_ = nullptr;
  pools_.reserve(layout.size());
  const std::uint64_t align = store_.alignment();
  for (std::size_t i = 0; i < layout.size(); ++i) {
    const auto index = static_cast<std::uint8_t>(i);
    switch (layout[i].kind) {
      case pool_kind::sliced: pools_.emplace_back(std::make_unique<sliced_pool>(layout[i], align, index)); break;
      case pool_kind::exclusive: pools_.emplace_back(std::make_unique<exclusive_pool>(layout[i], align, index)); break;
      case pool_kind::arena: pools_.emplace_back(std::make_unique<arena_pool>(layout[i], align, index)); break;
    }
  }
  if (pools_.size() == 1) {
    if (auto* a = std::get_if<std::unique_ptr<arena_pool>>(&pools_.front())) only_arena_ = a->get();
  }
}

void memory_manager::release_pools() {
  for (auto& p : pools_) visit_pool(p, [&](auto& pool) { pool.release_all(ctx_); });
  pools_.clear();
  only_arena_ = nullptr;
}

void memory_manager::release_one(detail::descriptor* d) {
  constexpr std::uint64_t queue_ref = detail::descriptor::queued_bit | detail::descriptor::one_ref;
  // Attached and queued, two references: the queue's and the slice's.
  constexpr std::uint64_t queue_and_slice = detail::descriptor::attached_bit + queue_ref + detail::descriptor::one_ref;
  static_assert(detail::descriptor::total(queue_and_slice) == 2);
  std::uint64_t now = d->state.load(std::memory_order_acquire);
  if (now == queue_and_slice) {
    // Only the queue's reference and the slice's are left: no other thread holds the descriptor,
    // so none can change its state, and a plain store drops the queue's reference.
    now -= queue_ref;
    d->state.store(now, std::memory_order_relaxed);
  } else {
    now = d->state.fetch_sub(queue_ref, std::memory_order_acq_rel) - queue_ref;
  }
  if ((now & detail::descriptor::attached_bit) == 0) {
    // Detached while queued (bind replaced it, or its pool was released): drop the queue's
    // reference only.
    if (detail::descriptor::total(now) == 0) detail::descriptor::destroy(d);
    return;
  }
  if (detail::descriptor::total(now) != 1) return;  // referenced again since the drop
  // Held already (a capture pinned it again and the pin was dropped): its entry waits for fences
  // that cover this drop too, since the pin only kept the memory for the device's own stream.
  if (d->held) return;
  std::uint64_t traced = 0;
  if (history_.enabled()) {
    traced = trace_address(d);
    history_.add(trace_action::free_requested, traced, d->bytes.load(std::memory_order_relaxed), d->stream);
  }
  const auto completed = [&] {
    if (history_.enabled()) {
      history_.add(trace_action::free_completed, traced, d->bytes.load(std::memory_order_relaxed), d->stream);
    }
  };
  if (order_.ordered() && d->stream_reg != nullptr && (order_.tagged() || d->more_streams != nullptr)) {
    const bool arena = d->loc.pool != location::persistent_pool &&
                       std::holds_alternative<std::unique_ptr<arena_pool>>(pool_at(d->loc.pool));
    if (d->more_streams == nullptr && arena && streams::reusable_in_order(d->stream)) {
      // Free at once for its own stream, for the others once the stream's fence has passed.
      stream_state& own = *d->stream_reg;
      order_.freed_on(own);
      const std::uint64_t tag = own.serial;
      completed();
      release_streams(d);
      release_to_pool(d, tag);
      return;
    }
    // Kept live in its pool until every stream's fence has passed; no longer in use for the user.
    stats_.bytes_in_use -= d->bytes.load(std::memory_order_relaxed);
    order_.hold(d);
    return;
  }
  completed();
  release_streams(d);
  release_to_pool(d, 0);
}

std::uint64_t memory_manager::trace_address(const detail::descriptor* d) {
  auto v = find(d);
  if (!v) return reinterpret_cast<std::uintptr_t>(d->address.load(std::memory_order_relaxed));  // NOLINT
  return snapshot_address(store_, v->storage.id, v->storage.offset);
}

namespace {

/// The live bytes of sleeping tags: they count as in use but hold no device memory.
template <class Tags>
std::uint64_t sleeping_in_use(const Tags& tags) {
  std::uint64_t n = 0;
  for (const auto& t : tags) {
    if (t != nullptr && t->state == tag_state::asleep) n += t->bytes_in_use;
  }
  return n;
}

std::string stream_name(stream_id q) {
  switch (q) {
    case streams::none: return "none";
    case streams::legacy: return "the legacy default stream";
    case streams::per_thread: return "the per-thread default stream";
    case streams::device: return "the device's own stream";
    default: return fmt::format("stream {:#x}", q);
  }
}

}  // namespace

void memory_manager::explain_out_of_memory(error& e, std::uint64_t size, stream_id q) {
  if (q == streams::none) q = streams::device;
  const std::optional<std::uint64_t> device_free = store_.device_free();
  history_.add(trace_action::oom, 0, size, q, device_free.value_or(0));
  const memory_snapshot snap = snapshot();
  const memory_statistics& st = snap.statistics;
  std::uint64_t free_in_pools = 0;
  std::uint64_t largest_free = 0;
  std::vector<const snapshot_block*> live;
  for (const auto& seg : snap.segments) {
    for (const auto& b : seg.blocks) {
      if (b.state == block_state::free) {
        free_in_pools += b.size;
        largest_free = std::max(largest_free, b.size);
      } else if (b.state == block_state::allocated) {
        live.push_back(&b);
      }
    }
  }
  constexpr std::size_t shown = 10;
  const std::size_t n = std::min(shown, live.size());
  std::partial_sort(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(n), live.end(),
                    [](const snapshot_block* a, const snapshot_block* b) {
                      return a->requested_size != b->requested_size ? a->requested_size > b->requested_size
                                                                    : a->sequence < b->sequence;
                    });
  const std::uint64_t asleep_in_use = sleeping_in_use(tags_);
  const std::uint64_t awake_in_use = st.bytes_in_use - std::min(st.bytes_in_use, asleep_in_use);
  std::string out =
      fmt::format("request: {} ({} bytes) on {}, {}\n", format_bytes(size), size, opts_.name, stream_name(q));
  out += fmt::format(
      "device: capacity {}, free {}{}\n", props_.capacity != 0 ? format_bytes(props_.capacity) : std::string("unknown"),
      device_free ? format_bytes(*device_free) : std::string("unknown"),
      ctx_.limit != 0 ? fmt::format(", devrt's memory limit {}", format_bytes(ctx_.limit)) : std::string());
  out += fmt::format(
      "devrt: reserved {}, in use {} in {} allocations{}, returning {}, held for streams {}, free in its pools {} "
      "(largest free block {})\n",
      format_bytes(st.bytes_reserved), format_bytes(awake_in_use), live.size(),
      asleep_in_use != 0 ? fmt::format(" (and {} asleep, not on the device)", format_bytes(asleep_in_use))
                         : std::string(),
      format_bytes(st.bytes_returning), format_bytes(st.bytes_held_for_streams), format_bytes(free_in_pools),
      format_bytes(largest_free));
  if (n != 0) {
    out += fmt::format("the {} largest live allocations (of {}):\n", n, live.size());
    for (std::size_t i = 0; i < n; ++i) {
      const snapshot_block& b = *live[i];
      out += fmt::format("  {:>2}. {:>10} ({} bytes) at {:#x}, {}, reserve #{} of {}\n", i + 1,
                         format_bytes(b.requested_size), b.requested_size, b.address, stream_name(b.stream), b.sequence,
                         st.reserves);
    }
  }
  // What to do, by the cause the figures show.
  if (ctx_.limit != 0 && e.text == "memory limit") {
    out += fmt::format(
        "hint: the memory limit ({}) is reached, not the device's memory: raise it (devrt_set_memory_limit, "
        "DEVRT_MEMORY_LIMIT) or free memory; devrt holds {} with what is on its way back\n",
        format_bytes(ctx_.limit), format_bytes(st.bytes_reserved + st.bytes_returning));
  } else if (free_in_pools >= size && largest_free < size) {
    out += fmt::format(
        "hint: fragmentation, not the live size: {} are free in devrt's pools, but no free block is as large as "
        "the request; an arena layout (the default where the device maps memory) places allocations without "
        "this, and a cleanup (empty_cache) gives whole free pages back\n",
        format_bytes(free_in_pools));
  } else if (st.bytes_returning + st.bytes_held_for_streams >= size) {
    out += fmt::format(
        "hint: {} are freed but still behind queued work on streams; the memory comes back once that work is "
        "done (synchronize the streams, then retry)\n",
        format_bytes(st.bytes_returning + st.bytes_held_for_streams));
  } else if (device_free && props_.capacity != 0 && st.bytes_reserved + *device_free + size <= props_.capacity &&
             *device_free < size) {
    out += fmt::format(
        "hint: devrt holds {} of the device's {}; the rest is held outside devrt (another allocator or "
        "process, the CUDA context)\n",
        format_bytes(st.bytes_reserved), format_bytes(props_.capacity));
  } else if (props_.capacity != 0 && awake_in_use + size > props_.capacity) {
    out +=
        "hint: the live allocations and the request need more than the device has: free some of them, or "
        "use smaller requests\n";
  } else if (props_.capacity != 0 && awake_in_use + size > props_.capacity - props_.capacity / 20) {
    out +=
        "hint: the live allocations and the request need nearly all of the device: free some of them, or use "
        "smaller requests\n";
  } else {
    out +=
        "hint: the device refused memory the live allocations leave room for: memory held outside devrt, "
        "memory still on its way back, or the device's reason in brackets above\n";
  }
  e.context = std::move(out);
}

void memory_manager::record_history(bool on, std::size_t max_entries) { history_.enable(on, max_entries); }

memory_snapshot memory_manager::snapshot() {
  memory_snapshot out;
  out.device = opts_.name;
  out.statistics = statistics();
  persistent_.snapshot(store_, out.segments);
  for (const auto& p : pools_) visit_pool(p, [&](const auto& pool) { pool.snapshot(store_, out.segments); });
  // A tag's arena is named by its tag.
  for (const auto& t : tags_) {
    if (t == nullptr || t->arena() == nullptr) continue;
    const std::size_t first = out.segments.size();
    t->arena()->snapshot(store_, out.segments);
    for (std::size_t i = first; i < out.segments.size(); ++i) {
      out.segments[i].pool = fmt::format("tag '{}'", tag_of(t->id).view());
    }
  }
  std::sort(out.segments.begin(), out.segments.end(),
            [](const snapshot_segment& a, const snapshot_segment& b) { return a.address < b.address; });
  out.trace = history_.entries();
  out.trace_dropped = history_.dropped();
  return out;
}

void memory_manager::release_streams(detail::descriptor* d) {
  d->fence_at_free = false;
  if (d->stream_reg != nullptr) {
    order_.unref(*d->stream_reg);
    d->stream_reg = nullptr;
  }
  if (d->more_streams != nullptr) {
    for (stream_state* s : d->more_streams->streams) order_.unref(*s);
    delete d->more_streams;
    d->more_streams = nullptr;
  }
}

void memory_manager::release_to_pool(detail::descriptor* d, std::uint64_t tag) {
  const location loc = d->loc;
  if (tag_space* t = find_space(d->tag)) {
    t->bytes_in_use -= d->bytes.load(std::memory_order_relaxed);
    --t->allocations;
    d->tag = 0;
  }
  const bool over_limit = give_back_over_limit();
  if (loc.pool == location::persistent_pool) {
    persistent_.release(ctx_, loc);
    if (over_limit) persistent_.cleanup(ctx_, true);
  } else {
    visit_pool(pool_at(loc.pool), [&](auto& pool) {
      if constexpr (std::is_same_v<std::decay_t<decltype(pool)>, arena_pool>) {
        pool.release(ctx_, loc, tag, order_.epoch());
      } else {
        pool.release(ctx_, loc);
      }
      if (over_limit) pool.cleanup(ctx_, true);
    });
  }
}

void memory_manager::harvest(bool complete_owed) {
  order_.release_ready([this](detail::descriptor* d) {
    const std::uint64_t bytes = d->bytes.load(std::memory_order_relaxed);
    stats_.bytes_in_use += bytes;  // the pool's release takes it off again
    d->held = false;
    // Pinned again (a capture window): in use once more; its next drop holds it anew.
    if (detail::descriptor::total(d->state.load(std::memory_order_acquire)) != 1) return;
    if (history_.enabled()) history_.add(trace_action::free_completed, trace_address(d), bytes, d->stream);
    release_streams(d);
    release_to_pool(d, 0);
  });
  bool freed = false;
  for_each_pool([&](dynamic_pool& p) {
    if (auto* a = std::get_if<std::unique_ptr<arena_pool>>(&p)) freed = (*a)->harvest(ctx_, false) || freed;
  });
  order_.collect();
  if (complete_owed && cleanup_owed_ && !capture_) {
    // What an explicit cleanup could not give back because streams still used it.
    persistent_.cleanup(ctx_, true);
    for_each_pool([&](dynamic_pool& pool) { visit_pool(pool, [&](auto& x) { x.cleanup(ctx_, true); }); });
    cleanup_owed_ = order_.reclaimable();
  }
  // Memory freed on a stream goes back once its fence has passed, as memory freed on the device's
  // own stream does (release_to_pool).
  if (freed && give_back_over_limit()) {
    for_each_pool([&](dynamic_pool& pool) { visit_pool(pool, [&](auto& x) { x.cleanup(ctx_, true); }); });
  }
}

bool memory_manager::reuse_fenced() {
  if (!order_.ordered() || !order_.pending() || capture_) return false;
  order_.want_fences();
  (void)order_.fence();  // a failed record leaves the frees unfenced, to be fenced later
  // Memory is wanted: the frees made from here on are fenced at the end of the batch too.
  order_.want_fences();
  busy_polled_ = true;
  unpolled_batches_ = 0;
  if (!order_.poll() && !order_.advanced()) return false;
  harvest(false);
  return true;
}

void memory_manager::note_busy() noexcept {
  // Every fence was taken and queried just before: what still waits for one is busy. (A free
  // made since the poll is counted too, a little early; a reserve makes none.)
  const std::uint64_t busy = stats_.bytes_in_use + order_.held_bytes() + pending_dynamic_bytes();
  busy_peak_ = std::max(busy_peak_, busy);
}

void memory_manager::publish(detail::descriptor* d, std::uint64_t size, stream_id q, stream_state* reg, tag_id tag) {
  d->stream = q;
  d->tag = tag;
  if (tag != 0) {
    tag_space& t = space_of(tag);
    t.bytes_in_use += size;
    ++t.allocations;
    t.used = true;
  }
  d->sequence = stats_.reserves;
  d->stream_reg = reg;  // the reference the reserve took
  d->fence_at_free = reg != nullptr && reg->fence != nullptr;
  void* ptr = nullptr;
  arena_pool* arena = nullptr;
  if (d->loc.pool != location::persistent_pool) {
    if (auto* a = std::get_if<std::unique_ptr<arena_pool>>(&pool_at(d->loc.pool))) {
      arena = a->get();
      // An arena's addresses are its range's base plus the offset: no lookup in the storage.
      if (arena->address_of(d->loc.slice, ptr)) {
        d->place(ptr, size);
        return;
      }
    }
  }
  if (auto v = find(d)) {
    if (auto r = store_.get(v->storage)) {
      ptr = r->ptr;
      if (arena != nullptr) arena->learn_base(d->loc.slice, ptr);
    }
  }
  d->place(ptr, size);
}

result<void> memory_manager::record_stream(const memory_binding& b, stream_id q) {
  process_releases();
  detail::descriptor* d = b.raw();
  if (auto v = find(d); !v) return std::move(v).err();
  if (q == streams::none) q = streams::device;
  if (!order_.ordered()) return {};
  auto reg = order_.enter(q);
  if (!reg) return std::move(reg).err();
  stream_state* s = *reg;
  if (s == d->stream_reg) return {};
  if (d->more_streams == nullptr) d->more_streams = new detail::stream_list();
  auto& more = d->more_streams->streams;
  if (std::find(more.begin(), more.end(), s) == more.end()) {
    more.push_back(s);
    order_.ref(*s);
  }
  if (s->fence != nullptr) d->fence_at_free = true;
  return {};
}

result<void> memory_manager::retire_stream(stream_id q) {
  process_releases();
  return order_.retire(q);
}

result<void> memory_manager::end_batch(batch_end by) {
  process_releases();
  result<void> out;
  if (order_.ordered()) {
    out = order_.fence();
    bool polled = false;
    if (by == batch_end::device_thread || order_.holding() || ++unpolled_batches_ >= poll_in_place_every) {
      unpolled_batches_ = 0;
      polled = order_.poll();
    }
    if (polled || order_.advanced()) harvest();
  }
  if (by == batch_end::in_place) return out;
  if (auto f = flush(); !f && out) out = std::move(f);
  return out;
}

void memory_manager::process_releases() {
  if (queue_.empty()) return;  // a plain load: no exchange when nothing was dropped
  detail::descriptor* d = queue_.take_all();
  while (d != nullptr) {
    detail::descriptor* next = d->next_released;
    release_one(d);
    d = next;
  }
}

result<detail::descriptor*> memory_manager::reserve_persistent(std::uint64_t size) {
  if (detail::descriptor* d = persistent_.try_reserve(ctx_, size)) {
    ++stats_.reserves;
    return d;
  }
  auto r = persistent_.alloc(ctx_, size);
  if (!r) {
    return std::move(r).err();
  }
  ++stats_.reserves;
  return *r;
}

result<memory_handle> memory_manager::reserve(std::uint64_t size, stream_id q, tag_id tag) {
  auto r = reserve_raw(size, q, tag);
  if (!r) return std::move(r).err();
  return memory_handle::adopt(*r);
}

result<void> memory_manager::reserve_into(std::uint64_t size, const memory_handle& handle, stream_id q, tag_id tag) {
  detail::descriptor* d = handle.raw();
  if (d == nullptr) return error::make(errc::invalid_argument, "the handle to reserve into is empty");
  if (d->loc.init || (d->state.load(std::memory_order_acquire) & detail::descriptor::attached_bit) != 0) {
    return error::make(errc::already_bound, "the handle to reserve into already has memory");
  }
  ctx_.into = d;
  auto r = reserve_raw(size, q, tag);
  ctx_.into = nullptr;  // not consumed when the reserve failed
  if (!r) return std::move(r).err();
  return {};
}

result<detail::descriptor*> memory_manager::reserve_raw(std::uint64_t size, stream_id q, tag_id tag) {
  // One call, one count: a reserve that succeeds after a reclaim is no failure.
  auto r = reserve_attempt(size, q, tag);
  if (!r && r.code() == errc::out_of_memory && opts_.reclaim_on_out_of_memory) {
    if (auto c = reclaim(); c) r = reserve_attempt(size, q, tag);
  }
  if (!r) {
    ++stats_.failed_reserves;
    if (r.code() == errc::out_of_memory) {
      ++stats_.out_of_memory_errors;
      error e = std::move(r).err();
      explain_out_of_memory(e, size, q);
      return e;
    }
  }
  return r;
}

result<detail::descriptor*> memory_manager::reserve_attempt(std::uint64_t size, stream_id q, tag_id tag) {
  if (q == streams::none) q = streams::device;
  process_releases();
  busy_polled_ = false;  // only a poll made by this reserve counts
  stream_state* reg = nullptr;
  if (order_.ordered()) {
    auto u = order_.enter(q);
    if (!u) return std::move(u).err();
    reg = *u;
    if (reg->foreign) {
      error e = error::make(errc::invalid_argument,
                            "the stream belongs to another device: reserve memory of a device for its own streams, "
                            "and name another device's stream with record_stream when its kernels use this memory");
      e.size = size;
      e.text = "stream of cuda:" + std::to_string(reg->device);
      return e;
    }
    ctx_.reserve_tag = order_.tagged() && streams::reusable_in_order(q) ? reg->serial : 0;
    // Held for the allocation from here on: a harvest under memory pressure must not forget it.
    order_.ref(*reg);
  }
  const std::uint64_t pages_before = stats_.driver_allocs;
  auto r = reserve_on(size, tag);
  if (!r && r.code() == errc::out_of_memory && order_.reclaimable()) {
    // Memory pressure: wait for the streams' fences (counted), free what they held, try again.
    order_.wait_all();
    harvest();
    r = reserve_on(size, tag);
  }
  if (!r) {
    if (reg != nullptr) order_.unref(*reg);
    return r;
  }
  if (busy_polled_) note_busy();
  if (reg != nullptr && stats_.driver_allocs != pages_before && q != streams::device) {
    // A new page comes from the driver in the order of the device's stream (cudaMallocAsync), where
    // work of the device's own may still use the memory it reuses: the reserve's stream waits.
    auto e = store_.record_event(streams::device);
    if (e) {
      if (!store_.stream_wait_event(q, *e)) (void)store_.synchronize();
      store_.release_event(*e);
    } else {
      (void)store_.synchronize();
    }
  }
  publish(*r, size, q, reg, tag);
  if (history_.enabled()) history_.add(trace_action::alloc, trace_address(*r), size, q);
  return r;
}

result<detail::descriptor*> memory_manager::reserve_on(std::uint64_t size, tag_id tag) {
  const std::uint64_t limit = props_.capacity != 0 ? props_.capacity : max_reserve_size;
  if (size > limit) {
    // Also keeps every size far from overflow when it is rounded to the alignment.
    error e = error::make(errc::buffer_too_big,
                          props_.capacity != 0 ? "larger than the device" : "larger than devrt allocates");
    e.size = size;
    e.limit = limit;
    return e;
  }
  ++reserve_count_;
  if (tag != 0 && !capture_) {
    tag_space& t = space_of(tag);
    if (arena_pool* a = t.arena()) {
      if (t.state == tag_state::asleep) {
        error e = error::make(errc::asleep);
        e.size = size;
        e.text = std::string(tag_of(tag).view());
        return e;
      }
      if (!a->accept(size)) {
        error e = error::make(errc::buffer_too_big);
        e.size = size;
        e.limit = a->options().max_alloc_size;
        return e;
      }
      auto r = a->alloc(ctx_, size);
      if (!r) return std::move(r).err();
      ++stats_.reserves;
      return *r;
    }
  }
  const bool persistent_mode = mode_ == allocation_mode::persistent;
  const bool size_match = opts_.policy == persistent_policy::size_match;
  if (only_arena_ != nullptr && !persistent_mode && !size_match && only_arena_->accept(size)) {
    // The default layout on mapping devices: one arena, whose tick does nothing.
    auto r = only_arena_->alloc(ctx_, size);
    if (!r) {
      return std::move(r).err();
    }
    ++stats_.reserves;
    return *r;
  }
  if (!capture_) {
    for (auto& p : pools_) visit_pool(p, [&](auto& pool) { pool.tick(ctx_, reserve_count_); });
  }

  if (persistent_mode || (size_match && persistent_.has_size(size))) return reserve_persistent(size);

  for (auto& p : pools_) {
    auto r = visit_pool(p, [&](auto& pool) -> std::optional<result<detail::descriptor*>> {
      if (!pool.accept(size)) return std::nullopt;
      if (detail::descriptor* d = pool.try_reserve(ctx_, size)) return result<detail::descriptor*>(d);
      return pool.alloc(ctx_, size);
    });
    if (!r) continue;
    // The first accepting pool decides: a capacity error is not passed on to later pools.
    if (!*r) {
      return std::move(*r).err();
    }
    ++stats_.reserves;
    return **r;
  }
  error e = error::make(errc::buffer_too_big);
  e.size = size;
  // The sizes the pools take; where they leave a gap below the largest (a sliced pool takes its
  // slices and whole pages, not what lies between), the message says which.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges;
  for (const auto& p : pools_) visit_pool(p, [&](const auto& pool) { pool.accepted_sizes(ranges); });
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<std::uint64_t, std::uint64_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  e.limit = merged.empty() ? 0 : merged.back().second;
  if (merged.size() > 1) {
    for (const auto& [lo, hi] : merged) {
      if (!e.text.empty()) e.text += ", ";
      e.text += lo == 0 ? fmt::format("up to {}", format_bytes(hi))
                        : fmt::format("{} to {}", format_bytes(lo), format_bytes(hi));
    }
  }
  return e;
}

result<slice_view> memory_manager::find(const detail::descriptor* d) const {
  if (d == nullptr) return error::make(errc::not_found, "the handle is empty");
  const location& loc = d->loc;
  if (!loc.init) return error::make(errc::not_found, "the memory location was never initialized");
  if (loc.pool == location::persistent_pool) return persistent_.find(d);
  if (!has_pool(loc.pool)) return error::make(errc::not_found, "the memory pool does not exist");
  return visit_pool(
      const_cast<memory_manager*>(this)->pool_at(loc.pool),  // NOLINT(cppcoreguidelines-pro-type-const-cast)
      [&](const auto& pool) { return pool.find(d); });
}

// `reserved` is consumed (reset) only when the bind succeeds; on failure the caller keeps it.
result<void> memory_manager::bind(memory_handle&& reserved, const memory_handle& assigned, std::uint64_t cursor) {
  process_releases();
  detail::descriptor* dr = reserved.raw();
  detail::descriptor* da = assigned.raw();
  if (da == nullptr) return error::make(errc::invalid_argument, "the handle to bind is empty");
  if (da == dr || da->loc.init || (da->state.load(std::memory_order_acquire) & detail::descriptor::attached_bit) != 0) {
    return error::make(errc::already_bound, "the handle to bind already has memory");
  }
  auto view = find(dr);
  if (!view) return std::move(view).err();
  const std::uint16_t pool = dr->loc.pool;
  void* const ptr = dr->address.load(std::memory_order_relaxed);
  const std::uint64_t bytes = dr->bytes.load(std::memory_order_relaxed);
  auto r = pool == location::persistent_pool
               ? persistent_.bind(ctx_, dr, da, cursor)
               : visit_pool(pool_at(pool), [&](auto& p) { return p.bind(ctx_, dr, da, cursor); });
  if (r) {
    // The memory keeps every stream it was used on, those record_stream added included.
    da->stream = dr->stream;
    da->stream_reg = std::exchange(dr->stream_reg, nullptr);
    da->more_streams = std::exchange(dr->more_streams, nullptr);
    da->fence_at_free = std::exchange(dr->fence_at_free, false);
    da->tag = std::exchange(dr->tag, tag_id{0});
    da->sequence = dr->sequence;
    da->place(ptr, bytes);
    reserved.reset();  // consumed only on success: a failed bind leaves the memory with the caller
  }
  return r;
}

result<std::uint64_t> memory_manager::get_cursor(const memory_binding& b) {
  process_releases();
  auto v = find(b.raw());
  if (!v) return std::move(v).err();
  return v->cursor;
}
result<std::uint64_t> memory_manager::get_cursor(const memory_handle& h) {
  process_releases();
  auto v = find(h.raw());
  if (!v) return std::move(v).err();
  return v->cursor;
}
result<storage_handle> memory_manager::get_storage(const memory_binding& b) {
  process_releases();
  auto v = find(b.raw());
  if (!v) return std::move(v).err();
  return v->storage;
}
result<storage_handle> memory_manager::get_storage(const memory_handle& h) {
  process_releases();
  auto v = find(h.raw());
  if (!v) return std::move(v).err();
  return v->storage;
}

result<resource> memory_manager::resolve(const detail::descriptor* d, std::optional<std::uint64_t> offset_start,
                                         std::optional<std::uint64_t> offset_end) {
  process_releases();
  auto v = find(d);
  if (!v) return std::move(v).err();
  storage_handle h = v->storage;
  if (offset_start) {
    if (*offset_start > h.size) {
      error e = error::make(errc::invalid_argument, "offset_start is past the end of the allocation");
      e.size = *offset_start;
      e.limit = h.size;
      return e;
    }
    h = h.offset_start(*offset_start);
  }
  if (offset_end) {
    if (*offset_end > h.size) {
      error e = error::make(errc::invalid_argument, "offset_end trims more than the view holds");
      e.size = *offset_end;
      e.limit = h.size;
      return e;
    }
    h = h.offset_end(*offset_end);
  }
  return store_.get(h);
}

result<resource> memory_manager::get_resource(const memory_binding& b, std::optional<std::uint64_t> offset_start,
                                              std::optional<std::uint64_t> offset_end) {
  return resolve(b.raw(), offset_start, offset_end);
}
result<resource> memory_manager::get_resource(const memory_handle& h, std::optional<std::uint64_t> offset_start,
                                              std::optional<std::uint64_t> offset_end) {
  return resolve(h.raw(), offset_start, offset_end);
}

result<void> memory_manager::cleanup(bool explicit_cleanup) {
  process_releases();
  if (capture_) return {};  // the open window may still use every slice
  if (explicit_cleanup) {
    ++stats_.cleanups;
    // Everything unused goes back, without waiting for the device: every stream with unfenced
    // frees gets its fence now, what has passed is freed, and the rest follows as soon as its
    // fences pass (end_batch).
    if (order_.ordered()) {
      order_.want_fences();
      (void)order_.fence();
      if (order_.poll() || order_.advanced()) harvest();
      cleanup_owed_ = order_.reclaimable();
    }
  }
  persistent_.cleanup(ctx_, explicit_cleanup);
  for_each_pool([&](dynamic_pool& p) {
    visit_pool(p, [&](auto& pool) {
      if (explicit_cleanup) {
        pool.cleanup(ctx_, true);
      } else {
        pool.tick(ctx_, reserve_count_);
      }
    });
  });
  if (explicit_cleanup) return flush();
  return {};
}

result<void> memory_manager::set_memory_limit(std::uint64_t bytes) {
  process_releases();
  ctx_.set_limit(bytes, props_.capacity);
  opts_.memory_limit = bytes;
  if (bytes != 0 && ctx_.held() > bytes) return cleanup(true);
  return {};
}

result<void> memory_manager::reclaim() {
  ++stats_.reclaims;
  // Memory pressure, the one place the device waits for its streams (counted in stream_waits).
  if (order_.ordered() && order_.wait_all()) harvest();
  auto r = cleanup(true);
  // Memory on its way back (unmaps and page frees queued behind the device's own stream, those of
  // the cleanup above included) is held until that stream has run its work: wait for it, so that
  // the retry finds the memory gone rather than counted against the limit or the device.
  if (r && !capture_ && store_.ordered() && store_.returning_bytes() != 0) {
    ++returning_waits_;
    if (auto w = store_.synchronize(); !w) return w;
    r = store_.flush();
  }
  return r;
}

result<void> memory_manager::flush() {
  if (store_.pending_deallocations() == 0) return {};
  auto r = store_.flush();
  if (!r) return r;
  return {};
}

memory_usage memory_manager::dynamic_usage() const noexcept {
  memory_usage u;
  for (const auto& p : pools_) u += visit_pool(p, [](const auto& pool) { return pool.usage(); });
  return u;
}

const memory_statistics& memory_manager::statistics() {
  process_releases();
  stats_.bytes_returning = store_.returning_bytes();
  stats_.stream_waits = order_.waits() + returning_waits_;
  stats_.fences = order_.fences();
  stats_.streams = order_.stream_count();
  stats_.stream_registrations = order_.registrations_made();
  stats_.broken_streams = order_.broken_streams();
  stats_.bytes_held_for_streams = order_.held_bytes();
  // What is in use is busy too: the floor is at least the peak in use.
  stats_.peak_bytes_busy = busy_peak_ != 0 ? std::max(busy_peak_, stats_.peak_bytes_in_use) : 0;
  stats_.bytes_sleeping = 0;
  stats_.bytes_offloaded = 0;
  for (const auto& t : tags_) {
    if (t == nullptr) continue;
    if (const arena_pool* a = t->arena()) stats_.bytes_sleeping += a->sleeping_bytes();
    stats_.bytes_offloaded += t->offload_bytes;
  }
  return stats_;
}

void memory_manager::reset_peaks() {
  process_releases();
  stats_.peak_bytes_reserved = stats_.bytes_reserved;
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
  busy_peak_ = 0;
}

std::uint64_t memory_manager::pending_dynamic_bytes() const noexcept {
  std::uint64_t n = 0;
  for (const auto& p : pools_) {
    if (const auto* a = std::get_if<std::unique_ptr<arena_pool>>(&p)) n += (*a)->tagged_bytes();
  }
  return n;
}

result<configure_outcome> memory_manager::configure(const memory_layout& layout) {
  process_releases();
  auto resolved = resolve_layout(layout, props_);
  if (!resolved) return std::move(resolved).err();
  if (capture_) {
    return error::make(errc::capture_active, "the pool layout cannot change while a capture window is open");
  }
  if (auto r = cleanup(true); !r) return std::move(r).err();  // never waits
  // Zero-size allocations count too: they hold a slice although they hold no bytes. Held slices
  // are no one's any more, but their streams may still use them.
  const memory_usage live = dynamic_usage();
  std::uint64_t held_allocs = 0;
  std::uint64_t held_bytes = 0;
  order_.for_each_held([&](const detail::descriptor* d, std::uint64_t bytes) {
    if (d->loc.pool == location::persistent_pool) return;
    ++held_allocs;
    held_bytes += bytes;
  });
  if (live.number_allocs > held_allocs) {
    return configure_outcome{false, live.bytes_in_use, live.number_allocs - held_allocs, false, 0};
  }
  const std::uint64_t pending = held_bytes + pending_dynamic_bytes();
  if (held_allocs > 0 || pending > 0) return configure_outcome{false, 0, 0, true, pending};
  // Queued deallocations go first: if the device refuses them, the current layout stays.
  if (auto r = flush(); !r) return std::move(r).err();
  release_pools();
  layout_ = std::move(resolved).value();
  build_pools(layout_);
  // What the old pools just queued goes back at the end of the batch (a failure there is the
  // batch's to report, and retried): the new layout is in force either way.
  (void)flush();
  return configure_outcome{true, 0, 0, false, 0};
}

void memory_manager::capture_begin() {
  process_releases();
  if (!capture_) {
    capture_ = capture_state{mode_};
    persistent_.begin_touch();
  }
  mode_ = allocation_mode::persistent;
}

result<std::vector<memory_handle>> memory_manager::capture_end() {
  process_releases();
  if (!capture_) return error::make(errc::no_capture, "capture_end was called without capture_begin");
  mode_ = capture_->restore_mode;
  capture_.reset();
  auto pins = persistent_.pin_touched(ctx_);
  if (order_.ordered()) {
    // Memory freed inside the window and live again for the graph is used on the device's stream.
    for (auto& h : pins) {
      detail::descriptor* d = h.raw();
      if (d->stream_reg != nullptr) continue;
      if (auto reg = order_.enter(streams::device); reg) {
        d->stream = streams::device;
        d->stream_reg = *reg;
        order_.ref(**reg);
      }
    }
  }
  return pins;
}

void memory_manager::mode(allocation_mode m) {
  if (opts_.policy == persistent_policy::disabled || opts_.policy == persistent_policy::enforced) return;
  if (capture_) {
    capture_->restore_mode = m;
  } else {
    mode_ = m;
  }
}

memory_usage memory_manager::usage() {
  process_releases();
  memory_usage u = persistent_.usage();
  for_each_pool([&](const dynamic_pool& p) { u += visit_pool(p, [](const auto& pool) { return pool.usage(); }); });
  return u;
}

std::string memory_manager::report() {
  const memory_usage total = usage();
  std::string out = fmt::format("memory report for {} ({} storage, alignment {}, max page {})\n", opts_.name,
                                store_.name(), props_.alignment, format_bytes(props_.max_page_size));
  out += fmt::format("layout: {}; persistent policy: {}; mode: {}{}\n", to_string(memory_layout(layout_to_configs())),
                     to_string(opts_.policy), mode_ == allocation_mode::persistent ? "persistent" : "automatic",
                     capture_ ? " (capturing)" : "");
  out += persistent_.report();
  for (const auto& p : pools_) out += visit_pool(p, [](const auto& pool) { return pool.report(); });
  for (const tag_usage& t : tags()) {
    out += fmt::format("tag '{}': {}{}, {} in use in {} allocations, {} mapped, {} sleeping, {} offloaded\n", t.name,
                       to_string(t.state), t.contents_kept ? " (contents kept)" : "", format_bytes(t.bytes_in_use),
                       t.allocations, format_bytes(t.bytes_reserved), format_bytes(t.bytes_sleeping),
                       format_bytes(t.bytes_offloaded));
  }
  // Sleeping tags' allocations stay live but hold no device memory: the usage line says so.
  const std::uint64_t asleep_in_use = sleeping_in_use(tags_);
  if (asleep_in_use == 0) {
    out += total.to_string();
  } else {
    memory_usage awake = total;
    awake.bytes_in_use -= std::min(awake.bytes_in_use, asleep_in_use);
    std::string line = awake.to_string();
    line.insert(line.size() - 1,
                fmt::format("; and {} in use by sleeping tags, not on the device", format_bytes(asleep_in_use)));
    out += line;
  }
  out += statistics().to_string();
  return out;
}

std::vector<pool_config> memory_manager::layout_to_configs() const {
  std::vector<pool_config> out;
  for (const auto& o : layout_) {
    switch (o.kind) {
      case pool_kind::sliced:
        out.emplace_back(sliced_pool_config{o.page_size, o.max_alloc_size, o.max_pool_size, o.dealloc_period});
        break;
      case pool_kind::exclusive: out.emplace_back(exclusive_pool_config{o.max_alloc_size, o.dealloc_period}); break;
      case pool_kind::arena:
        out.emplace_back(arena_pool_config{
            o.page_size,
            o.max_alloc_size == no_size_limit ? std::nullopt : std::optional<std::uint64_t>(o.max_alloc_size),
            o.max_pool_size, o.chunk, o.slack, o.grow});
        break;
    }
  }
  return out;
}

std::string memory_manager::check_invariants() {
  process_releases();
  std::string problem = persistent_.check_invariants();
  if (!problem.empty()) return problem;
  memory_usage total = persistent_.usage();
  for_each_pool([&](const dynamic_pool& p) {
    if (!problem.empty()) return;
    problem = visit_pool(p, [](const auto& pool) { return pool.check_invariants(); });
    total += visit_pool(p, [](const auto& pool) { return pool.usage(); });
  });
  if (!problem.empty()) return problem;
  for (const auto& t : tags_) {
    if (t == nullptr) continue;
    const arena_pool* a = t->arena();
    if ((t->state == tag_state::asleep) != (a != nullptr && a->asleep()) &&
        !(a == nullptr && t->state == tag_state::awake)) {
      return fmt::format("tag '{}' is {} but its arena is not", tag_of(t->id).view(), to_string(t->state));
    }
    if ((t->offload.ptr == nullptr) != t->saved.empty() || t->offload_bytes > t->offload.bytes) {
      return fmt::format("tag '{}': a host copy without saved allocations, or the reverse", tag_of(t->id).view());
    }
  }
  std::uint64_t cached = 0;
  for (const host_block& b : host_cache_) cached += b.bytes;
  if (cached != stats_.bytes_host_cached) {
    return fmt::format("statistics count {} bytes of cached host copies, the cache holds {}", stats_.bytes_host_cached,
                       cached);
  }
  if (total.bytes_in_use != stats_.bytes_in_use + order_.held_bytes()) {
    return fmt::format("statistics count {} bytes in use and {} held for streams, the pools {}", stats_.bytes_in_use,
                       order_.held_bytes(), total.bytes_in_use);
  }
  if (total.bytes_reserved != stats_.bytes_reserved) {
    return fmt::format("statistics count {} bytes reserved, the pools {}", stats_.bytes_reserved, total.bytes_reserved);
  }
  if (stats_.driver_allocs - stats_.driver_frees < persistent_.slice_count()) {
    return "fewer pages allocated than the persistent pool holds";
  }
  if (capture_ && mode_ != allocation_mode::persistent) return "a capture window is open in automatic mode";
  return {};
}

// ---- Tags: sleep and wake (memory/tag.hpp) ----

memory_manager::tag_space& memory_manager::space_of(tag_id tag) {
  if (tag > tags_.size()) tags_.resize(tag);
  auto& slot = tags_[tag - 1];
  if (slot == nullptr) {
    slot = std::make_unique<tag_space>();
    slot->id = tag;
    if (props_.map_granularity != 0) {
      // The layout's first arena, or the arena preset of the device: its own address range.
      std::optional<pool_options> o;
      for (const auto& p : layout_) {
        if (p.kind == pool_kind::arena) {
          o = p;
          break;
        }
      }
      if (!o) o = preset_pools(preset::arena, props_).front();
      slot->pool = std::make_unique<arena_pool>(*o, store_.alignment(),
                                                static_cast<std::uint16_t>(location::first_tag_pool + tag - 1));
    } else {
      slot->pool = std::unique_ptr<arena_pool>();
    }
  }
  return *slot;
}

void memory_manager::release_tag_spaces() {
  for (auto& t : tags_) {
    if (t == nullptr) continue;
    if (arena_pool* a = t->arena()) a->release_all(ctx_);
    if (t->offload.ptr != nullptr) give_host_block(t->offload);
  }
  tags_.clear();
  (void)release_host_copies();
}

result<memory_manager::host_block> memory_manager::take_host_block(std::uint64_t bytes) {
  auto best = host_cache_.end();
  for (auto it = host_cache_.begin(); it != host_cache_.end(); ++it) {
    if (it->bytes >= bytes && it->bytes / 2 <= bytes && (best == host_cache_.end() || it->bytes < best->bytes)) {
      best = it;
    }
  }
  if (best != host_cache_.end()) {
    const host_block b = *best;
    host_cache_.erase(best);
    stats_.bytes_host_cached -= b.bytes;
    return b;
  }
  auto buf = store_.alloc_host(bytes);
  if (!buf && buf.code() == errc::out_of_memory && !host_cache_.empty()) {
    (void)release_host_copies();
    buf = store_.alloc_host(bytes);
  }
  if (!buf) return std::move(buf).err();
  return host_block{*buf, bytes};
}

void memory_manager::give_host_block(host_block b) {
  if (b.ptr == nullptr) return;
  host_cache_.push_back(b);
  stats_.bytes_host_cached += b.bytes;
}

std::uint64_t memory_manager::release_host_copies() {
  std::uint64_t n = 0;
  for (const host_block& b : host_cache_) {
    store_.free_host(b.ptr, b.bytes);
    n += b.bytes;
  }
  host_cache_.clear();
  stats_.bytes_host_cached = 0;
  return n;
}

result<event> memory_manager::sleep(tag_id tag, bool keep_contents) {
  process_releases();
  if (capture_) return error::make(errc::capture_active, "a tag cannot sleep while a capture window is open");
  tag_space* t = find_space(tag);
  if (props_.map_granularity == 0) {
    error e = error::make(errc::unsupported,
                          "sleep needs a device that maps memory into address ranges; on this one tags only label "
                          "allocations");
    e.text = std::string(tag_of(tag).view());
    return e;
  }
  if (t == nullptr || !t->used || t->state == tag_state::asleep || t->restoring) {
    if (t != nullptr && t->restoring) {
      return error::make(errc::invalid_argument, "the tag's wake is still restoring its contents");
    }
    return event{0};
  }
  arena_pool* a = t->arena();
  // What the streams' fences allow goes back first; the rest of the tag's memory follows the
  // work queued on every stream.
  if (order_.ordered()) {
    if (auto f = order_.fence(); !f) return std::move(f).err();
    if (order_.poll() || order_.advanced()) harvest();
    if (auto o = order_.order_device_after_all(); !o) return std::move(o).err();
  }
  // A copy left by a wake whose restore failed: its contents are stale now.
  if (t->offload.ptr != nullptr && !t->restoring) {
    give_host_block(t->offload);
    t->offload = {};
    t->offload_bytes = 0;
    t->saved.clear();
  }
  std::vector<saved_slice> saved;
  std::uint64_t total = 0;
  if (keep_contents) {
    a->for_each_live([&](const storage_handle& v) {
      saved.push_back(saved_slice{v, total});
      total += align_up(v.size, 64);
    });
    std::sort(saved.begin(), saved.end(),
              [](const saved_slice& x, const saved_slice& y) { return x.view.offset < y.view.offset; });
    std::uint64_t at = 0;
    for (auto& e : saved) {
      e.at = at;
      at += align_up(e.view.size, 64);
    }
    if (total != 0) {
      auto buf = take_host_block(total);
      if (!buf) return std::move(buf).err();
      for (const auto& e : saved) {
        if (e.view.size == 0) continue;
        if (auto r = store_.copy_to_host(e.view, static_cast<std::byte*>(buf->ptr) + e.at); !r) {
          // Nothing unmapped yet: the tag stays awake; the copies queued so far finish first.
          (void)store_.synchronize();
          give_host_block(*buf);
          return std::move(r).err();
        }
      }
      t->offload = *buf;
      t->offload_bytes = total;
      t->saved = std::move(saved);
    }
  }
  a->sleep(ctx_);
  t->state = tag_state::asleep;
  ++t->sleeps;
  ++stats_.sleeps;
  // The tag sleeps from here on: unmaps the device refused to take now stay queued, and
  // settle_tag (or a later flush) pushes them again.
  (void)flush();
  auto ev = store_.record_event(streams::device);
  if (!ev) (void)store_.synchronize();  // no event to park on: the device is done with the copies now
  return ev ? *ev : event{0};
}

result<event> memory_manager::wake(tag_id tag) {
  process_releases();
  if (capture_) return error::make(errc::capture_active, "a tag cannot wake while a capture window is open");
  tag_space* t = find_space(tag);
  if (t == nullptr || t->state == tag_state::awake) return event{0};
  arena_pool* a = t->arena();
  auto r = a->wake(ctx_);
  if (!r && r.code() == errc::out_of_memory && opts_.reclaim_on_out_of_memory) {
    if (auto c = reclaim(); c) r = a->wake(ctx_);
  }
  if (!r) {
    error e = std::move(r).err();
    if (e.code == errc::out_of_memory) {
      ++stats_.out_of_memory_errors;
      explain_out_of_memory(e, a->sleeping_bytes(), streams::device);
      // The request is the tag's memory to map again, not an allocation.
      constexpr std::string_view head = "request: ";
      if (e.context.starts_with(head)) {
        e.context.replace(0, head.size(), fmt::format("wake of tag '{}', to map again: ", tag_of(tag).view()));
      }
    }
    return e;
  }
  t->state = tag_state::awake;
  ++t->wakes;
  ++stats_.wakes;
  if (t->saved.empty()) return store_.record_event(streams::device);
  // The allocations still live get their bytes back; those freed while asleep are gone.
  std::vector<storage_handle> live;
  a->for_each_live([&](const storage_handle& v) { live.push_back(v); });
  for (const storage_handle& v : live) {
    auto it = std::lower_bound(t->saved.begin(), t->saved.end(), v.offset,
                               [](const saved_slice& x, std::uint64_t off) { return x.view.offset < off; });
    if (it == t->saved.end() || it->view.offset != v.offset || it->view.size != v.size || v.size == 0) continue;
    if (auto c = store_.copy_from_host(v, static_cast<const std::byte*>(t->offload.ptr) + it->at); !c) {
      (void)store_.synchronize();
      return std::move(c).err();
    }
  }
  t->restoring = true;
  return store_.record_event(streams::device);
}

result<void> memory_manager::settle_tag(tag_id tag) {
  process_releases();
  tag_space* t = find_space(tag);
  if (t != nullptr && t->restoring) {
    // The copies back are done: the pinned block serves the next sleep (pinning anew costs more
    // than the copy itself).
    give_host_block(t->offload);
    t->offload = {};
    t->offload_bytes = 0;
    t->saved.clear();
    t->restoring = false;
  }
  // What a sleep unmapped behind the device's work goes back now that the work is done (after a
  // capture window that opened meanwhile: nothing goes back while one is open).
  if (capture_) return {};
  if (store_.pending_deallocations() != 0 || store_.returning_bytes() != 0) return store_.flush();
  return {};
}

std::vector<tag_usage> memory_manager::tags() {
  process_releases();
  std::vector<tag_usage> out;
  for (const auto& t : tags_) {
    if (t == nullptr) continue;
    tag_usage u;
    u.name = std::string(tag_of(t->id).view());
    u.state = t->state;
    u.contents_kept = t->state == tag_state::asleep && t->offload.ptr != nullptr;
    u.bytes_in_use = t->bytes_in_use;
    u.allocations = t->allocations;
    if (const arena_pool* a = t->arena()) {
      u.bytes_reserved = a->usage().bytes_reserved;
      u.bytes_sleeping = a->sleeping_bytes();
    }
    u.bytes_offloaded = t->offload_bytes;
    u.sleeps = t->sleeps;
    u.wakes = t->wakes;
    out.push_back(std::move(u));
  }
  return out;
}

}  // namespace devrt::memory
