// devrt-soak: a long mixed run of many client threads on one device, checking as it goes.
//
//   devrt-soak [--ops N] [--threads N] [--device host|sim|cuda] [--seed S] [--layout LAYOUT]
//              [--quiesce-every N] [--progress SECONDS]
//
// Each thread keeps 64 slots of handles and, per operation, creates (and writes a pattern into),
// reserves, drops, copies, binds, reads back and checks, opens persistent scopes, asks for
// cleanups and statistics. Thread 0 opens capture windows under load (host and sim), thread 1
// reconfigures under load. On the host and CUDA devices every allocation gets a byte pattern
// written with `write` and checked with `read`; on the sim device (no memory) the sizes of the
// resources are checked instead.
//
// Every --quiesce-every operations per thread, all threads settle their requests and meet at a
// quiescent point where the usage the actor reports must equal exactly the allocations the
// threads hold (count and bytes), the statistics must agree and check_invariants() must be empty;
// an explicit cleanup must keep every live byte. Every fourth point is a full drain: the threads
// drop everything, nothing may be in use, a reconfiguration must apply, a capture window (warm
// persistent slice, capture, pin) must pin exactly one slice, and after an explicit cleanup no
// page may be left.
//
// Progress goes to stderr; the summary to stdout. Exit status: 0 when every check held, 1 when
// one failed (the first failure is printed), 2 on a usage error.

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

#include "devrt/runtime/runtime.hpp"

namespace {

namespace mem = devrt::memory;
namespace rt = devrt::runtime;
using boost::system::error_code;
using devrt::errc;
using mem::memory_handle;
using rt::compute_client;

constexpr const char* usage_text =
    "usage: devrt-soak [--ops N] [--threads N] [--device host|sim|cuda] [--seed S] [--layout LAYOUT]\n"
    "                  [--quiesce-every N] [--progress SECONDS]\n"
    "  --ops N            operations in all (default 10000000; 10M, 500k and 1_000_000 are accepted)\n"
    "  --threads N        client threads (default 16)\n"
    "  --device D         host (default: patterns written and read back), sim (sizes only) or cuda\n"
    "  --seed S           seed of every thread's random choices (default 1)\n"
    "  --layout LAYOUT    pool layout to start with (default auto: an arena where the device maps\n"
    "                     memory); reconfigurations alternate between it and sub-slices (exclusive-pages\n"
    "                     when it is sub-slices)\n"
    "  --quiesce-every N  operations per thread between quiescent checks (default 25000)\n"
    "  --progress S       seconds between progress lines (default 2; 0: none)\n";

struct settings {
  std::uint64_t ops = 10'000'000;
  unsigned threads = 16;
  std::string device = "host";
  std::uint64_t seed = 1;
  mem::memory_layout layout = mem::preset::automatic;
  std::string layout_text = "auto";
  /// The layout reconfigurations alternate with.
  mem::memory_layout other = mem::preset::sub_slices;
  std::string other_text = "sub-slices";
  std::uint64_t quiesce_every = 25'000;
  double progress = 2.0;
};

/// A count: digits with optional `_` separators and an optional k, m or g suffix (powers of ten).
bool parse_count(const std::string& text, std::uint64_t& out) {
  std::uint64_t v = 0;
  std::size_t i = 0;
  bool digits = false;
  for (; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '_') continue;
    if (c < '0' || c > '9') break;
    if (v > (UINT64_MAX - 9) / 10) return false;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
    digits = true;
  }
  if (!digits) return false;
  const std::string suffix = text.substr(i);
  std::uint64_t mult = 1;
  if (suffix == "k" || suffix == "K") {
    mult = 1000;
  } else if (suffix == "m" || suffix == "M") {
    mult = 1'000'000;
  } else if (suffix == "g" || suffix == "G") {
    mult = 1'000'000'000;
  } else if (!suffix.empty()) {
    return false;
  }
  if (v > UINT64_MAX / mult) return false;
  out = v * mult;
  return true;
}

std::string grouped(std::uint64_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// ---- Patterns ----

std::uint64_t word(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + (i + 1) * 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 31;
  return x * 0x94D049BB133111EBULL;
}

std::vector<std::byte> pattern(std::uint64_t seed, std::uint64_t size) {
  std::vector<std::byte> v(size);
  for (std::uint64_t i = 0; i < size; i += 8) {
    const std::uint64_t w = word(seed, i / 8);
    std::memcpy(v.data() + i, &w, std::min<std::uint64_t>(8, size - i));
  }
  return v;
}

bool holds(const std::vector<std::byte>& v, std::uint64_t seed, std::uint64_t size) {
  if (v.size() != size) return false;
  for (std::uint64_t i = 0; i < size; i += 8) {
    const std::uint64_t w = word(seed, i / 8);
    if (std::memcmp(v.data() + i, &w, std::min<std::uint64_t>(8, size - i)) != 0) return false;
  }
  return true;
}

// ---- Shared counters and failures ----

struct tally {
  std::atomic<std::uint64_t> ops{0};
  std::atomic<std::uint64_t> creates{0};
  std::atomic<std::uint64_t> reserves{0};
  std::atomic<std::uint64_t> drops{0};
  std::atomic<std::uint64_t> copies{0};
  std::atomic<std::uint64_t> binds{0};
  std::atomic<std::uint64_t> writes{0};
  std::atomic<std::uint64_t> checks{0};  // patterns read back intact, or resource sizes right (sim)
  std::atomic<std::uint64_t> corrupt{0};
  std::atomic<std::uint64_t> errors{0};
  std::atomic<std::uint64_t> persistent_scopes{0};
  std::atomic<std::uint64_t> cleanups{0};
  std::atomic<std::uint64_t> captures{0};
  std::atomic<std::uint64_t> configures_applied{0};
  std::atomic<std::uint64_t> configures_kept{0};
  std::atomic<std::uint64_t> configures_refused{0};  // capture_active: a window was open
  std::atomic<std::uint64_t> quiescent{0};
  std::atomic<std::uint64_t> drains{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::string first_failure;

  void fail(const std::string& what) {
    failed = true;
    std::lock_guard lock(mutex);
    if (first_failure.empty()) first_failure = what;
  }
  void error(const std::string& what) {
    errors.fetch_add(1, std::memory_order_relaxed);
    fail(what);
  }
};

struct slot {
  memory_handle h;
  std::uint64_t size = 0;
  std::uint64_t seed = 0;
};

// ---- One client thread ----

class worker {
 public:
  worker(compute_client c, tally& t, const settings& s, unsigned index, bool data, bool concurrent_capture)
      : c_(std::move(c)),
        t_(t),
        s_(s),
        index_(index),
        data_(data),
        concurrent_capture_(concurrent_capture),
        rng_(s.seed * 1'000'003 + index) {
    slots_.resize(64);
  }

  void run_ops(std::uint64_t n) {
    for (std::uint64_t i = 0; i < n; ++i) {
      one_op();
      ++done_;
      if ((done_ & 255) == 0) {
        t_.ops.fetch_add(256, std::memory_order_relaxed);
        settle(256);
      }
    }
  }

  /// Settles every request; with `drain`, drops every handle too.
  void quiesce(bool drain) {
    t_.ops.fetch_add(done_ & 255, std::memory_order_relaxed);
    done_ &= ~std::uint64_t{255};
    close_capture();
    graph_ = {};
    settle(0);
    if (drain) {
      for (auto& s : slots_) drop(s);
    }
  }

  /// Distinct allocations held and their bytes.
  [[nodiscard]] std::pair<std::uint64_t, std::uint64_t> live() const {
    std::unordered_set<const void*> seen;
    std::uint64_t bytes = 0;
    for (const auto& s : slots_) {
      if (s.h && seen.insert(s.h.raw()).second) bytes += s.size;
    }
    return {seen.size(), bytes};
  }

 private:
  std::uint64_t size_choice() {
    const unsigned r = rng_() % 1000;
    if (r < 700) return 1 + rng_() % 1024;
    if (r < 950) return 1024 + rng_() % (16 * 1024);
    if (r < 995) return 16 * 1024 + rng_() % (256 * 1024);
    if (r < 998) return 0;
    return 256 * 1024 + rng_() % (768 * 1024);
  }

  void one_op() {
    slot& s = slots_[rng_() % slots_.size()];
    const unsigned r = rng_() % 1000;
    if (r < 300) {
      create(s);
    } else if (r < 380) {
      const std::uint64_t size = size_choice();
      pending_.emplace_back(size, c_.reserve(size));
      t_.reserves.fetch_add(1, std::memory_order_relaxed);
    } else if (r < 560) {
      drop(s);
    } else if (r < 640) {
      slot& from = slots_[rng_() % slots_.size()];
      if (&from != &s && from.h) {
        drop(s);
        s = from;  // both slots share the memory and its pattern
        t_.copies.fetch_add(1, std::memory_order_relaxed);
      }
    } else if (r < 860) {
      check(s);
    } else if (r < 890) {
      bind(s);
    } else if (r < 920) {
      auto scope = c_.persistent();
      create(s);
      t_.persistent_scopes.fetch_add(1, std::memory_order_relaxed);
    } else if (r < 930) {
      track();
      c_.cleanup([this](error_code ec) {
        if (ec) t_.error("cleanup: " + ec.message());
        t_.cleanups.fetch_add(1, std::memory_order_relaxed);
        untrack();
      });
    } else if (r < 940) {
      track();
      c_.statistics([this](error_code ec, const mem::memory_statistics& st) {
        if (ec) t_.error("statistics: " + ec.message());
        if (!ec && st.bytes_in_use > st.peak_bytes_in_use) t_.fail("statistics: bytes in use above their peak");
        untrack();
      });
    } else {
      check(s);
    }
    if (index_ == 0 && concurrent_capture_) capture_step();
    if (index_ == 1 && done_ % 3001 == 3000) configure_under_load();
  }

  void create(slot& s) {
    drop(s);
    s.size = size_choice();
    s.seed = rng_();
    s.h = c_.create(s.size);
    t_.creates.fetch_add(1, std::memory_order_relaxed);
    write(s);
  }

  void write(const slot& s) {
    if (!data_ || !s.h) return;
    track();
    c_.write(s.h.binding(), pattern(s.seed, s.size), [this](error_code ec) {
      if (ec) t_.error("write: " + ec.message());
      t_.writes.fetch_add(1, std::memory_order_relaxed);
      untrack();
    });
  }

  void check(const slot& s) {
    if (!s.h) return;
    track();
    if (data_) {
      c_.read(s.h.binding(), [this, seed = s.seed, size = s.size](error_code ec, std::vector<std::byte> bytes) {
        if (ec) {
          t_.error("read: " + ec.message());
        } else if (!holds(bytes, seed, size)) {
          t_.corrupt.fetch_add(1, std::memory_order_relaxed);
          t_.fail("a pattern read back differs from the one written: memory was shared or overwritten");
        } else {
          t_.checks.fetch_add(1, std::memory_order_relaxed);
        }
        untrack();
      });
    } else {
      c_.get_resource(s.h.binding(), [this, size = s.size](error_code ec, mem::resource res) {
        if (ec) {
          t_.error("get_resource: " + ec.message());
        } else if (res.size != size) {
          t_.corrupt.fetch_add(1, std::memory_order_relaxed);
          t_.fail("a resource has the wrong size");
        } else {
          t_.checks.fetch_add(1, std::memory_order_relaxed);
        }
        untrack();
      });
    }
  }

  void bind(slot& s) {
    // Only a handle no other slot shares: a bind makes every other copy stale.
    if (!s.h || !s.h.can_mut()) return;
    memory_handle fresh = memory_handle::make();
    track();
    c_.bind(std::move(s.h), fresh, [this](error_code ec) {
      if (ec) t_.error("bind: " + ec.message());
      untrack();
    });
    s.h = std::move(fresh);  // same memory, same pattern; later messages see it bound
    t_.binds.fetch_add(1, std::memory_order_relaxed);
  }

  void drop(slot& s) {
    if (!s.h) return;
    s.h.reset();
    t_.drops.fetch_add(1, std::memory_order_relaxed);
  }

  void capture_step() {
    const std::uint64_t phase = done_ % 4000;
    if (phase == 0) {
      graph_ = {};
      try {
        c_.capture_begin().get();
        capturing_ = true;
      } catch (const std::exception& e) {
        t_.error(std::string("capture_begin: ") + e.what());
      }
    } else if (phase == 40) {
      close_capture();
    }
  }

  void close_capture() {
    if (!capturing_) return;
    capturing_ = false;
    try {
      graph_ = c_.capture_end().get();
      t_.captures.fetch_add(1, std::memory_order_relaxed);
    } catch (const std::exception& e) {
      t_.error(std::string("capture_end: ") + e.what());
    }
  }

  void configure_under_load() {
    const bool other = ((done_ / 3001) % 2) == 1;
    track();
    c_.configure(other ? s_.other : s_.layout, [this](error_code ec, mem::configure_outcome o) {
      if (ec == errc::capture_active) {
        t_.configures_refused.fetch_add(1, std::memory_order_relaxed);
      } else if (ec) {
        t_.error("configure: " + ec.message());
      } else if (o.applied) {
        t_.configures_applied.fetch_add(1, std::memory_order_relaxed);
      } else if (o.live_allocations == 0) {
        t_.fail("configure kept the layout without live allocations");
      } else {
        t_.configures_kept.fetch_add(1, std::memory_order_relaxed);
      }
      untrack();
    });
  }

  /// Collects the reserves and waits until at most `most` callbacks are outstanding.
  void settle(std::uint64_t most) {
    for (auto& [size, f] : pending_) {
      try {
        memory_handle h = f.get();
        slot& s = slots_[rng_() % slots_.size()];
        drop(s);
        s.h = std::move(h);
        s.size = size;
        s.seed = rng_();
        write(s);
      } catch (const std::exception& e) {
        t_.error(std::string("reserve: ") + e.what());
      }
    }
    pending_.clear();
    while (outstanding_.load(std::memory_order_acquire) > most)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  void track() { outstanding_.fetch_add(1, std::memory_order_relaxed); }
  void untrack() { outstanding_.fetch_sub(1, std::memory_order_acq_rel); }

  compute_client c_;
  tally& t_;
  const settings& s_;
  unsigned index_;
  bool data_;
  bool concurrent_capture_;
  std::mt19937_64 rng_;
  std::vector<slot> slots_;
  std::vector<std::pair<std::uint64_t, std::future<memory_handle>>> pending_;
  std::atomic<std::uint64_t> outstanding_{0};
  std::uint64_t done_ = 0;
  bool capturing_ = false;
  rt::device_graph graph_;
};

// ---- Quiescent points ----

class coordinator {
 public:
  coordinator(compute_client c, tally& t, const settings& s, std::vector<std::unique_ptr<worker>>& workers,
              bool measure_reserved)
      : c_(std::move(c)), t_(t), s_(s), workers_(workers), measure_reserved_(measure_reserved) {}

  /// Runs at each quiescent point, while every worker waits.
  void check(bool drain) noexcept {
    try {
      run(drain);
    } catch (const std::exception& e) {
      t_.error(std::string("at a quiescent point: ") + e.what());
    }
  }

 private:
  void expect(bool ok, const std::string& what) {
    if (!ok) t_.fail("quiescent point " + std::to_string(t_.quiescent.load() + 1) + ": " + what);
  }

  void run(bool drain) {
    std::uint64_t count = 0;
    std::uint64_t bytes = 0;
    for (const auto& w : workers_) {
      const auto [n, b] = w->live();
      count += n;
      bytes += b;
    }
    const mem::memory_usage u = c_.memory_usage().get();
    expect(u.number_allocs == count, "the actor counts " + std::to_string(u.number_allocs) +
                                         " live allocations, the threads hold " + std::to_string(count));
    expect(u.bytes_in_use == bytes, "the actor counts " + std::to_string(u.bytes_in_use) +
                                        " bytes in use, the threads hold " + std::to_string(bytes));
    const mem::memory_statistics st = c_.statistics().get();
    expect(st.bytes_in_use == u.bytes_in_use, "statistics and usage disagree on the bytes in use");
    expect(st.bytes_reserved == u.bytes_reserved, "statistics and usage disagree on the bytes reserved");
    const std::string problem = c_.check_invariants().get();
    expect(problem.empty(), "check_invariants: " + problem);
    c_.cleanup().get();
    t_.cleanups.fetch_add(1, std::memory_order_relaxed);
    const mem::memory_usage after = c_.memory_usage().get();
    expect(after.bytes_in_use == u.bytes_in_use && after.number_allocs == u.number_allocs,
           "an explicit cleanup changed the live memory");
    expect(after.bytes_reserved <= u.bytes_reserved, "an explicit cleanup reserved more");
    if (drain) {
      expect(count == 0 && u.number_allocs == 0 && u.bytes_in_use == 0, "memory in use after every thread dropped all");
      const bool other = (t_.drains.load() % 2) == 0;
      const auto o = c_.configure(other ? s_.other : s_.layout).get();
      expect(o.applied, "a reconfiguration with nothing live was not applied");
      if (o.applied) t_.configures_applied.fetch_add(1, std::memory_order_relaxed);
      capture_window();
      c_.cleanup().get();
      const mem::memory_usage empty = c_.memory_usage().get();
      if (measure_reserved_) {
        expect(empty.bytes_reserved == 0,
               std::to_string(empty.bytes_reserved) + " bytes still reserved after dropping everything and a cleanup");
      }
      t_.drains.fetch_add(1, std::memory_order_relaxed);
    }
    t_.quiescent.fetch_add(1, std::memory_order_relaxed);
  }

  /// A capture window on a quiet device: the persistent slice warmed before is reused inside the
  /// window and pinned; nothing else is.
  void capture_window() {
    {
      auto scope = c_.persistent();
      memory_handle warm = c_.reserve(4096).get();
    }  // dropped: the slice is free, kept by the persistent pool
    c_.capture_begin().get();
    memory_handle inside = c_.reserve(4096).get();
    rt::device_graph g = c_.capture_end().get();
    t_.captures.fetch_add(1, std::memory_order_relaxed);
    expect(g.pins().size() == 1, "a capture window pinned " + std::to_string(g.pins().size()) + " slices, not 1");
  }

  compute_client c_;
  tally& t_;
  const settings& s_;
  std::vector<std::unique_ptr<worker>>& workers_;
  bool measure_reserved_;
};

int usage_error(const std::string& what) {
  std::fprintf(stderr, "devrt-soak: %s\n%s", what.c_str(), usage_text);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      std::printf("%s", usage_text);
      return 0;
    }
    if (i + 1 >= argc)
      return usage_error(arg == "--ops" || arg == "--threads" || arg == "--device" || arg == "--seed" ||
                                 arg == "--layout" || arg == "--quiesce-every" || arg == "--progress"
                             ? arg + " needs a value"
                             : "unknown option '" + arg + "'");
    const std::string value = argv[++i];
    std::uint64_t n = 0;
    if (arg == "--ops") {
      if (!parse_count(value, n) || n == 0) return usage_error("--ops must be a positive count, not '" + value + "'");
      s.ops = n;
    } else if (arg == "--threads") {
      if (!parse_count(value, n) || n == 0 || n > 1024) return usage_error("--threads must be between 1 and 1024");
      s.threads = static_cast<unsigned>(n);
    } else if (arg == "--device") {
      if (value != "host" && value != "sim" && value != "cuda") return usage_error("--device is host, sim or cuda");
      s.device = value;
    } else if (arg == "--seed") {
      if (!parse_count(value, n)) return usage_error("--seed must be a number");
      s.seed = n;
    } else if (arg == "--layout") {
      auto l = mem::parse_layout(value);
      if (!l) return usage_error(l.err().message());
      s.layout = *l;
      s.layout_text = value;
      const auto* p = std::get_if<mem::preset>(&l->value);
      const bool sub_slices = p != nullptr && *p == mem::preset::sub_slices;
      s.other = sub_slices ? mem::preset::exclusive_pages : mem::preset::sub_slices;
      s.other_text = sub_slices ? "exclusive-pages" : "sub-slices";
    } else if (arg == "--quiesce-every") {
      if (!parse_count(value, n) || n == 0) return usage_error("--quiesce-every must be a positive count");
      s.quiesce_every = n;
    } else if (arg == "--progress") {
      try {
        s.progress = std::stod(value);
      } catch (const std::exception&) {
        return usage_error("--progress must be a number of seconds");
      }
    } else {
      return usage_error("unknown option '" + arg + "'");
    }
  }

  rt::runtime_options opts;
  opts.use_environment = true;
  opts.use_cuda = s.device == "cuda";
  if (s.device == "host") opts.host_layout = s.layout;
  if (s.device == "sim") {
    opts.sim = devrt::devices::sim_options::h200();
    opts.sim_layout = s.layout;
  }
  if (s.device == "cuda") opts.cuda_layout = s.layout;
  auto created = rt::runtime::create(opts);
  if (!created) {
    std::fprintf(stderr, "devrt-soak: %s\n", created.err().message().c_str());
    return 1;
  }
  std::unique_ptr<rt::runtime> runtime = std::move(*created);
  compute_client c;
  try {
    c = s.device == "host" ? runtime->host() : s.device == "sim" ? runtime->sim() : runtime->cuda(0);
  } catch (const devrt::exception& e) {
    std::fprintf(stderr, "devrt-soak: no %s device: %s\n", s.device.c_str(), e.what());
    return 1;
  }
  const bool data = s.device != "sim";
  // On CUDA devices, work submitted while a capture window is open is recorded instead of run, so
  // capture windows are opened only at quiescent points there.
  const bool concurrent_capture = s.device != "cuda";

  tally t;
  std::vector<std::unique_ptr<worker>> workers;
  for (unsigned i = 0; i < s.threads; ++i) {
    workers.push_back(std::make_unique<worker>(c, t, s, i, data, concurrent_capture));
  }
  coordinator coord(c, t, s, workers, s.device != "cuda");
  const std::uint64_t per_thread = (s.ops + s.threads - 1) / s.threads;
  const std::uint64_t epochs = (per_thread + s.quiesce_every - 1) / s.quiesce_every;
  std::atomic<std::uint64_t> epoch{0};
  auto at_quiescent = [&]() noexcept {
    const std::uint64_t e = epoch.fetch_add(1) + 1;
    coord.check(e % 4 == 0 || e == epochs);
  };
  std::barrier<decltype(at_quiescent)> meet(static_cast<std::ptrdiff_t>(s.threads), at_quiescent);

  std::printf("devrt-soak: %s device, %u threads, %s operations (%s per thread), seed %" PRIu64
              ", layout %s (reconfigured to %s and back), quiescent checks every %s operations per thread\n",
              c.device().name.c_str(), s.threads, grouped(per_thread * s.threads).c_str(), grouped(per_thread).c_str(),
              s.seed, s.layout_text.c_str(), s.other_text.c_str(), grouped(s.quiesce_every).c_str());
  std::fflush(stdout);

  const auto start = std::chrono::steady_clock::now();
  std::atomic<bool> finished{false};
  std::thread progress([&] {
    if (s.progress <= 0) return;
    auto next = start;
    std::uint64_t last_ops = 0;
    while (!finished.load()) {
      next +=
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(s.progress));
      while (!finished.load() && std::chrono::steady_clock::now() < next) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (finished.load()) break;
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const std::uint64_t ops = t.ops.load();
      std::fprintf(
          stderr, "[%7.1f s] %s ops (%s ops/s now) | checks %s | errors %" PRIu64 " | quiescent points %" PRIu64 "\n",
          secs, grouped(ops).c_str(), grouped(static_cast<std::uint64_t>((ops - last_ops) / s.progress)).c_str(),
          grouped(t.checks.load()).c_str(), t.errors.load(), t.quiescent.load());
      last_ops = ops;
    }
  });

  std::vector<std::thread> threads;
  for (unsigned i = 0; i < s.threads; ++i) {
    threads.emplace_back([&, i] {
      worker& w = *workers[i];
      for (std::uint64_t e = 1; e <= epochs; ++e) {
        const std::uint64_t begin = (e - 1) * s.quiesce_every;
        const std::uint64_t n = std::min(s.quiesce_every, per_thread - std::min(per_thread, begin));
        w.run_ops(n);
        w.quiesce(e % 4 == 0 || e == epochs);
        meet.arrive_and_wait();
      }
    });
  }
  for (auto& th : threads) th.join();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  finished = true;
  progress.join();

  const std::uint64_t messages = c.actor()->messages_processed();
  const mem::memory_statistics st = c.statistics().get();
  workers.clear();
  runtime.reset();

  const bool pass = !t.failed.load() && t.errors.load() == 0 && t.corrupt.load() == 0;
  const std::uint64_t ops = t.ops.load();
  std::printf("devrt-soak summary\n");
  std::printf("  device            %s\n", c.device().name.c_str());
  std::printf("  operations        %s in %.1f s (%s ops/s); %s actor messages\n", grouped(ops).c_str(), secs,
              grouped(static_cast<std::uint64_t>(static_cast<double>(ops) / secs)).c_str(), grouped(messages).c_str());
  std::printf("  requests          %s creates, %s reserves, %s drops, %s copies, %s binds, %s persistent scopes\n",
              grouped(t.creates.load()).c_str(), grouped(t.reserves.load()).c_str(), grouped(t.drops.load()).c_str(),
              grouped(t.copies.load()).c_str(), grouped(t.binds.load()).c_str(),
              grouped(t.persistent_scopes.load()).c_str());
  std::printf("  checks            %s %s, %s failed\n", grouped(t.checks.load()).c_str(),
              data ? "patterns read back intact" : "resource sizes right", grouped(t.corrupt.load()).c_str());
  if (data) std::printf("  writes            %s patterns written\n", grouped(t.writes.load()).c_str());
  std::printf("  quiescent points  %s (usage equal to what the threads hold, invariants held), %s full drains\n",
              grouped(t.quiescent.load()).c_str(), grouped(t.drains.load()).c_str());
  std::printf("  configures        %s applied, %s kept (memory live), %s refused (capture window open)\n",
              grouped(t.configures_applied.load()).c_str(), grouped(t.configures_kept.load()).c_str(),
              grouped(t.configures_refused.load()).c_str());
  std::printf("  captures          %s windows; cleanups %s\n", grouped(t.captures.load()).c_str(),
              grouped(t.cleanups.load()).c_str());
  std::printf("  device            %s driver allocations, %s frees, %s reclaims, peak %s reserved\n",
              grouped(st.driver_allocs).c_str(), grouped(st.driver_frees).c_str(), grouped(st.reclaims).c_str(),
              mem::format_bytes(st.peak_bytes_reserved).c_str());
  std::printf("  errors            %s\n", grouped(t.errors.load()).c_str());
  if (!pass) std::printf("  first failure     %s\n", t.first_failure.c_str());
  std::printf("  result            %s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}
