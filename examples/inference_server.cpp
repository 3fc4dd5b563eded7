// A multi-threaded inference server on one device.
//
// The model's weights are loaded once into persistent memory. Worker threads then take requests
// from a shared counter and serve each one through the device's memory actor. On a CUDA device
// every worker has a stream of its own: it reserves each activation for that stream (the handle's
// address is there as soon as the reserve completes), launches the layers' kernels on it from its
// own thread, and drops each activation as soon as the last kernel that reads it is queued, long
// before that kernel has run; devrt keeps the memory from other streams until the stream has
// passed it. On the host, `create` returns the activation handles at once and `submit` runs the
// layers on the device strand. Every request's output is checked against the expected result,
// computed independently. At the end the server prints throughput,
// latency percentiles, memory efficiency and the usage report.
//
// Requests are drawn from a seeded distribution of batch sizes and sequence lengths, or replayed
// from an allocation trace (each request replays a chunk of the trace's events, writing a pattern
// into every allocation and checking it before the allocation is dropped).
//
// On `sim-gpu`, a simulated H200 with streams, every worker has a stream of its own as on CUDA:
// activations are reserved for it, each layer is an event recorded on it (the simulated kernel,
// done 10 µs after its launch), and the request waits for its stream at its end; no bytes are
// computed or checked.
//
//   devrt_inference_server [--threads N] [--requests N] [--seed N] [--device auto|host|cuda|sim|sim-gpu]
//                          [--layers N] [--hidden N] [--layout LAYOUT] [--trace PATH [--events N]]
//                          [--progress | --no-progress]
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "devrt/devices/sim_storage.hpp"
#include "devrt/runtime/runtime.hpp"
#include "inference_kernels.hpp"

#ifdef DEVRT_EXAMPLE_CUDA
#include "devrt/devices/cuda_storage.hpp"
#endif
#ifdef DEVRT_EXAMPLE_TRACES
#include "replay/trace.hpp"
#endif

using namespace devrt;
using namespace devrt::runtime;
using memory::memory_binding;
using memory::memory_handle;

namespace {

constexpr const char* program = "devrt_inference_server";

constexpr const char* usage_text =
    "usage: devrt_inference_server [options]\n"
    "  --threads N          worker threads (default 8)\n"
    "  --requests N         requests to serve (default 2000; with --trace: every chunk of the trace once)\n"
    "  --seed N             seed of the request distribution (default 1)\n"
    "  --device D           auto (the first CUDA GPU if there is one, else host), host, cuda, sim (a\n"
    "                       simulated H200), or sim-gpu (the same with a stream per worker, as on cuda)\n"
    "  --layers N           layers of the model (default 4)\n"
    "  --hidden N           hidden size of the model, in 32-bit words (default 256)\n"
    "  --layout LAYOUT      pool layout: auto (default: an arena where the device maps memory), arena,\n"
    "                       sub-slices, exclusive-pages, or a pool list\n"
    "  --trace PATH         replay an allocation trace (a <id> <bytes> / f <id>, plain or gzip'd)\n"
    "  --events N           trace events per request (default 1000)\n"
    "  --progress, --no-progress\n"
    "                       progress line on stderr (default: on when stderr is a terminal)\n";

/// Bad command-line input: reported with the usage, exit code 2.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// sim-gpu: how long after its launch a simulated kernel is done. A layer of this model at the
/// default sizes (up to 4 MiB of activations) takes a few microseconds on an H200, launch
/// included. The simulated GPU keeps time by itself rather than on a host thread: such a thread
/// gets the CPU rarely on a machine with fewer cores than workers, and memory freed on a stream
/// would wait milliseconds for its fence where an H200 takes microseconds.
constexpr std::chrono::microseconds sim_kernel_time{10};

enum class device_choice { automatic, host, cuda, sim, sim_gpu };
/// How a device's memory is computed on: by the host on the strand, by CUDA kernels on the
/// device's stream, or not at all (the simulated device has no memory behind its allocations;
/// sim_streams: simulated kernels, events on each worker's stream of the simulated GPU).
enum class compute_kind { host, cuda, none, sim_streams };

struct settings {
  int threads = 8;
  std::uint64_t requests = 2000;
  bool requests_given = false;
  std::uint64_t seed = 1;
  device_choice device = device_choice::automatic;
  std::uint32_t layers = 4;
  std::uint64_t hidden = 256;
  std::string layout_text = "auto";
  memory::memory_layout layout = memory::preset::automatic;
  std::optional<std::string> trace_path;
  std::uint64_t events_per_request = 1000;
  std::optional<bool> progress;
};

std::uint64_t parse_number(std::string_view option, std::string_view text, std::uint64_t lo, std::uint64_t hi) {
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi) {
    throw usage_error(std::string(option) + " expects a whole number from " + std::to_string(lo) + " to " +
                      std::to_string(hi) + ", not '" + std::string(text) + "'");
  }
  return v;
}

/// Parses the command line; nullopt after --help.
std::optional<settings> parse_args(int argc, char** argv) {
  settings s;
  bool events_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") return std::nullopt;
    if (arg == "--progress" || arg == "--no-progress") {
      s.progress = arg == "--progress";
      continue;
    }
    if (arg != "--threads" && arg != "--requests" && arg != "--seed" && arg != "--device" && arg != "--layers" &&
        arg != "--hidden" && arg != "--layout" && arg != "--trace" && arg != "--events") {
      throw usage_error("unknown argument '" + std::string(arg) + "'");
    }
    if (i + 1 >= argc) throw usage_error(std::string(arg) + " needs a value");
    const std::string_view value = argv[++i];
    if (arg == "--threads") {
      s.threads = static_cast<int>(parse_number(arg, value, 1, 1024));
    } else if (arg == "--requests") {
      s.requests = parse_number(arg, value, 1, std::uint64_t{1} << 40);
      s.requests_given = true;
    } else if (arg == "--seed") {
      s.seed = parse_number(arg, value, 0, UINT64_MAX);
    } else if (arg == "--layers") {
      s.layers = static_cast<std::uint32_t>(parse_number(arg, value, 1, example::max_layers));
    } else if (arg == "--hidden") {
      s.hidden = parse_number(arg, value, 1, 16384);
    } else if (arg == "--events") {
      s.events_per_request = parse_number(arg, value, 1, std::uint64_t{1} << 32);
      events_given = true;
    } else if (arg == "--trace") {
      if (value.empty()) throw usage_error("--trace needs a file name");
      s.trace_path = std::string(value);
    } else if (arg == "--layout") {
      auto l = memory::parse_layout(value);
      if (!l) throw usage_error("--layout: " + l.err().message());
      s.layout = *l;
      s.layout_text = std::string(value);
    } else if (value == "auto") {
      s.device = device_choice::automatic;
    } else if (value == "host") {
      s.device = device_choice::host;
    } else if (value == "cuda") {
      s.device = device_choice::cuda;
    } else if (value == "sim") {
      s.device = device_choice::sim;
    } else if (value == "sim-gpu") {
      s.device = device_choice::sim_gpu;
    } else {
      throw usage_error("--device expects auto, host, cuda, sim or sim-gpu, not '" + std::string(value) + "'");
    }
  }
  if (events_given && !s.trace_path) throw usage_error("--events applies to --trace only");
  return s;
}

// ---- Traces ----

struct trace_op {
  std::uint64_t size = 0;  ///< bytes (allocations)
  std::uint32_t id = 0;    ///< dense allocation id
  bool alloc = true;
};

#ifdef DEVRT_EXAMPLE_TRACES
std::vector<trace_op> load_trace(const std::string& path) {
  auto t = replay::read_trace(path);
  if (!t) throw usage_error("--trace: " + replay::trace_error_text(t.err()));
  std::vector<trace_op> ops;
  ops.reserve(t->events.size());
  for (const auto& e : t->events) ops.push_back({e.size, e.id, e.kind == replay::event_kind::alloc});
  return ops;
}
#else
// Without the trace library: plain-text traces only.
std::vector<trace_op> load_trace(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw usage_error("--trace: cannot open '" + path + "'");
  if (in.peek() == 0x1f) {
    throw usage_error("--trace: '" + path + "' is gzip'd; this build reads plain text (gunzip it)");
  }
  std::vector<trace_op> ops;
  std::unordered_map<std::uint64_t, std::uint32_t> ids;
  std::string line;
  for (std::uint64_t number = 1; std::getline(in, line); ++number) {
    if (line.empty() || line[0] == '#') continue;
    char kind = 0;
    unsigned long long id = 0;
    unsigned long long size = 0;
    const auto where = path + ":" + std::to_string(number) + ": ";
    if (std::sscanf(line.c_str(), "a %llu %llu", &id, &size) == 2) {
      if (!ids.emplace(id, static_cast<std::uint32_t>(ids.size())).second) {
        throw usage_error("--trace: " + where + "allocation " + std::to_string(id) + " is allocated twice");
      }
      ops.push_back({size, ids[id], true});
    } else if (std::sscanf(line.c_str(), "f %llu %c", &id, &kind) == 1) {
      const auto it = ids.find(id);
      if (it == ids.end()) throw usage_error("--trace: " + where + "free of unknown allocation " + std::to_string(id));
      ops.push_back({0, it->second, false});
    } else {
      throw usage_error("--trace: " + where + "expected 'a <id> <bytes>' or 'f <id>', got '" + line + "'");
    }
  }
  return ops;
}
#endif

// ---- Serving ----

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// The batch size and sequence length of a synthetic request: batch 1-8, sequence 8-512 tokens
/// (log-uniform), both drawn from the request's own generator so that the workload does not
/// depend on the number of threads.
struct request_shape {
  std::uint64_t batch = 1;
  std::uint64_t sequence = 1;
};
request_shape shape_of(std::uint64_t seed, std::uint64_t index) {
  std::mt19937_64 rng(splitmix64(seed ^ splitmix64(index)));
  std::uniform_int_distribution<std::uint64_t> batch(1, 8);
  std::uniform_real_distribution<double> log_sequence(3.0, 9.0);
  return {batch(rng), static_cast<std::uint64_t>(std::llround(std::exp2(log_sequence(rng))))};
}

struct model {
  std::uint32_t id = 1;  ///< selects the weight values
  std::uint32_t layers = 0;
  std::uint64_t hidden = 0;
  std::uint64_t weight_words = 0;  ///< per layer
  std::vector<memory_handle> weights;
};

/// Errors of posted steps, reported by their completions on the runtime's completion threads.
struct error_log {
  std::atomic<std::uint64_t> count{0};
  std::atomic<std::uint64_t> outstanding{0};  ///< steps posted whose completion has not run yet
  std::mutex m;
  std::string first;

  void note(const std::string& what) {
    std::lock_guard lock(m);
    if (count.fetch_add(1, std::memory_order_relaxed) == 0) first = what;
  }
  void wait_idle() const {
    while (outstanding.load(std::memory_order_acquire) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
};

/// A request's progress as seen on the strand. Touched by the request's steps only, which run on
/// the strand in the order posted, so it needs no lock.
struct request_state {
  std::uint64_t steps = 0;       ///< steps that ran
  std::uint64_t mismatches = 0;  ///< words found wrong by host checks
};

struct request_outcome {
  bool complete = false;  ///< every step ran
  std::uint64_t mismatches = 0;
};

struct request_result {
  bool ok = false;
  std::uint64_t mismatches = 0;  ///< host devices; CUDA devices count in device memory
  std::uint64_t pairs = 0;       ///< allocations made (and dropped) by the request
};

std::uint32_t* words(const memory::resource& r) { return static_cast<std::uint32_t*>(r.ptr); }
unsigned long long* counter_of(const memory::resource& r) { return static_cast<unsigned long long*>(r.ptr); }

void check_launch(const char* cuda_error) {
  if (cuda_error != nullptr) throw std::runtime_error(std::string("kernel launch failed: ") + cuda_error);
}

void set_promise(void* p) { static_cast<std::promise<void>*>(p)->set_value(); }

class server {
 public:
  server(compute_client client, compute_kind kind, const model& m, memory_handle counter)
      : client_(std::move(client)), kind_(kind), model_(m), counter_(std::move(counter)) {}

  [[nodiscard]] const std::shared_ptr<error_log>& errors() const noexcept { return errors_; }

  /// A synthetic request: input, the layers (each with a scratch buffer and a new activation,
  /// the previous one dropped), a check of the output.
  request_result serve(std::uint32_t seed, const request_shape& shape, void* stream) {
    if (kind_ == compute_kind::cuda) return serve_on_stream(seed, shape, stream);
    if (kind_ == compute_kind::sim_streams) return serve_on_sim_stream(shape, stream);
    const std::uint64_t n = shape.batch * shape.sequence * model_.hidden;
    const std::uint64_t wn = model_.weight_words;
    const compute_kind kind = kind_;
    auto st = std::make_shared<request_state>();
    request_result out;

    memory_handle x = client_.create(n * 4);
    ++out.pairs;
    step({x.binding()}, st, [kind, n, seed](submit_context& c, request_state&) {
      if (kind == compute_kind::host) example::host_input(words(c.resources[0]), n, seed);
      if (kind == compute_kind::cuda) check_launch(example::cuda_input(words(c.resources[0]), n, seed, c.stream));
    });
    for (std::uint32_t l = 0; l < model_.layers; ++l) {
      memory_handle h = client_.create(2 * n * 4);
      memory_handle y = client_.create(n * 4);
      out.pairs += 2;
      step({x.binding(), model_.weights[l].binding(), h.binding(), y.binding()}, st,
           [kind, n, wn](submit_context& c, request_state&) {
             const auto& r = c.resources;
             if (kind == compute_kind::host) {
               example::host_layer(words(r[0]), words(r[1]), wn, words(r[2]), words(r[3]), n);
             }
             if (kind == compute_kind::cuda) {
               check_launch(example::cuda_layer(words(r[0]), words(r[1]), wn, words(r[2]), words(r[3]), n, c.stream));
             }
           });
      x = std::move(y);  // the previous activation and the scratch buffer are dropped here
    }
    step({x.binding(), counter_.binding()}, st,
         [kind, n, wn, seed, m = model_.id, layers = model_.layers](submit_context& c, request_state& s) {
           const auto& r = c.resources;
           if (kind == compute_kind::host) s.mismatches += example::host_verify(words(r[0]), n, seed, m, layers, wn);
           if (kind == compute_kind::cuda) {
             check_launch(example::cuda_verify(words(r[0]), n, seed, m, layers, wn, counter_of(r[1]), c.stream));
           }
         });
    x.reset();
    return finish(st, model_.layers + 2, out);
  }

  /// The same request on a CUDA device, from the worker's thread on the worker's stream: every
  /// activation is reserved for the stream, the kernels are launched there, and each handle is
  /// dropped right after the last launch that uses it (the kernels are still queued).
  request_result serve_on_stream(std::uint32_t seed, const request_shape& shape, void* native) {
    const std::uint64_t n = shape.batch * shape.sequence * model_.hidden;
    const std::uint64_t wn = model_.weight_words;
    const memory::stream s = memory::stream::native(native);
    request_result out;
    try {
      memory_handle x = client_.reserve(n * 4, s).get();
      ++out.pairs;
      check_launch(example::cuda_input(words_of(x), n, seed, native));
      for (std::uint32_t l = 0; l < model_.layers; ++l) {
        memory_handle h = client_.reserve(2 * n * 4, s).get();
        memory_handle y = client_.reserve(n * 4, s).get();
        out.pairs += 2;
        check_launch(
            example::cuda_layer(words_of(x), words_of(model_.weights[l]), wn, words_of(h), words_of(y), n, native));
        x = std::move(y);  // the previous activation and the scratch buffer are dropped while queued
      }
      check_launch(example::cuda_verify(words_of(x), n, seed, model_.id, model_.layers, wn,
                                        static_cast<unsigned long long*>(counter_.ptr()), native));
      x.reset();
      wait_for_stream(native);
      out.ok = true;
    } catch (const std::exception& e) {
      errors_->note(e.what());
    }
    return out;
  }

  /// The same request on the simulated GPU's stream of this worker: reserves for the stream, a
  /// simulated kernel (an event on the stream) per layer, each handle dropped while its kernel is
  /// still queued, and the worker waits until the stream has run the request's work.
  request_result serve_on_sim_stream(const request_shape& shape, void* native) {
    const std::uint64_t n = shape.batch * shape.sequence * model_.hidden;
    const memory::stream s = memory::stream::native(native);
    const auto id = static_cast<memory::stream_id>(reinterpret_cast<std::uintptr_t>(native));
    request_result out;
    try {
      memory_handle x = client_.reserve(n * 4, s).get();
      ++out.pairs;
      (void)sim_->record_event(id);
      for (std::uint32_t l = 0; l < model_.layers; ++l) {
        memory_handle h = client_.reserve(2 * n * 4, s).get();
        memory_handle y = client_.reserve(n * 4, s).get();
        out.pairs += 2;
        (void)sim_->record_event(id);  // the layer's kernel reads x and writes h and y
        x = std::move(y);
      }
      (void)sim_->record_event(id);
      x.reset();
      // The worker waits until its stream has run the request, as a CUDA worker does.
      if (auto r = sim_->synchronize_stream(id); !r) throw devrt::exception(r.err());
      out.ok = true;
    } catch (const std::exception& e) {
      errors_->note(e.what());
    }
    return out;
  }
  void set_sim(devices::sim_storage* sim) noexcept { sim_ = sim; }

  /// A request replayed from a trace: every allocation gets a pattern when it is made and is
  /// checked when the trace frees it (or at the end of the request) before it is dropped.
  /// Allocations freed by a later request's events are released at the end of this one.
  request_result replay(std::uint32_t seed, std::span<const trace_op> ops, void* stream) {
    if (kind_ == compute_kind::cuda) return replay_on_stream(seed, ops, stream);
    const compute_kind kind = kind_;
    auto st = std::make_shared<request_state>();
    request_result out;
    std::uint64_t steps = 0;
    struct allocation {
      memory_handle handle;
      std::uint64_t size = 0;
      std::uint32_t seed = 0;
    };
    std::unordered_map<std::uint32_t, allocation> live;
    auto check = [&](const allocation& a) {
      step({a.handle.binding(), counter_.binding()}, st,
           [kind, size = a.size, s = a.seed](submit_context& c, request_state& rs) {
             const auto& r = c.resources;
             if (kind == compute_kind::host) rs.mismatches += example::host_probe_check(words(r[0]), size / 4, s);
             if (kind == compute_kind::cuda) {
               check_launch(example::cuda_probe_check(words(r[0]), size / 4, s, counter_of(r[1]), c.stream));
             }
           });
      ++steps;
    };
    for (const trace_op& op : ops) {
      if (op.alloc) {
        allocation a{client_.create(op.size), op.size, example::mix32(seed ^ example::index_hash(op.id))};
        ++out.pairs;
        step({a.handle.binding()}, st, [kind, size = a.size, s = a.seed](submit_context& c, request_state&) {
          if (kind == compute_kind::host) example::host_probe_fill(words(c.resources[0]), size / 4, s);
          if (kind == compute_kind::cuda) {
            check_launch(example::cuda_probe_fill(words(c.resources[0]), size / 4, s, c.stream));
          }
        });
        ++steps;
        live[op.id] = std::move(a);
      } else if (auto it = live.find(op.id); it != live.end()) {
        check(it->second);
        live.erase(it);  // dropped here; the check posted before holds a binding
      }
    }
    for (auto& [id, a] : live) check(a);
    live.clear();
    return finish(st, steps, out);
  }

 private:
  static std::uint32_t* words_of(const memory_handle& h) { return static_cast<std::uint32_t*>(h.ptr()); }

  /// Waits (on this worker's thread, never the device's) until the stream has run this request.
  static void wait_for_stream(void* native) {
    std::promise<void> done;
    std::future<void> f = done.get_future();
    check_launch(example::cuda_when_done(native, &set_promise, &done));
    f.wait();
  }

  /// A trace chunk on a CUDA device, on the worker's stream (see replay).
  request_result replay_on_stream(std::uint32_t seed, std::span<const trace_op> ops, void* native) {
    const memory::stream s = memory::stream::native(native);
    auto* counter = static_cast<unsigned long long*>(counter_.ptr());
    request_result out;
    struct allocation {
      memory_handle handle;
      std::uint64_t size = 0;
      std::uint32_t seed = 0;
    };
    std::unordered_map<std::uint32_t, allocation> live;
    try {
      for (const trace_op& op : ops) {
        if (op.alloc) {
          allocation a{client_.reserve(op.size, s).get(), op.size, example::mix32(seed ^ example::index_hash(op.id))};
          ++out.pairs;
          check_launch(example::cuda_probe_fill(words_of(a.handle), a.size / 4, a.seed, native));
          live[op.id] = std::move(a);
        } else if (auto it = live.find(op.id); it != live.end()) {
          const allocation& a = it->second;
          check_launch(example::cuda_probe_check(words_of(a.handle), a.size / 4, a.seed, counter, native));
          live.erase(it);  // dropped while the check is queued
        }
      }
      for (auto& [id, a] : live)
        check_launch(example::cuda_probe_check(words_of(a.handle), a.size / 4, a.seed, counter, native));
      live.clear();
      wait_for_stream(native);
      out.ok = true;
    } catch (const std::exception& e) {
      errors_->note(e.what());
    }
    return out;
  }

  /// Posts one step of a request: `fn(context, state)` on the strand, counted in the state when
  /// it ran. A step whose bindings do not resolve (a failed create) does not run; its error is
  /// logged by its completion and the request's final step sees the gap.
  template <class F>
  void step(std::vector<memory_binding> bindings, const std::shared_ptr<request_state>& st, F fn) {
    errors_->outstanding.fetch_add(1, std::memory_order_relaxed);
    client_.submit(
        std::move(bindings),
        [st, fn = std::move(fn)](submit_context& c) mutable {
          fn(c, *st);
          ++st->steps;
        },
        [log = errors_](error_code ec) {
          if (ec) log->note(ec.message());
          log->outstanding.fetch_sub(1, std::memory_order_release);
        });
  }

  /// Closes a request: waits until its steps ran on the strand and, on CUDA devices, until the
  /// device has finished its kernels.
  request_result finish(const std::shared_ptr<request_state>& st, std::uint64_t expected_steps, request_result out) {
    std::promise<void> done;
    std::future<void> device_done = done.get_future();
    const compute_kind kind = kind_;
    auto closing = client_.submit({}, [st, expected_steps, kind, &done](submit_context& c) {
      const request_outcome o{st->steps == expected_steps, st->mismatches};
      if (o.complete && kind == compute_kind::cuda) {
        check_launch(example::cuda_when_done(c.stream, &set_promise, &done));
      }
      return o;
    });
    request_outcome o;
    try {
      o = closing.get();
    } catch (const boost::system::system_error& e) {
      errors_->note(std::string(e.what()));
      return out;
    }
    if (o.complete && kind == compute_kind::cuda) device_done.wait();
    out.ok = o.complete;
    out.mismatches = o.mismatches;
    return out;
  }

  compute_client client_;
  compute_kind kind_;
  devices::sim_storage* sim_ = nullptr;  // sim_streams: the simulated GPU, whose streams the workers use
  const model& model_;
  memory_handle counter_;
  std::shared_ptr<error_log> errors_ = std::make_shared<error_log>();
};

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const auto rank = static_cast<std::size_t>(std::ceil(p * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

struct worker_totals {
  std::vector<double> latency_ms;
  std::uint64_t served = 0;
  std::uint64_t failed = 0;
  std::uint64_t mismatches = 0;
  std::uint64_t pairs = 0;
};

/// The progress line on stderr, redrawn in place until the run ends.
class progress_line {
 public:
  progress_line(const compute_client& client, const std::atomic<std::uint64_t>& done, std::uint64_t total)
      : client_(client), done_(done), total_(total), start_(std::chrono::steady_clock::now()) {
    thread_ = std::thread([this] { run(); });
  }
  progress_line(const progress_line&) = delete;
  progress_line& operator=(const progress_line&) = delete;
  ~progress_line() { stop(); }

  void stop() {
    {
      std::lock_guard lock(m_);
      if (stopped_) return;
      stopped_ = true;
    }
    cv_.notify_all();
    thread_.join();
    draw();
    std::fputc('\n', stderr);
  }

 private:
  void run() {
    std::unique_lock lock(m_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stopped_; })) {
      lock.unlock();
      draw();
      lock.lock();
    }
  }
  void draw() {
    const std::uint64_t done = done_.load(std::memory_order_relaxed);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const auto reserved = client_.memory_usage().get().bytes_reserved;
    std::fprintf(stderr, "\r%s: %llu/%llu requests (%3.0f%%), %.0f requests/s, %s reserved   ", program,
                 static_cast<unsigned long long>(done), static_cast<unsigned long long>(total_),
                 100.0 * static_cast<double>(done) / static_cast<double>(total_),
                 secs > 0 ? static_cast<double>(done) / secs : 0.0, memory::format_bytes(reserved).c_str());
    std::fflush(stderr);
  }

  const compute_client& client_;
  const std::atomic<std::uint64_t>& done_;
  std::uint64_t total_;
  std::chrono::steady_clock::time_point start_;
  std::mutex m_;
  std::condition_variable cv_;
  bool stopped_ = false;
  std::thread thread_;
};

int run(const settings& s) {
  // The trace first: a bad file is reported before anything starts.
  std::vector<trace_op> ops;
  std::uint64_t chunks = 0;
  if (s.trace_path) {
    ops = load_trace(*s.trace_path);
    if (ops.empty()) throw usage_error("--trace: '" + *s.trace_path + "' has no events");
    chunks = (ops.size() + s.events_per_request - 1) / s.events_per_request;
  }
  const std::uint64_t requests = s.trace_path && !s.requests_given ? chunks : s.requests;

#ifndef DEVRT_EXAMPLE_CUDA
  if (s.device == device_choice::cuda) {
    throw usage_error(
        "--device cuda: this build has no CUDA support (no CUDA toolkit when it was configured); run with --device "
        "host (host memory) or --device sim (a simulated device)");
  }
#endif

  runtime_options opts;
  opts.host.alignment = 256;
  opts.host_layout = s.layout;
  opts.cuda_layout = s.layout;
  opts.use_cuda = s.device == device_choice::automatic || s.device == device_choice::cuda;
  if (s.device == device_choice::sim) {
    // A simulated H200 (its properties, memory mapped in 2 MiB granules), without streams.
    opts.sim = devices::sim_options::h200();
    opts.sim_layout = s.layout;
  }
  if (s.device == device_choice::sim_gpu) {
    // An H200's properties, streams whose work runs by itself (each simulated kernel done
    // sim_kernel_time after its launch, as an H200 runs this model's kernels), unmaps behind it.
    opts.sim = devices::sim_options::h200();
    opts.sim->name = "sim-gpu";
    opts.sim->streams = true;
    opts.sim->deferred_unmaps = true;
    opts.sim->runs_after = sim_kernel_time;
    opts.sim_layout = s.layout;
  }
  auto rt = devrt::runtime::runtime::create(opts);
  if (!rt) {
    const error& e = rt.err();
    if (is_config_error(e.code) && e.code != errc::malformed_config) throw usage_error("--layout: " + e.message());
    std::fprintf(stderr, "%s: cannot start the runtime: %s\n", program, e.message().c_str());
    return 1;
  }
  devrt::runtime::runtime& runtime = **rt;

  compute_client client;
  compute_kind kind = compute_kind::host;
  switch (s.device) {
    case device_choice::host: client = runtime.host(); break;
    case device_choice::sim:
      client = runtime.sim();
      kind = compute_kind::none;
      break;
    case device_choice::sim_gpu:
      client = runtime.sim();
      kind = compute_kind::sim_streams;
      break;
    case device_choice::automatic:
    case device_choice::cuda:
      if (runtime.count(device_kind::cuda) > 0) {
        client = runtime.cuda(0);
        kind = compute_kind::cuda;
      } else if (s.device == device_choice::automatic) {
        client = runtime.host();
      } else {
        // Said plainly: on a machine without a driver the CUDA runtime speaks of an insufficient one.
#ifdef DEVRT_EXAMPLE_CUDA
        const std::string reason = devices::cuda_unavailable_reason();
        const std::string what =
            reason.find("cudaErrorInsufficientDriver") != std::string::npos
                ? "no CUDA GPU or driver was found (the NVIDIA driver is missing, or older than the CUDA runtime this "
                  "program was built with: cudaErrorInsufficientDriver)"
            : reason.empty() ? "the CUDA GPUs were left out (DEVRT_CUDA_DEVICES)"
                             : "no CUDA GPU was found (" + reason + ")";
#else
        const std::string what = "this build has no CUDA support";  // refused above already
#endif
        std::fprintf(stderr,
                     "%s: --device cuda: %s; run with --device host (host memory) or --device sim (a simulated "
                     "device), or without --device to use a GPU when there is one\n",
                     program, what.c_str());
        return 1;
      }
      break;
  }

  // A simulated device is named by its storage (sim-h200, sim-gpu), not the runtime's "sim".
  const std::string device_name = opts.sim ? opts.sim->name : client.device().name;
  std::printf("%s: %d threads serving %llu requests on the %s device (layout %s)\n", program, s.threads,
              static_cast<unsigned long long>(requests), device_name.c_str(), s.layout_text.c_str());
  if (s.trace_path) {
    std::printf("requests: chunks of %llu events of %s (%llu events, %llu chunks)\n",
                static_cast<unsigned long long>(s.events_per_request), s.trace_path->c_str(),
                static_cast<unsigned long long>(ops.size()), static_cast<unsigned long long>(chunks));
  } else {
    std::printf("requests: batch 1-8, sequence 8-512 tokens (log-uniform), seed %llu\n",
                static_cast<unsigned long long>(s.seed));
  }

  // The weights, and on CUDA devices the device word the checks count mismatches in: persistent
  // memory, kept across any reconfiguration of the dynamic pools.
  model m;
  m.layers = s.layers;
  m.hidden = s.hidden;
  m.weight_words = s.hidden * s.hidden;
  // The simulated GPU runs what is queued on its streams (the device's own included) by itself,
  // as a GPU runs kernels beside the host (sim_options::runs_after); a worker waits until its stream
  // has run each request (sim_storage::synchronize_stream), as a CUDA worker waits for its stream.
  devices::sim_storage* sim = nullptr;
  if (kind == compute_kind::sim_streams) {
    sim = client
              .async_run<devices::sim_storage*>(
                  [](devrt::runtime::actor_core& c) {
                    return result<devices::sim_storage*>(c.manager().backing_storage().backend<devices::sim_storage>());
                  },
                  devrt::runtime::use_future_t{})
              .get();
  }
  memory_handle counter;
  const auto load_start = std::chrono::steady_clock::now();
  {
    auto scope = client.persistent();
    for (std::uint32_t l = 0; l < m.layers; ++l) m.weights.push_back(client.create(m.weight_words * 4));
    counter = client.create(sizeof(unsigned long long));
  }
  std::vector<std::future<void>> loads;
  for (std::uint32_t l = 0; l < m.layers; ++l) {
    loads.push_back(client.submit({m.weights[l].binding()}, [kind, l, &m](submit_context& c) {
      auto* w = words(c.resources[0]);
      if (kind == compute_kind::host) example::host_fill_weights(w, m.weight_words, m.id, l);
      if (kind == compute_kind::cuda) check_launch(example::cuda_fill_weights(w, m.weight_words, m.id, l, c.stream));
    }));
  }
  if (kind == compute_kind::cuda) loads.push_back(client.write(counter.binding(), std::vector<std::byte>(8)));
  try {
    for (auto& f : loads) f.get();
    client.synchronize().get();
  } catch (const boost::system::system_error& e) {
    std::fprintf(stderr, "%s: loading the model failed: %s\n", program, e.what());
    return 1;
  }
  std::printf("model: %u layers, hidden %llu, %s of weights in persistent memory (loaded in %.1f ms)\n", m.layers,
              static_cast<unsigned long long>(m.hidden), memory::format_bytes(m.layers * m.weight_words * 4).c_str(),
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - load_start).count());

  server srv(client, kind, m, counter);
  if (sim != nullptr) srv.set_sim(sim);
  std::atomic<std::uint64_t> next{0};
  std::atomic<std::uint64_t> done{0};
  std::vector<worker_totals> totals(static_cast<std::size_t>(s.threads));
  const bool show_progress = s.progress.value_or(::isatty(STDERR_FILENO) != 0);
  double secs = 0;
  {
    std::optional<progress_line> progress;
    if (show_progress) progress.emplace(client, done, requests);
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> workers;
    workers.reserve(static_cast<std::size_t>(s.threads));
    for (int t = 0; t < s.threads; ++t) {
      workers.emplace_back([&, t] {
        worker_totals& mine = totals[static_cast<std::size_t>(t)];
        // On a CUDA device, each worker launches on a stream of its own.
        void* stream = nullptr;
        if (kind == compute_kind::sim_streams) {
          stream = reinterpret_cast<void*>(static_cast<std::uintptr_t>(sim->create_stream()));
        }
        if (kind == compute_kind::cuda) {
          if (const char* e = example::cuda_stream_create(&stream); e != nullptr) {
            srv.errors()->note(std::string("cudaStreamCreate failed: ") + e);
            return;
          }
        }
        for (std::uint64_t i = next.fetch_add(1); i < requests; i = next.fetch_add(1)) {
          const auto seed = static_cast<std::uint32_t>(splitmix64(s.seed ^ (i << 1)));
          const auto t0 = std::chrono::steady_clock::now();
          request_result r;
          if (s.trace_path) {
            const std::uint64_t first = (i % chunks) * s.events_per_request;
            const std::uint64_t count = std::min<std::uint64_t>(s.events_per_request, ops.size() - first);
            r = srv.replay(seed, std::span<const trace_op>(ops).subspan(first, count), stream);
          } else {
            r = srv.serve(seed, shape_of(s.seed, i), stream);
          }
          mine.latency_ms.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
          ++(r.ok ? mine.served : mine.failed);
          mine.mismatches += r.mismatches;
          mine.pairs += r.pairs;
          done.fetch_add(1, std::memory_order_relaxed);
        }
        if (stream != nullptr) {
          // Its work has run (each request waited for it) and its handles are gone: devrt is told
          // before the stream is destroyed.
          (void)client.retire_stream(memory::stream::native(stream)).get();
          if (kind == compute_kind::cuda) example::cuda_stream_destroy(stream);
          if (kind == compute_kind::sim_streams) {
            sim->destroy_stream(static_cast<memory::stream_id>(reinterpret_cast<std::uintptr_t>(stream)));
          }
        }
      });
    }
    for (auto& w : workers) w.join();
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  srv.errors()->wait_idle();

  worker_totals all;
  for (auto& t : totals) {
    all.latency_ms.insert(all.latency_ms.end(), t.latency_ms.begin(), t.latency_ms.end());
    all.served += t.served;
    all.failed += t.failed;
    all.mismatches += t.mismatches;
    all.pairs += t.pairs;
  }
  std::sort(all.latency_ms.begin(), all.latency_ms.end());

  // CUDA devices counted mismatches in device memory; read (after the stream has drained).
  bool counter_read = true;
  if (kind == compute_kind::cuda) {
    try {
      const auto bytes = client.read(counter.binding()).get();
      unsigned long long device_mismatches = 0;
      std::memcpy(&device_mismatches, bytes.data(), sizeof(device_mismatches));
      all.mismatches += device_mismatches;
    } catch (const boost::system::system_error& e) {
      std::fprintf(stderr, "%s: reading the check counter failed: %s\n", program, e.what());
      counter_read = false;
    }
  }

  const auto stats = client.statistics().get();
  const double total = static_cast<double>(requests);
  std::printf("\nthroughput: %llu requests in %.3f s: %.1f requests/s, %.0f alloc+free pairs/s (%.1f per request)\n",
              static_cast<unsigned long long>(requests), secs, total / secs, static_cast<double>(all.pairs) / secs,
              static_cast<double>(all.pairs) / total);
  std::printf("latency per request: p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.3f ms\n",
              percentile(all.latency_ms, 0.50), percentile(all.latency_ms, 0.90), percentile(all.latency_ms, 0.99),
              all.latency_ms.empty() ? 0.0 : all.latency_ms.back());
  if (kind == compute_kind::none || kind == compute_kind::sim_streams) {
    std::printf("data checks: none (the %s device has no memory behind its allocations)\n",
                client.device().name.c_str());
  } else {
    std::printf("data checks: %llu requests checked, %llu mismatching words, %llu failed requests\n",
                static_cast<unsigned long long>(all.served), static_cast<unsigned long long>(all.mismatches),
                static_cast<unsigned long long>(all.failed));
  }
  if (const auto n = srv.errors()->count.load(); n != 0) {
    std::printf("errors: %llu steps failed; first: %s\n", static_cast<unsigned long long>(n),
                srv.errors()->first.c_str());
  }
  const double efficiency = stats.peak_bytes_reserved == 0 ? 1.0
                                                           : static_cast<double>(stats.peak_bytes_in_use) /
                                                                 static_cast<double>(stats.peak_bytes_reserved);
  std::printf("memory efficiency: peak in use %s / peak reserved %s = %.1f%%\n",
              memory::format_bytes(stats.peak_bytes_in_use).c_str(),
              memory::format_bytes(stats.peak_bytes_reserved).c_str(), 100.0 * efficiency);
  if (stats.peak_bytes_busy > stats.peak_bytes_in_use) {
    // Memory freed on a stream whose queued work may still use it can neither serve another
    // stream nor go back: held beside what is in use, it is a floor under any allocator that waits
    // for the streams to pass.
    std::printf(
        "stream order's floor: peak in use and busy on streams %s, so at most %.1f%% for any allocator that "
        "waits for the streams\n",
        memory::format_bytes(stats.peak_bytes_busy).c_str(),
        100.0 * static_cast<double>(stats.peak_bytes_in_use) / static_cast<double>(stats.peak_bytes_busy));
  }
  std::printf("\n%s", client.report().get().c_str());
  const std::string problem = client.check_invariants().get();
  std::printf("invariants: %s\n", problem.empty() ? "hold" : problem.c_str());

  const bool ok =
      all.failed == 0 && all.mismatches == 0 && srv.errors()->count.load() == 0 && counter_read && problem.empty();
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto s = parse_args(argc, argv);
    if (!s) {
      std::fputs(usage_text, stdout);
      return 0;
    }
    return run(*s);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "%s: %s\n%s", program, e.what(), usage_text);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}
