#include "replay/replay.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/system/system_error.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>

#include "devrt/devices/host_storage.hpp"
#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"
#include "devrt/runtime/runtime.hpp"
#include "replay/cuda_replay.hpp"

namespace devrt::replay {

namespace {

using clock_type = std::chrono::steady_clock;

devices::host_options host_opts() {
  devices::host_options h;
  h.alignment = 512;
  h.max_page_size = std::uint64_t{1} << 30;
  return h;
}

std::string failure_text(std::uint64_t index, const trace_event& e, const std::string& message) {
  return fmt::format("event {} (a {} {}): {}", index, e.id, e.size, message);
}

using detail::finish_rates;

/// Records the largest live and reserved counts of each window of `every` events.
class sampler {
 public:
  sampler(std::size_t samples, std::uint64_t events)
      : every_(samples == 0 ? 0 : std::max<std::uint64_t>(1, events / samples)) {
    if (every_ != 0) points_.reserve(events / every_ + 2);
  }
  [[nodiscard]] bool on() const noexcept { return every_ != 0; }
  void add(std::uint64_t played, std::uint64_t live, std::uint64_t reserved) {
    max_live_ = std::max(max_live_, live);
    max_reserved_ = std::max(max_reserved_, reserved);
    if (++in_window_ == every_) flush(played);
  }
  std::vector<timeline_point> finish(std::uint64_t played) {
    if (in_window_ != 0) flush(played);
    return std::move(points_);
  }

 private:
  void flush(std::uint64_t played) {
    points_.push_back(timeline_point{played, max_live_, max_reserved_});
    max_live_ = 0;
    max_reserved_ = 0;
    in_window_ = 0;
  }
  std::uint64_t every_;
  std::uint64_t in_window_ = 0;
  std::uint64_t max_live_ = 0;
  std::uint64_t max_reserved_ = 0;
  std::vector<timeline_point> points_;
};

devices::sim_options sim_for(device_choice d) {
  devices::sim_options o = devices::sim_options::h200();
  if (d == device_choice::sim_gpu) {
    o.streams = true;
    o.deferred_unmaps = true;
    o.name = "sim-h200-gpu";
  }
  return o;
}

result<memory::storage> make_storage(device_choice d) {
  switch (d) {
    case device_choice::sim:
    case device_choice::sim_gpu: return memory::storage::make<devices::sim_storage>(sim_for(d));
    case device_choice::host: return memory::storage::make<devices::host_storage>(host_opts());
    case device_choice::cuda: return detail::make_cuda_storage(0);
  }
  return memory::storage::make<devices::sim_storage>(devices::sim_options::h200());
}

/// Serves the events as the device actor would if each were a batch of its own: a reserve that
/// reclaims and retries once on out_of_memory, and queued page frees flushed after each event.
result<replay_result> replay_core(const trace& t, const replay_options& o) {
  memory::manager_options mo;
  mo.name = "replay";
  mo.layout = o.layout;
  mo.memory_limit = o.memory_limit;
  auto store_made = make_storage(o.device);
  if (!store_made) return std::move(store_made).err();
  auto made = memory::memory_manager::create(std::move(*store_made), std::move(mo));
  if (!made) return std::move(made).err();
  memory::memory_manager& m = **made;
  memory::storage& store = m.backing_storage();

  replay_result r;
  r.device = m.backing_storage().name();
  std::vector<memory::memory_handle> handles(t.allocations);
  const std::vector<trace_event>& events = t.events;
  const std::uint64_t n = events.size();
  sampler samples(o.timeline_samples, n);
  std::uint64_t live = 0;
  std::uint64_t peak_live = 0;
  std::uint64_t played = 0;

  // A busy simulated GPU: an event per trace event, each completing gpu_lag events later.
  devices::sim_storage* gpu = o.gpu_lag != 0 ? store.backend<devices::sim_storage>() : nullptr;
  std::vector<memory::event> in_flight(gpu != nullptr ? o.gpu_lag : 0);

  const auto start = clock_type::now();
  for (std::uint64_t i = 0; i < n; ++i) {
    const trace_event& e = events[i];
    if (gpu != nullptr) {
      memory::event& slot = in_flight[i % o.gpu_lag];
      if (slot != 0) gpu->run_until(slot);
      slot = gpu->record_event(memory::streams::device).value();
    }
    if ((i & 0xffff) == 0 && o.progress) o.progress(i, n);
    if (e.kind == event_kind::alloc) {
      ++r.allocations;
      // Live bytes follow the trace even when a reserve fails: peak live is the trace's.
      live += e.size;
      peak_live = std::max(peak_live, live);
      auto h = m.reserve(e.size);
      if (!h && h.code() == errc::out_of_memory && m.reclaim()) h = m.reserve(e.size);
      if (h) {
        handles[e.id] = std::move(*h);
      } else {
        if (r.failures++ == 0) r.first_failure = failure_text(i, e, h.err().message());
        if (o.strict) {
          played = i + 1;
          r.stopped = true;
          break;
        }
      }
    } else {
      ++r.frees;
      live -= e.size;
      handles[e.id].reset();
    }
    // Like the actor after a batch: queued page frees reach the device. Without this the device
    // keeps every freed page until an explicit cleanup.
    if (m.deallocations_queued()) (void)m.flush();
    // statistics() processes the free just queued; the next reserve would do it first anyway, so
    // sampling changes no decision of the allocator.
    if (samples.on()) samples.add(i + 1, live, m.statistics().bytes_reserved);
  }
  // On a GPU the frees are stream-ordered: the clock stops once the stream has run them.
  result<void> synced;
  if (o.device == device_choice::cuda) synced = store.synchronize();
  const auto stop = clock_type::now();
  if (!synced) return std::move(synced).err();
  if (!r.stopped) played = n;
  if (o.progress) o.progress(played, n);

  const memory::memory_statistics& st = m.statistics();
  r.events = played;
  r.seconds = std::chrono::duration<double>(stop - start).count();
  r.peak_live_bytes = peak_live;
  r.peak_reserved_bytes = st.peak_bytes_reserved;
  r.peak_in_use_bytes = st.peak_bytes_in_use;
  r.reserved_at_end = st.bytes_reserved;
  r.driver_allocs = st.driver_allocs;
  r.driver_frees = st.driver_frees;
  r.maps = st.maps;
  r.unmaps = st.unmaps;
  detail::note_driver_profile(store, r);
  if (samples.on()) r.timeline = samples.finish(played);
  finish_rates(r);
  handles.clear();  // before the manager goes: not timed
  return r;
}

result<replay_result> replay_actor(const trace& t, const replay_options& o) {
  runtime::runtime_options ro;
  // A replay is reproducible only if the DEVRT_* environment cannot change the policy.
  ro.use_environment = false;
  if (o.memory_limit != 0) ro.memory_limit = runtime::memory_limit_spec{o.memory_limit, 0};
  const bool sim = o.device == device_choice::sim || o.device == device_choice::sim_gpu;
  if (sim) {
    ro.sim = sim_for(o.device);
    ro.sim_layout = o.layout;
  } else {
    ro.host = host_opts();
    ro.host_layout = o.layout;
  }
  auto made = runtime::runtime::create(ro);
  if (!made) return std::move(made).err();
  runtime::runtime& rt = **made;
  const runtime::compute_client client = sim ? rt.sim() : rt.host();

  const std::size_t nt = o.threads;
  // Each thread's events, with ids renumbered to index its own handle vector.
  std::vector<std::vector<trace_event>> mine(nt);
  for (auto& v : mine) v.reserve(t.events.size() / nt + 1);
  for (const trace_event& e : t.events) {
    trace_event local = e;
    local.id = static_cast<std::uint32_t>(e.id / nt);
    mine[e.id % nt].push_back(local);
  }
  std::vector<std::vector<memory::memory_handle>> handles(nt);
  for (std::size_t k = 0; k < nt; ++k) handles[k].resize(t.allocations / nt + 1);

  struct alignas(64) progress_slot {
    std::atomic<std::uint64_t> done{0};
  };
  std::vector<progress_slot> done(nt);
  std::vector<progress_slot> deferred(nt);  // frees sent through the actor, per thread
  std::atomic<std::size_t> finished{0};
  std::atomic<bool> stop_all{false};
  std::atomic<std::uint64_t> failures{0};
  std::mutex failure_mutex;
  std::string first_failure;
  std::latch start_line(static_cast<std::ptrdiff_t>(nt + 1));
  std::vector<clock_type::time_point> ends(nt);

  std::vector<std::thread> workers;
  workers.reserve(nt);
  for (std::size_t k = 0; k < nt; ++k) {
    workers.emplace_back([&, k] {
      const std::vector<trace_event>& ev = mine[k];
      std::vector<memory::memory_handle>& hs = handles[k];
      start_line.arrive_and_wait();
      std::uint64_t j = 0;
      std::uint32_t last_alloc = 0;
      bool last_deferred = false;  // the last create's handle went to the actor: served unknown
      for (; j < ev.size(); ++j) {
        const trace_event& e = ev[j];
        if (e.kind == event_kind::free) {
          // A free must not overtake this thread's earlier creates on the actor, or allocations
          // that overlap in the trace would not overlap there (a handle dropped before its create
          // ran is freed the moment the actor binds it). A create's handle is shared with its
          // queued message until the message has run, so the thread's last create is served, and
          // with it every earlier one, when its handle is alone; then a plain drop is in order.
          // Otherwise the drop goes through the actor, behind the creates. (Real programs keep
          // memory alive with the work that uses it, which is queued behind the create too.)
          const memory::memory_handle& last = hs[last_alloc];
          // An empty last handle was dropped plainly, so it had been served.
          const bool served = o.wait || (!last_deferred && (last.empty() || last.use_count() == 1));
          if (!served) {
            if (e.id == last_alloc) last_deferred = true;
            ++deferred[k].done;
            client.actor()->post(runtime::message([h = std::move(hs[e.id])](runtime::actor_core*, const error*) {}));
          } else {
            hs[e.id].reset();
          }
        } else if (!o.wait) {
          hs[e.id] = client.create(e.size);
          last_alloc = e.id;
          last_deferred = false;
        } else {
          try {
            hs[e.id] = client.reserve(e.size).get();
          } catch (const boost::system::system_error& ex) {
            if (failures.fetch_add(1) == 0) {
              const std::lock_guard<std::mutex> lock(failure_mutex);
              first_failure = fmt::format("thread {}, its event {} ({} bytes): {}", k, j, e.size, ex.what());
            }
            if (o.strict) stop_all.store(true);
          }
          if (stop_all.load(std::memory_order_relaxed)) break;
        }
        if ((j & 0xfff) == 0) done[k].done.store(j, std::memory_order_relaxed);
      }
      done[k].done.store(j, std::memory_order_relaxed);
      // Messages from one thread run in order: once this round trip completes, the actor has
      // served every create this thread posted.
      (void)client.statistics().get();
      ends[k] = clock_type::now();
      finished.fetch_add(1);
    });
  }
  // The clock starts before the workers are released, so that none can finish before it started.
  const auto start = clock_type::now();
  start_line.arrive_and_wait();
  const std::uint64_t total = t.events.size();
  while (o.progress && finished.load() < nt) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::uint64_t sum = 0;
    for (const auto& d : done) sum += d.done.load(std::memory_order_relaxed);
    o.progress(sum, total);
  }
  for (auto& w : workers) w.join();
  // The replay ends when the last thread has seen its last message served.
  const auto stop = *std::max_element(ends.begin(), ends.end());

  replay_result r;
  r.actor = true;
  r.threads = nt;
  // The simulated device's own name, as in core mode (the runtime names its device "sim").
  r.device = sim ? ro.sim->name : client.device().name;
  for (const auto& d : done) r.events += d.done.load();
  if (o.progress) o.progress(r.events, total);
  for (std::size_t k = 0; k < nt; ++k) {
    for (std::uint64_t j = 0; j < done[k].done.load(); ++j) {
      (mine[k][j].kind == event_kind::alloc ? r.allocations : r.frees) += 1;
    }
  }
  for (const auto& d : deferred) r.deferred_frees += d.done.load();
  r.seconds = std::chrono::duration<double>(stop - start).count();
  const memory::memory_statistics st = client.statistics().get();
  r.peak_live_bytes = summarize(t).peak_live_bytes;
  r.peak_reserved_bytes = st.peak_bytes_reserved;
  r.peak_in_use_bytes = st.peak_bytes_in_use;
  r.reserved_at_end = st.bytes_reserved;
  r.driver_allocs = st.driver_allocs;
  r.driver_frees = st.driver_frees;
  r.maps = st.maps;
  r.unmaps = st.unmaps;
  if (o.wait) {
    r.failures = failures.load();
    r.first_failure = first_failure;
    r.stopped = stop_all.load();
  } else {
    // create() reports a failure only on a later use of the handle; the actor's count is all the
    // replay can see.
    r.failures = st.failed_reserves;
    if (r.failures != 0) r.first_failure = "create() failures are counted by the actor; replay with --wait to see them";
  }
  finish_rates(r);
  handles.clear();
  rt.shutdown();
  return r;
}

std::string gnuplot_quote(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('\'');
  for (char c : s) {
    out.push_back(c);
    if (c == '\'') out.push_back('\'');  // gnuplot doubles a quote inside single quotes
  }
  out.push_back('\'');
  return out;
}

}  // namespace

const char* to_string(device_choice d) noexcept {
  switch (d) {
    case device_choice::sim: return "sim";
    case device_choice::sim_gpu: return "sim-gpu";
    case device_choice::host: return "host";
    case device_choice::cuda: return "cuda";
  }
  return "sim";
}

memory::device_properties properties_of(device_choice d) {
  if (d != device_choice::host) return devices::sim_options::h200().props;
  const devices::host_options h = host_opts();
  return {h.max_page_size, h.alignment, h.capacity};
}

result<replay_result> replay(const trace& t, const replay_options& opts) {
  if (opts.baseline) {
    auto r = detail::replay_baseline(t, opts);
    if (r) r->memory_limit = opts.memory_limit;
    return r;
  }
  if (opts.device == device_choice::cuda && opts.threads != 0) {
    return detail::cuda_replay_error("actor mode (--threads) runs on sim or host only; --device cuda is core mode");
  }
  auto r = opts.threads == 0 ? replay_core(t, opts) : replay_actor(t, opts);
  if (r) r->memory_limit = opts.memory_limit;
  return r;
}

result<void> write_timeline_csv(const std::string& path, const std::vector<timeline_point>& timeline) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    error e = error::make(errc::malformed_config, "cannot write the timeline");
    e.text = fmt::format("{}: cannot open for writing: {}", path, std::generic_category().message(errno));
    return e;
  }
  fmt::print(f, "event,live_bytes,reserved_bytes\n");
  for (const timeline_point& p : timeline) fmt::print(f, "{},{},{}\n", p.event, p.live_bytes, p.reserved_bytes);
  const bool bad = std::ferror(f) != 0;
  if (std::fclose(f) != 0 || bad) {
    error e = error::make(errc::malformed_config, "cannot write the timeline");
    e.text = fmt::format("{}: write failed: {}", path, std::generic_category().message(errno));
    return e;
  }
  return {};
}

std::string gnuplot_script(const std::string& csv, const std::string& output, const std::string& title) {
  const bool svg = output.size() >= 4 && output.compare(output.size() - 4, 4, ".svg") == 0;
  std::string s = "set datafile separator ','\n";
  if (svg) {
    s += "set terminal svg size 1200,600 dynamic noenhanced\n";
  } else {
    // pngcairo draws smoother lines; the plain png terminal is the fallback of minimal builds.
    s += "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n  set terminal pngcairo size 1200,600 noenhanced\n"
         "} else {\n  set terminal png size 1200,600 noenhanced\n}\n";
  }
  s += fmt::format("set output {}\n", gnuplot_quote(output));
  s += fmt::format("set title {} noenhanced\n", gnuplot_quote(title));
  s += "set xlabel 'event'\nset ylabel 'GiB'\nset yrange [0:*]\nset key top left\nset grid\n";
  s += fmt::format(
      "plot {0} every ::1 using 1:($2/1073741824.0) with lines lw 2 title 'live (trace)', \\\n"
      "     {0} every ::1 using 1:($3/1073741824.0) with lines lw 2 title 'reserved (devrt)'\n",
      gnuplot_quote(csv));
  return s;
}

std::string find_gnuplot() {
  const char* path = std::getenv("PATH");  // NOLINT(concurrency-mt-unsafe): nothing sets the environment
  if (path == nullptr) return {};
  std::string_view rest(path);
  while (!rest.empty()) {
    const std::size_t colon = rest.find(':');
    const std::string_view dir = rest.substr(0, colon);
    rest.remove_prefix(colon == std::string_view::npos ? rest.size() : colon + 1);
    // (fmt rather than string concatenation: GCC 12 reports a false overlap there.)
    std::string candidate = fmt::format("{}/gnuplot", dir.empty() ? std::string_view(".") : dir);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

}  // namespace devrt::replay
