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

memory_manager::memory_manager(storage store, manager_options opts)
    : store_(std::move(store)),
      opts_(std::move(opts)),
      props_(store_.properties()),
      order_(store_),
      ctx_{store_, stats_, queue_, 0, &order_, queue::none},
      persistent_(store_.alignment()) {
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
  // The storage orders its teardown after the device's work: held slices go back as they are.
  order_.release_all([this](detail::descriptor* d) {
    stats_.bytes_in_use += d->bytes.load(std::memory_order_relaxed);
    release_to_pool(d, queue::none);
  });
  ctx_.detached_in_flight = 0;
  release_pools();
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
  constexpr std::uint64_t queue_and_slice = detail::descriptor::attached_bit | queue_ref | detail::descriptor::one_ref;
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
  if (order_.ordered() && (order_.several() || d->more_streams)) {
    const queue_id own = d->stream;
    const bool arena = d->loc.pool != location::persistent_pool &&
                       std::holds_alternative<std::unique_ptr<arena_pool>>(pools_[d->loc.pool]);
    if (!d->more_streams && arena && queue::reusable_in_order(own)) {
      // Free at once for its own stream, for the others once the stream's fence has passed.
      order_.freed_on(own);
      release_to_pool(d, own);
      return;
    }
    stream_set streams{own};
    if (d->more_streams) {
      auto it = more_streams_.find(d);
      if (it != more_streams_.end()) {
        for (const queue_id q : it->second) streams.push_back(q);
        more_streams_.erase(it);
      }
      d->more_streams = false;
    }
    // Kept live in its pool until every stream's fence has passed; no longer in use for the user.
    stats_.bytes_in_use -= d->bytes.load(std::memory_order_relaxed);
    order_.hold(d, streams);
    return;
  }
  if (d->more_streams) {
    more_streams_.erase(d);
    d->more_streams = false;
  }
  release_to_pool(d, queue::none);
}

void memory_manager::release_to_pool(detail::descriptor* d, queue_id tag) {
  const location loc = d->loc;
  if (loc.pool == location::persistent_pool) {
    persistent_.release(ctx_, loc);
  } else {
    visit_pool(pools_[loc.pool], [&](auto& pool) {
      if constexpr (std::is_same_v<std::decay_t<decltype(pool)>, arena_pool>) {
        pool.release(ctx_, loc, tag, order_.epoch());
      } else {
        pool.release(ctx_, loc);
      }
    });
  }
}

void memory_manager::harvest() {
  order_.release_ready([this](detail::descriptor* d) {
    const std::uint64_t bytes = d->bytes.load(std::memory_order_relaxed);
    stats_.bytes_in_use += bytes;  // the pool's release takes it off again
    if (detail::descriptor::total(d->state.load(std::memory_order_acquire)) != 1) return;  // pinned again
    release_to_pool(d, queue::none);
  });
  for (auto& p : pools_) {
    if (auto* a = std::get_if<std::unique_ptr<arena_pool>>(&p)) (*a)->harvest(ctx_, false);
  }
}

void memory_manager::publish(detail::descriptor* d, std::uint64_t size, queue_id q) {
  d->stream = q;
  void* ptr = nullptr;
  arena_pool* arena = nullptr;
  if (d->loc.pool != location::persistent_pool) {
    if (auto* a = std::get_if<std::unique_ptr<arena_pool>>(&pools_[d->loc.pool])) {
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

result<void> memory_manager::record_stream(const memory_binding& b, queue_id q) {
  process_releases();
  detail::descriptor* d = b.raw();
  if (auto v = find(d); !v) return std::move(v).err();
  if (q == queue::none) q = queue::device;
  if (!order_.ordered() || q == d->stream) return {};
  if (auto u = order_.use(q); !u) return u;
  stream_set& more = more_streams_[d];
  if (std::find(more.begin(), more.end(), q) == more.end()) more.push_back(q);
  d->more_streams = true;
  return {};
}

result<void> memory_manager::retire_stream(queue_id q) {
  process_releases();
  return order_.retire(q);
}

result<void> memory_manager::end_batch() {
  process_releases();
  result<void> out;
  if (order_.ordered()) {
    out = order_.fence();
    if (order_.poll()) harvest();
  }
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
    ++stats_.failed_reserves;
    return std::move(r).err();
  }
  ++stats_.reserves;
  return *r;
}

result<memory_handle> memory_manager::reserve(std::uint64_t size, queue_id q) {
  auto r = reserve_raw(size, q);
  if (!r) return std::move(r).err();
  return memory_handle::adopt(*r);
}

result<void> memory_manager::reserve_into(std::uint64_t size, const memory_handle& handle, queue_id q) {
  detail::descriptor* d = handle.raw();
  if (d == nullptr) return error::make(errc::invalid_argument, "the handle to reserve into is empty");
  if (d->loc.init || (d->state.load(std::memory_order_acquire) & detail::descriptor::attached_bit) != 0) {
    return error::make(errc::already_bound, "the handle to reserve into already has memory");
  }
  ctx_.into = d;
  auto r = reserve_raw(size, q);
  ctx_.into = nullptr;  // not consumed when the reserve failed
  if (!r) return std::move(r).err();
  return {};
}

result<detail::descriptor*> memory_manager::reserve_raw(std::uint64_t size, queue_id q) {
  if (q == queue::none) q = queue::device;
  process_releases();
  if (order_.ordered()) {
    if (auto u = order_.use(q); !u) {
      ++stats_.failed_reserves;
      return std::move(u).err();
    }
    ctx_.reserve_queue = order_.several() && queue::reusable_in_order(q) ? q : queue::none;
  }
  auto r = reserve_on(size);
  if (!r && r.code() == errc::out_of_memory && order_.pending()) {
    // Memory pressure: wait for the streams' fences (counted), free what they held, try again.
    --stats_.failed_reserves;
    order_.wait_all();
    harvest();
    r = reserve_on(size);
  }
  if (r) publish(*r, size, q);
  return r;
}

result<detail::descriptor*> memory_manager::reserve_on(std::uint64_t size) {
  const std::uint64_t limit = props_.capacity != 0 ? props_.capacity : max_reserve_size;
  if (size > limit) {
    // Also keeps every size far from overflow when it is rounded to the alignment.
    ++stats_.failed_reserves;
    error e = error::make(errc::buffer_too_big, "larger than the device");
    e.size = size;
    e.limit = limit;
    return e;
  }
  ++reserve_count_;
  const bool persistent_mode = mode_ == allocation_mode::persistent;
  const bool size_match = opts_.policy == persistent_policy::size_match;
  if (only_arena_ != nullptr && !persistent_mode && !size_match && only_arena_->accept(size)) {
    // The default layout on mapping devices: one arena, whose tick does nothing.
    auto r = only_arena_->alloc(ctx_, size);
    if (!r) {
      ++stats_.failed_reserves;
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
      ++stats_.failed_reserves;
      return std::move(*r).err();
    }
    ++stats_.reserves;
    return **r;
  }
  ++stats_.failed_reserves;
  error e = error::make(errc::buffer_too_big);
  e.size = size;
  std::uint64_t largest = 0;
  for (const auto& o : layout_) {
    largest = std::max(largest, o.kind == pool_kind::sliced  ? std::max(o.page_size, o.max_alloc_size)
                                : o.kind == pool_kind::arena ? std::min(o.max_alloc_size, o.max_pool_size.value_or(0))
                                                             : o.max_alloc_size);
  }
  e.limit = largest;
  return e;
}

result<slice_view> memory_manager::find(const detail::descriptor* d) const {
  if (d == nullptr) return error::make(errc::not_found, "the handle is empty");
  const location& loc = d->loc;
  if (!loc.init) return error::make(errc::not_found, "the memory location was never initialized");
  if (loc.pool == location::persistent_pool) return persistent_.find(d);
  if (loc.pool >= pools_.size()) return error::make(errc::not_found, "the memory pool does not exist");
  return visit_pool(pools_[loc.pool], [&](const auto& pool) { return pool.find(d); });
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
  const std::uint8_t pool = dr->loc.pool;
  void* const ptr = dr->address.load(std::memory_order_relaxed);
  const std::uint64_t bytes = dr->bytes.load(std::memory_order_relaxed);
  const queue_id stream = dr->stream;
  auto r = pool == location::persistent_pool
               ? persistent_.bind(ctx_, dr, da, cursor)
               : visit_pool(pools_[pool], [&](auto& p) { return p.bind(ctx_, dr, da, cursor); });
  if (r) {
    da->stream = stream;
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
    // An explicit cleanup returns everything unused: memory still fenced behind a stream is
    // waited for (counted), since it is not the normal path.
    if (order_.wait_all()) harvest();
  }
  persistent_.cleanup(ctx_, explicit_cleanup);
  for (auto& p : pools_) {
    visit_pool(p, [&](auto& pool) {
      if (explicit_cleanup) {
        pool.cleanup(ctx_, true);
      } else {
        pool.tick(ctx_, reserve_count_);
      }
    });
  }
  if (explicit_cleanup) return flush();
  return {};
}

result<void> memory_manager::reclaim() {
  ++stats_.reclaims;
  return cleanup(true);
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
  stats_.stream_waits = order_.waits();
  stats_.fences = order_.fences();
  stats_.streams = order_.stream_count();
  return stats_;
}

void memory_manager::reset_peaks() {
  process_releases();
  stats_.peak_bytes_reserved = stats_.bytes_reserved;
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
}

result<configure_outcome> memory_manager::configure(const memory_layout& layout) {
  process_releases();
  auto resolved = resolve_layout(layout, props_);
  if (!resolved) return std::move(resolved).err();
  if (capture_) {
    return error::make(errc::capture_active, "the pool layout cannot change while a capture window is open");
  }
  if (auto r = cleanup(true); !r) return std::move(r).err();
  // Zero-size allocations count too: they hold a slice although they hold no bytes.
  const memory_usage live = dynamic_usage();
  if (live.number_allocs > 0) return configure_outcome{false, live.bytes_in_use, live.number_allocs};
  release_pools();
  layout_ = std::move(resolved).value();
  build_pools(layout_);
  if (auto r = flush(); !r) return std::move(r).err();
  return configure_outcome{true, 0, 0};
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
  return persistent_.pin_touched(ctx_);
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
  for (const auto& p : pools_) u += visit_pool(p, [](const auto& pool) { return pool.usage(); });
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
  out += total.to_string();
  out += stats_.to_string();
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
  for (const auto& p : pools_) {
    problem = visit_pool(p, [](const auto& pool) { return pool.check_invariants(); });
    if (!problem.empty()) return problem;
    total += visit_pool(p, [](const auto& pool) { return pool.usage(); });
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

}  // namespace devrt::memory
