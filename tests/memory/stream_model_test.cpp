// The stream-order contract, checked against a model of the GPU on every path.
//
// A simulated device with streams runs random programs of a client: reserves on the device's own,
// the legacy, the per-thread and native streams, kernels ("uses": events the test records on a
// stream), record_stream (a stream of another device included), frees, batch ends, streams that
// progress one at a time, explicit cleanups, memory limits set below what is held, configure,
// reclaims, capture windows whose pins a graph replays and drops, retired streams, streams
// destroyed with work still queued and created again with the same handle, a tag's memory put to
// sleep (kept or discarded) and woken while other streams still run, and the driver failing: event
// records and queries, free-time records, allocations and maps, flushes. Two things may never
// happen:
//
// - a reserve on stream T gets memory whose earlier uses T's work is not ordered after (a use has
//   passed, or is on T itself, or T waits for an event behind it);
// - the driver gets memory back (a page freed, a mapping unmapped) while a use of it is still
//   pending, or memory of a live allocation at all, unless its tag sleeps (then only once every
//   use of it has passed).
//
// Every check names the seed, the step and what happened. A planted bug in the stream order
// (say, an explicit cleanup that takes unfenced frees for done) makes it fail within a few hundred
// steps; RELIABILITY.md has the list.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/memory_manager.hpp"

using namespace devrt;
using namespace devrt::memory;

namespace {

constexpr std::uint64_t kib = 1ULL << 10;
constexpr std::uint64_t mib = 1ULL << 20;

bool overlap(const storage_handle& a, const storage_handle& b) {
  return a.id == b.id && a.offset < b.offset + std::max<std::uint64_t>(b.size, 1) &&
         b.offset < a.offset + std::max<std::uint64_t>(a.size, 1);
}

struct stream_slot {
  stream_id handle;
  bool native;
  bool alive = true;
  bool foreign = false;
  std::uint64_t uid = 0;  // the simulated stream its handle named when it was made
};

struct allocation {
  memory_handle h;
  storage_handle at;
  bool tagged = false;            // under the model's tag (its own arena; it sleeps and wakes)
  std::size_t stream;             // index into streams
  std::vector<std::size_t> also;  // streams record_stream added
  std::vector<event> uses;
};

struct freed {
  storage_handle at;
  std::vector<event> uses;
};

struct graph {
  std::vector<memory_handle> pins;
  std::vector<storage_handle> at;
  std::vector<event> uses;
  event drop_after = 0;  // dropping: the pins go once this event (on the device's stream) passed
};

const char* const layouts[] = {"auto", "sub-slices", "exclusive-pages", "sliced:page=8MiB,slice=2MiB;arena",
                               "arena:slack=0,grow=0"};

class model {
 public:
  model(std::uint64_t seed, const char* layout, std::uint64_t capacity, bool deferred)
      : seed_(seed), rng_(seed), layout_(layout), deferred_(deferred) {
    devices::sim_options o;
    o.streams = true;
    o.deferred_unmaps = deferred;
    o.props.map_granularity = 2 * mib;
    o.props.capacity = capacity;
    auto store = storage::make<devices::sim_storage>(o);
    sim_ = store.backend<devices::sim_storage>();
    sim_->on_give_back = [this](const devices::sim_storage::given_back& g) { given_back(g); };
    manager_options opts;
    opts.layout = parse_layout(layout).value();
    opts.reclaim_on_out_of_memory = true;
    m_ = std::make_unique<memory_manager>(std::move(store), opts);
    streams_.push_back(stream_slot{streams::device, false});
    streams_.push_back(stream_slot{streams::legacy, false});
    streams_.push_back(stream_slot{streams::per_thread, false});
    for (int i = 0; i < 3; ++i) add_native();
    const stream_id f = sim_->create_stream(1);
    foreign_ = streams_.size();
    streams_.push_back(stream_slot{f, true, true, true, sim_->stream_uid(f)});
  }

  model(const model&) = delete;
  model& operator=(const model&) = delete;
  // A run cut short by a problem ends here: the manager's teardown gives memory back, and the
  // model's checks (whose state goes first) must not see it.
  ~model() {
    if (m_) sim_->on_give_back = nullptr;
  }

  std::string where() const {
    return "seed " + std::to_string(seed_) + " (" + layout_ + ") step " + std::to_string(step_);
  }

  void run(int steps) {
    for (step_ = 0; step_ < steps; ++step_) {
      one_step();
      if (!problems_.empty()) return;
      if (step_ % 97 == 0) {
        const std::string p = m_->check_invariants();
        if (!p.empty()) problems_.push_back(where() + ": " + p);
      }
      prune();
    }
  }

  void finish() {
    if (capturing_) end_capture();
    sim_->progress();
    settle();
    for (auto& g : graphs_) {
      for (std::size_t i = 0; i < g.pins.size(); ++i) free_pin(g, i);
    }
    graphs_.clear();
    while (!lives_.empty()) free_one(lives_.size() - 1);
    m_->want_fences();
    (void)m_->end_batch();
    sim_->progress();
    (void)m_->end_batch();
    (void)m_->end_batch();
    // Frees whose record failed come back only through a synchronization of the device.
    (void)m_->reclaim();
    const std::string p = m_->check_invariants();
    if (!p.empty()) problems_.push_back(where() + " at the end: " + p);
    if (m_->usage().number_allocs != 0) {
      problems_.push_back(where() + ": allocations left at the end; held " + std::to_string(m_->order().held_count()) +
                          ", pending " + std::to_string(m_->order().pending()) + ", broken " +
                          std::to_string(m_->order().broken_streams()) + "\n" + m_->order().describe());
    }
    m_.reset();  // teardown: the device is synchronized, then everything goes back
  }

  const std::vector<std::string>& problems() const { return problems_; }
  std::uint64_t reserves() const { return reserves_; }
  std::uint64_t checks() const { return checks_; }

 private:
  std::uint64_t pick(std::uint64_t n) { return rng_() % n; }

  void add_native() {
    const stream_id s = sim_->create_stream();
    streams_.push_back(stream_slot{s, true, true, false, sim_->stream_uid(s)});
  }

  /// The simulated stream a stream's work runs on (the per-thread default stream's work is ordered
  /// on the legacy stream, as devrt records it).
  std::uint64_t work_uid(const stream_slot& s) const {
    if (s.handle == streams::per_thread) return sim_->stream_uid(streams::legacy);
    return s.native ? s.uid : sim_->stream_uid(s.handle);
  }

  std::size_t live_stream() {
    for (;;) {
      const std::size_t i = pick(streams_.size());
      if (streams_[i].alive && !streams_[i].foreign) return i;
    }
  }

  bool referenced(std::size_t stream) const {
    for (const auto& a : lives_) {
      if (a.stream == stream || std::find(a.also.begin(), a.also.end(), stream) != a.also.end()) return true;
    }
    return false;
  }

  void given_back(const devices::sim_storage::given_back& g) {
    ++checks_;
    const storage_handle back{g.id, g.offset, g.size};
    for (const auto& f : freed_) {
      if (!overlap(back, f.at)) continue;
      for (const event e : f.uses) {
        if (!sim_->has_passed(e)) {
          problems_.push_back(where() + ": the driver got memory back (id " + std::to_string(g.id) + " offset " +
                              std::to_string(g.offset) + ", " + std::to_string(g.size) +
                              " bytes) while a use of it was still queued (event " + std::to_string(e) + ")");
          return;
        }
      }
    }
    for (const auto& a : lives_) {
      if (!overlap(back, a.at)) continue;
      if (!a.tagged || !asleep_) {
        problems_.push_back(where() + ": the driver got back memory of a live allocation");
        return;
      }
      for (const event e : a.uses) {
        if (!sim_->has_passed(e)) {
          problems_.push_back(where() + ": a sleep gave the driver memory of a live allocation (id " +
                              std::to_string(g.id) + " offset " + std::to_string(a.at.offset) +
                              ") while a use of it was still queued (event " + std::to_string(e) + ")");
          return;
        }
      }
    }
  }

  void check_reserve(const storage_handle& at, const stream_slot& t) {
    ++checks_;
    const std::uint64_t uid = work_uid(t);
    for (const auto& f : freed_) {
      if (!overlap(at, f.at)) continue;
      for (const event e : f.uses) {
        if (!sim_->ordered_after(uid, e)) {
          problems_.push_back(where() + ": stream " + std::to_string(t.handle) + " got memory (id " +
                              std::to_string(at.id) + " offset " + std::to_string(at.offset) +
                              ") that a use on another stream (event " + std::to_string(e) +
                              ") may still touch: its work is not ordered after it");
          return;
        }
      }
    }
    for (const auto& a : lives_) {
      if (overlap(at, a.at)) {
        problems_.push_back(where() + ": two live allocations overlap");
        return;
      }
    }
  }

  void reserve() {
    const std::size_t si = live_stream();
    const std::uint64_t roll = pick(100);
    std::uint64_t size = roll < 60 ? 512 * (1 + pick(64)) : roll < 95 ? 64 * kib * (1 + pick(48)) : 12 * mib;
    if (capturing_) size = warm_sizes[pick(std::size(warm_sizes))];
    if (pick(50) == 0) sim_->fail_allocation(1);
    if (pick(80) == 0) sim_->fail_next_map();
    if (pick(100) == 0) {
      // Memory of this device for another device's stream: refused, and nothing changes.
      const stream_slot& f = streams_[foreign_];
      auto r = m_->reserve(size, f.handle);
      if (r || r.code() != errc::invalid_argument) {
        problems_.push_back(where() + ": a reserve for another device's stream was not refused");
      }
      return;
    }
    const bool tagged = pick(5) == 0;
    const bool into = !tagged && pick(4) == 0;
    memory_handle h;
    if (tagged) {
      auto r = m_->reserve(size, streams_[si].handle, tag_);
      if (!r) {
        if (r.code() == errc::asleep && asleep_) return;
        return expect_refusal(r.err());
      }
      h = std::move(*r);
    } else if (into) {
      h = memory_handle::make();
      auto r = m_->reserve_into(size, h, streams_[si].handle);
      if (!r) return expect_refusal(r.err());
    } else {
      auto r = m_->reserve(size, streams_[si].handle);
      if (!r) return expect_refusal(r.err());
      h = std::move(*r);
    }
    ++reserves_;
    const storage_handle at = m_->get_storage(h).value();
    say("reserve " + std::to_string(size) + " on " + std::to_string(streams_[si].handle) + " at id " +
        std::to_string(at.id) + " offset " + std::to_string(at.offset));
    check_reserve(at, streams_[si]);
    lives_.push_back(allocation{std::move(h), at, tagged, si, {}, {}});
  }

  void expect_refusal(const error& e) {
    if (e.code == errc::out_of_memory || e.code == errc::pool_capacity_exceeded || e.code == errc::capture_active ||
        e.code == errc::buffer_too_big ||
        (e.code == errc::device_error && std::string(e.detail) == "injected map failure")) {
      return;
    }
    problems_.push_back(where() + ": a reserve failed unexpectedly: " + e.message());
  }

  void use() {
    if (lives_.empty()) return;
    allocation& a = lives_[pick(lives_.size())];
    if (a.tagged && asleep_) return;  // a kernel on sleeping memory is the program's error
    std::size_t si = a.stream;
    if (!a.also.empty() && pick(2) == 0) si = a.also[pick(a.also.size())];
    if (!streams_[si].alive) return;
    if (capturing_ && (streams_[si].handle == streams::device)) return;  // the device's stream records
    auto e = sim_->record_event(streams_[si].handle);
    if (!e) return;
    a.uses.push_back(*e);
    say("use id " + std::to_string(a.at.id) + " offset " + std::to_string(a.at.offset) + " on " +
        std::to_string(streams_[si].handle) + ": event " + std::to_string(*e));
  }

  void record_stream() {
    if (lives_.empty()) return;
    allocation& a = lives_[pick(lives_.size())];
    std::size_t si = pick(streams_.size());
    if (!streams_[si].alive) return;
    auto r = m_->record_stream(a.h.binding(), streams_[si].handle);
    if (!r) {
      if (r.code() == errc::capture_active) return;
      problems_.push_back(where() + ": record_stream failed: " + r.err().message());
      return;
    }
    if (si != a.stream && std::find(a.also.begin(), a.also.end(), si) == a.also.end()) a.also.push_back(si);
  }

  void free_one(std::size_t i) {
    allocation a = std::move(lives_[i]);
    lives_[i] = std::move(lives_.back());
    lives_.pop_back();
    freed_.push_back(freed{a.at, a.uses});
    say("free id " + std::to_string(a.at.id) + " offset " + std::to_string(a.at.offset));
    a.h.reset();
  }

  void bind() {
    if (lives_.empty()) return;
    allocation& a = lives_[pick(lives_.size())];
    memory_handle fresh = memory_handle::make();
    auto r = m_->bind(std::move(a.h), fresh);
    if (!r) {
      problems_.push_back(where() + ": bind failed: " + r.err().message());
      return;
    }
    a.h = std::move(fresh);
  }

  void progress_one() {
    const stream_slot& s = streams_[pick(streams_.size())];
    sim_->progress_uid(s.native ? s.uid : work_uid(s));
  }

  void begin_capture() {
    // Warm the persistent pool with the sizes the window uses, as a user runs the work once first.
    m_->mode(allocation_mode::persistent);
    std::vector<memory_handle> warm;
    for (const std::uint64_t s : warm_sizes) {
      if (auto r = m_->reserve(s, streams::device)) warm.push_back(std::move(*r));
    }
    m_->mode(allocation_mode::automatic);
    warm.clear();
    (void)m_->end_batch();
    (void)sim_->begin_capture();
    m_->capture_begin();
    capturing_ = true;
  }

  void end_capture() {
    (void)sim_->end_capture();
    auto pins = m_->capture_end();
    capturing_ = false;
    if (!pins) {
      problems_.push_back(where() + ": capture_end failed: " + pins.err().message());
      return;
    }
    graph g;
    for (auto& p : *pins) {
      g.at.push_back(m_->get_storage(p).value());
      g.pins.push_back(std::move(p));
    }
    graphs_.push_back(std::move(g));
  }

  void replay() {
    if (graphs_.empty() || capturing_) return;
    graph& g = graphs_[pick(graphs_.size())];
    if (g.drop_after != 0) return;
    auto e = sim_->record_event(streams::device);
    if (!e) return;
    g.uses.push_back(*e);
    // Memory a live allocation shares with the graph is used by the replay too.
    for (auto& a : lives_) {
      for (const auto& p : g.pins) {
        if (p.raw() == a.h.raw()) a.uses.push_back(*e);
      }
    }
  }

  void free_pin(graph& g, std::size_t i) {
    if (!g.pins[i]) return;
    bool shared = false;
    for (const auto& a : lives_) shared = shared || a.h.raw() == g.pins[i].raw();
    if (!shared) freed_.push_back(freed{g.at[i], g.uses});
    g.pins[i].reset();
  }

  void drop_graphs() {
    // A dropped graph is released behind an event on the device's stream, as device_graph does.
    for (std::size_t k = 0; k < graphs_.size();) {
      graph& g = graphs_[k];
      if (g.drop_after == 0 && pick(3) == 0 && !capturing_) {
        if (auto e = sim_->record_event(streams::device)) g.drop_after = *e;
      }
      if (g.drop_after != 0 && sim_->has_passed(g.drop_after)) {
        for (std::size_t i = 0; i < g.pins.size(); ++i) free_pin(g, i);
        graphs_[k] = std::move(graphs_.back());
        graphs_.pop_back();
        continue;
      }
      ++k;
    }
  }

  void retire() {
    const std::size_t si = pick(streams_.size());
    stream_slot& s = streams_[si];
    if (!s.native || !s.alive || s.foreign || referenced(si)) return;
    if (auto r = m_->retire_stream(s.handle); !r && r.code() != errc::device_error) {
      problems_.push_back(where() + ": retire failed: " + r.err().message());
    }
  }

  void destroy_and_create() {
    const std::size_t si = pick(streams_.size());
    stream_slot& s = streams_[si];
    if (!s.native || !s.alive || s.foreign || referenced(si)) return;
    sim_->destroy_stream(s.handle);  // its work still runs (progress_uid)
    s.alive = false;
    add_native();  // usually the same handle, now another stream
  }

  void say(const std::string& what) {
    if (trace_) std::printf("  [%d] %s\n", step_, what.c_str());
  }

  void one_step() {
    settle();
    const std::uint64_t op = pick(1030);
    if (trace_) std::printf("  [%d] op %llu lives %zu\n", step_, static_cast<unsigned long long>(op), lives_.size());
    if (op < 280) {
      reserve();
    } else if (op < 470) {
      use();
    } else if (op < 520) {
      record_stream();
    } else if (op < 700) {
      if (!lives_.empty()) {
        if (pick(40) == 0) sim_->fail_next_free_record();
        free_one(pick(lives_.size()));
      }
    } else if (op < 770) {
      if (pick(60) == 0) sim_->fail_next_record();
      if (pick(60) == 0) sim_->fail_next_query();
      if (pick(80) == 0) sim_->fail_next_flush();
      (void)m_->end_batch();
    } else if (op < 790) {
      m_->want_fences();
      (void)m_->end_batch();
    } else if (op < 880) {
      progress_one();
    } else if (op < 885) {
      sim_->progress();
    } else if (op < 900) {
      (void)m_->cleanup(true);
    } else if (op < 905) {
      // A memory limit below what the device holds (free memory goes back at once, freed memory
      // as its fences pass), or none again.
      const std::uint64_t held = m_->statistics().bytes_reserved;
      auto r = m_->set_memory_limit(pick(2) == 0 ? 0 : held / 2 + 1);
      if (!r && r.code() != errc::device_error) {
        problems_.push_back(where() + ": set_memory_limit failed: " + r.err().message());
      }
    } else if (op < 912) {
      auto r = m_->configure(parse_layout(layouts[pick(std::size(layouts))]).value());
      if (!r && r.code() != errc::capture_active && r.code() != errc::device_error) {
        problems_.push_back(where() + ": configure failed: " + r.err().message());
      }
    } else if (op < 920) {
      (void)m_->reclaim();
    } else if (op < 930) {
      if (capturing_) {
        end_capture();
      } else if (pick(3) == 0) {
        begin_capture();
      }
    } else if (op < 950) {
      replay();
    } else if (op < 965) {
      drop_graphs();
    } else if (op < 975) {
      retire();
    } else if (op < 990) {
      destroy_and_create();
    } else if (op < 1000) {
      bind();
    } else if (op < 1015) {
      sleep_tag();
    } else {
      wake_tag();
    }
  }

  // A sleep or wake is complete once its event passed (the actor parks on it and then settles).
  void settle() {
    if (!settling_ || !sim_->has_passed(settle_after_)) return;
    settling_ = false;
    if (auto r = m_->settle_tag(tag_); !r && r.code() != errc::device_error) {
      problems_.push_back(where() + ": settle_tag failed: " + r.err().message());
    }
  }

  void sleep_tag() {
    // A sleep unmaps live memory and counts on the storage's contract that unmaps follow the work
    // queued on the device (as on CUDA): only the simulated device that keeps it sleeps here.
    if (settling_ || !deferred_) return;
    const bool keep = pick(2) == 0;
    asleep_ = true;  // the driver may get the memory back within the call
    auto r = m_->sleep(tag_, keep);
    if (!r) {
      asleep_ = tag_asleep();
      if (r.code() == errc::capture_active && capturing_) return;
      if (r.code() == errc::device_error) return;  // an injected failure: the tag stays awake
      problems_.push_back(where() + ": sleep failed: " + r.err().message());
      return;
    }
    say(std::string("sleep, contents ") + (keep ? "kept" : "discarded") + ": event " + std::to_string(*r));
    asleep_ = tag_asleep();  // a tag with no memory here yet does not sleep
    settling_ = asleep_;
    settle_after_ = *r;
  }

  void wake_tag() {
    if (settling_ || !asleep_) return;
    auto r = m_->wake(tag_);
    if (!r) {
      if (r.code() == errc::capture_active && capturing_) return;
      if (r.code() == errc::out_of_memory || r.code() == errc::device_error) return;  // still asleep
      problems_.push_back(where() + ": wake failed: " + r.err().message());
      return;
    }
    say("wake: event " + std::to_string(*r));
    asleep_ = false;
    settling_ = true;
    settle_after_ = *r;
    if (tag_asleep()) problems_.push_back(where() + ": the tag is still asleep after a wake that succeeded");
  }

  bool tag_asleep() {
    for (const tag_usage& t : m_->tags()) {
      if (t.name == "model") return t.state == tag_state::asleep;
    }
    return false;
  }

  void prune() {
    // A freed range whose every use has passed cannot be misused any more.
    std::erase_if(freed_, [&](const freed& f) {
      return std::all_of(f.uses.begin(), f.uses.end(), [&](event e) { return sim_->has_passed(e); });
    });
  }

  static constexpr std::uint64_t warm_sizes[] = {4 * kib, 64 * kib, mib};

  std::uint64_t seed_;
  std::mt19937_64 rng_;
  std::string layout_;
  bool deferred_;  // the simulated device's unmaps follow its queued work
  int step_ = 0;
  devices::sim_storage* sim_ = nullptr;
  std::unique_ptr<memory_manager> m_;
  std::vector<stream_slot> streams_;
  std::size_t foreign_ = 0;  // the stream of another device
  std::vector<allocation> lives_;
  const tag_id tag_ = intern_tag(tag_name("model")).value();
  bool asleep_ = false;    // the tag's state in the manager
  bool settling_ = false;  // a sleep or wake waits for settle_after_ before settle_tag
  event settle_after_ = 0;
  std::vector<freed> freed_;
  std::vector<graph> graphs_;
  bool capturing_ = false;
  std::vector<std::string> problems_;
  std::uint64_t reserves_ = 0;
  std::uint64_t checks_ = 0;
  bool trace_ = std::getenv("DEVRT_MODEL_TRACE") != nullptr;
};

}  // namespace

TEST(StreamModel, NoMemoryReachesAnotherStreamOrTheDriverBeforeItsUsesPass) {
  std::uint64_t reserves = 0;
  std::uint64_t checks = 0;
  int runs = 0;
  const char* only = std::getenv("DEVRT_MODEL_SEED");
  for (std::uint64_t seed = 1; seed <= 48; ++seed) {
    if (only != nullptr && std::strtoull(only, nullptr, 10) != seed) continue;
    const char* layout = layouts[seed % std::size(layouts)];
    const std::uint64_t capacity = seed % 3 == 0 ? 160 * mib : 0;
    const bool deferred = seed % 2 == 0;
    model m(seed, layout, capacity, deferred);
    m.run(4000);
    if (m.problems().empty()) m.finish();
    for (const auto& p : m.problems()) ADD_FAILURE() << p;
    if (!m.problems().empty()) break;
    reserves += m.reserves();
    checks += m.checks();
    ++runs;
  }
  std::printf("[ model    ] %d programs of 4000 steps, %llu reserves, %llu checks of reserves and returns\n", runs,
              static_cast<unsigned long long>(reserves), static_cast<unsigned long long>(checks));
}
