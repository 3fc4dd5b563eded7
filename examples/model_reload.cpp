// Model reload: a service swaps models and reconfigures its memory between them.
//
//   1. load model A: its weights go to persistent memory;
//   2. serve a few requests; each leaves a session cache behind (live dynamic memory);
//   3. unload A: drop the weights and return their pages;
//   4. configure the pool layout for model B while A's session caches are still live: the reply
//      says the layout was kept, not applied, and how much memory is still live;
//   5. close the sessions (their caches are checked and dropped) and configure again: applied;
//   6. load model B and serve requests with the new layout.
// The usage report is printed after every step. Every request's output and every session cache
// is checked; the exit code is non-zero if a check fails.
//
//   devrt_model_reload [--device host|cuda|sim|auto] [--requests N] [--seed N] [--layout-b LAYOUT]
#include <charconv>
#include <cstdio>
#include <cstring>
#include <future>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "devrt/runtime/runtime.hpp"
#include "inference_kernels.hpp"

#ifdef DEVRT_EXAMPLE_CUDA
#include "devrt/devices/cuda_storage.hpp"
#endif

using namespace devrt;
using namespace devrt::runtime;
using memory::memory_handle;

namespace {

constexpr const char* program = "devrt_model_reload";
constexpr const char* default_layout_b = "sliced:page=4MiB,slice=1MiB;sliced:page=64MiB,slice=32MiB;exclusive:max=1GiB";

constexpr const char* usage_text =
    "usage: devrt_model_reload [options]\n"
    "  --device D         host (default), cuda, sim, or auto (the first CUDA GPU if there is one, else host)\n"
    "  --requests N       requests served by each model (default 8)\n"
    "  --seed N           seed of the requests' sizes (default 1)\n"
    "  --layout-b LAYOUT  the pool layout configured for model B (default\n"
    "                     sliced:page=4MiB,slice=1MiB;sliced:page=64MiB,slice=32MiB;exclusive:max=1GiB)\n";

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class compute_kind { host, cuda, none };

struct settings {
  std::string device = "host";
  std::uint64_t requests = 8;
  std::uint64_t seed = 1;
  std::string layout_b_text = default_layout_b;
  memory::memory_layout layout_b;
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

std::optional<settings> parse_args(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") return std::nullopt;
    if (arg != "--device" && arg != "--requests" && arg != "--seed" && arg != "--layout-b") {
      throw usage_error("unknown argument '" + std::string(arg) + "'");
    }
    if (i + 1 >= argc) throw usage_error(std::string(arg) + " needs a value");
    const std::string_view value = argv[++i];
    if (arg == "--device") {
      if (value != "host" && value != "cuda" && value != "sim" && value != "auto") {
        throw usage_error("--device expects host, cuda, sim or auto, not '" + std::string(value) + "'");
      }
      s.device = std::string(value);
    } else if (arg == "--requests") {
      s.requests = parse_number(arg, value, 1, 100000);
    } else if (arg == "--seed") {
      s.seed = parse_number(arg, value, 0, UINT64_MAX);
    } else {
      s.layout_b_text = std::string(value);
    }
  }
  auto l = memory::parse_layout(s.layout_b_text);
  if (!l) throw usage_error("--layout-b: " + l.err().message());
  s.layout_b = *l;
  return s;
}

std::uint32_t* words(const memory::resource& r) { return static_cast<std::uint32_t*>(r.ptr); }
unsigned long long* counter_of(const memory::resource& r) { return static_cast<unsigned long long*>(r.ptr); }

void check_launch(const char* cuda_error) {
  if (cuda_error != nullptr) throw std::runtime_error(std::string("kernel launch failed: ") + cuda_error);
}

struct model {
  const char* name = "";
  std::uint32_t id = 0;
  std::uint32_t layers = 0;
  std::uint64_t hidden = 0;
  std::uint64_t weight_words = 0;
  std::vector<memory_handle> weights;
};

/// A conversation's state kept between requests: a cache with a pattern in it.
struct session {
  memory_handle cache;
  std::uint64_t bytes = 0;
  std::uint32_t seed = 0;
};

/// The device and what the checks found so far. Every operation waits for its futures: this
/// program is sequential, and the futures carry any error.
class service {
 public:
  service(compute_client client, compute_kind kind) : client_(std::move(client)), kind_(kind) {
    auto scope = client_.persistent();
    counter_ = client_.create(sizeof(unsigned long long));
  }

  [[nodiscard]] const compute_client& client() const noexcept { return client_; }
  [[nodiscard]] std::uint64_t host_mismatches() const noexcept { return host_mismatches_; }
  [[nodiscard]] std::uint64_t failures() const noexcept { return failures_; }

  void start() {
    if (kind_ == compute_kind::cuda) wait(client_.write(counter_.binding(), std::vector<std::byte>(8)));
  }

  void load(model& m) {
    {
      auto scope = client_.persistent();
      for (std::uint32_t l = 0; l < m.layers; ++l) m.weights.push_back(client_.create(m.weight_words * 4));
    }
    for (std::uint32_t l = 0; l < m.layers; ++l) {
      wait(client_.submit({m.weights[l].binding()}, [kind = kind_, l, &m](submit_context& c) {
        auto* w = words(c.resources[0]);
        if (kind == compute_kind::host) example::host_fill_weights(w, m.weight_words, m.id, l);
        if (kind == compute_kind::cuda) check_launch(example::cuda_fill_weights(w, m.weight_words, m.id, l, c.stream));
      }));
    }
  }

  /// Drops the weights and returns the pages they used.
  void unload(model& m) {
    m.weights.clear();
    wait(client_.cleanup());
  }

  /// One request of `tokens` tokens: input, the layers, the check; then a session cache is
  /// opened for the conversation.
  session serve(const model& m, std::uint32_t seed, std::uint64_t tokens) {
    const std::uint64_t n = tokens * m.hidden;
    const std::uint64_t wn = m.weight_words;
    const compute_kind kind = kind_;
    std::vector<std::future<void>> steps;
    memory_handle x = client_.create(n * 4);
    steps.push_back(client_.submit({x.binding()}, [kind, n, seed](submit_context& c) {
      if (kind == compute_kind::host) example::host_input(words(c.resources[0]), n, seed);
      if (kind == compute_kind::cuda) check_launch(example::cuda_input(words(c.resources[0]), n, seed, c.stream));
    }));
    for (std::uint32_t l = 0; l < m.layers; ++l) {
      memory_handle h = client_.create(2 * n * 4);
      memory_handle y = client_.create(n * 4);
      steps.push_back(client_.submit(
          {x.binding(), m.weights[l].binding(), h.binding(), y.binding()}, [kind, n, wn](submit_context& c) {
            const auto& r = c.resources;
            if (kind == compute_kind::host) {
              example::host_layer(words(r[0]), words(r[1]), wn, words(r[2]), words(r[3]), n);
            }
            if (kind == compute_kind::cuda) {
              check_launch(example::cuda_layer(words(r[0]), words(r[1]), wn, words(r[2]), words(r[3]), n, c.stream));
            }
          }));
      x = std::move(y);
    }
    auto verified = client_.submit(
        {x.binding(), counter_.binding()}, [kind, n, wn, seed, id = m.id, layers = m.layers](submit_context& c) {
          const auto& r = c.resources;
          std::uint64_t wrong = 0;
          if (kind == compute_kind::host) {
            wrong = example::host_verify(words(r[0]), n, seed, id, layers, wn);
          }
          if (kind == compute_kind::cuda) {
            check_launch(example::cuda_verify(words(r[0]), n, seed, id, layers, wn, counter_of(r[1]), c.stream));
          }
          return wrong;
        });
    x.reset();
    for (auto& f : steps) wait(std::move(f));
    try {
      host_mismatches_ += verified.get();
    } catch (const boost::system::system_error& e) {
      fail(e);
    }

    session s{client_.create(n * 4), n * 4, example::mix32(seed ^ 0x5e55104eU)};
    wait(client_.submit({s.cache.binding()}, [kind, words_n = n, sd = s.seed](submit_context& c) {
      if (kind == compute_kind::host) example::host_probe_fill(words(c.resources[0]), words_n, sd);
      if (kind == compute_kind::cuda) {
        check_launch(example::cuda_probe_fill(words(c.resources[0]), words_n, sd, c.stream));
      }
    }));
    return s;
  }

  /// Checks the caches and drops them.
  void close(std::vector<session>& sessions) {
    const compute_kind kind = kind_;
    std::vector<std::future<std::uint64_t>> checks;
    checks.reserve(sessions.size());
    for (const session& s : sessions) {
      checks.push_back(client_.submit(
          {s.cache.binding(), counter_.binding()}, [kind, words_n = s.bytes / 4, sd = s.seed](submit_context& c) {
            const auto& r = c.resources;
            std::uint64_t wrong = 0;
            if (kind == compute_kind::host) {
              wrong = example::host_probe_check(words(r[0]), words_n, sd);
            }
            if (kind == compute_kind::cuda) {
              check_launch(example::cuda_probe_check(words(r[0]), words_n, sd, counter_of(r[1]), c.stream));
            }
            return wrong;
          }));
    }
    sessions.clear();
    for (auto& f : checks) {
      try {
        host_mismatches_ += f.get();
      } catch (const boost::system::system_error& e) {
        fail(e);
      }
    }
  }

  /// Mismatches counted in device memory (CUDA devices; 0 elsewhere).
  std::uint64_t device_mismatches() {
    if (kind_ != compute_kind::cuda) return 0;
    try {
      const auto bytes = client_.read(counter_.binding()).get();
      unsigned long long v = 0;
      std::memcpy(&v, bytes.data(), sizeof(v));
      return v;
    } catch (const boost::system::system_error& e) {
      fail(e);
      return 0;
    }
  }

 private:
  template <class Future>
  void wait(Future&& f) {
    try {
      f.get();
    } catch (const boost::system::system_error& e) {
      fail(e);
    }
  }
  void fail(const boost::system::system_error& e) {
    ++failures_;
    std::printf("error: %s\n", e.what());
  }

  compute_client client_;
  compute_kind kind_;
  memory_handle counter_;
  std::uint64_t host_mismatches_ = 0;
  std::uint64_t failures_ = 0;
};

void report(const service& svc, const std::string& title) {
  std::printf("\n== %s ==\n%s", title.c_str(), svc.client().report().get().c_str());
}

std::uint64_t tokens_of(std::mt19937_64& rng) {
  std::uniform_int_distribution<std::uint64_t> batch(1, 8);
  std::uniform_int_distribution<std::uint64_t> sequence(16, 512);
  return batch(rng) * sequence(rng);
}

void serve_requests(service& svc, const model& m, std::uint64_t requests, std::mt19937_64& rng,
                    std::vector<session>& sessions) {
  std::uint64_t tokens = 0;
  for (std::uint64_t i = 0; i < requests; ++i) {
    const std::uint64_t t = tokens_of(rng);
    tokens += t;
    sessions.push_back(svc.serve(m, static_cast<std::uint32_t>(rng()), t));
  }
  std::printf("served %llu requests with model %s (%llu tokens); %zu session caches open\n",
              static_cast<unsigned long long>(requests), m.name, static_cast<unsigned long long>(tokens),
              sessions.size());
}

int run(const settings& s) {
#ifndef DEVRT_EXAMPLE_CUDA
  if (s.device == "cuda") throw usage_error("--device cuda: this build has no CUDA support");
#endif
  runtime_options opts;
  opts.host.alignment = 256;
  opts.use_cuda = s.device == "cuda" || s.device == "auto";
  if (s.device == "sim") opts.sim = devices::sim_options{};
  auto rt = devrt::runtime::runtime::create(opts);
  if (!rt) {
    std::fprintf(stderr, "%s: cannot start the runtime: %s\n", program, rt.err().message().c_str());
    return 1;
  }
  devrt::runtime::runtime& runtime = **rt;
  compute_client client = runtime.host();
  compute_kind kind = compute_kind::host;
  if (s.device == "sim") {
    client = runtime.sim();
    kind = compute_kind::none;
  } else if (s.device != "host" && runtime.count(device_kind::cuda) > 0) {
    client = runtime.cuda(0);
    kind = compute_kind::cuda;
  } else if (s.device == "cuda") {
#ifdef DEVRT_EXAMPLE_CUDA
    std::fprintf(stderr, "%s: --device cuda: %s\n", program, devices::cuda_unavailable_reason().c_str());
#endif
    return 1;
  }

  // Layout B is validated against the device before anything is loaded.
  if (auto r = memory::resolve_layout(s.layout_b, client.device().properties); !r) {
    throw usage_error("--layout-b: " + r.err().message());
  }

  std::printf("%s on the %s device: model A, then model B with layout %s\n", program, client.device().name.c_str(),
              s.layout_b_text.c_str());
  service svc(client, kind);
  svc.start();
  std::mt19937_64 rng(s.seed);
  bool ok = true;

  model a{"A", 1, 4, 256, std::uint64_t{256} * 256, {}};
  svc.load(a);
  report(svc, "model A loaded: " + std::to_string(a.layers) + " layers of " + memory::format_bytes(a.weight_words * 4) +
                  " in persistent memory");

  std::vector<session> sessions;
  serve_requests(svc, a, s.requests, rng, sessions);
  report(svc, "model A served its requests; its session caches are still open");

  svc.unload(a);
  report(svc, "model A unloaded: weights dropped and their pages returned");

  const auto refused = client.configure(s.layout_b).get();
  std::printf("\nconfigure layout B with %zu of A's session caches open: %s (%llu allocations, %s live)\n",
              sessions.size(), refused.applied ? "applied (expected kept!)" : "kept, not applied",
              static_cast<unsigned long long>(refused.live_allocations),
              memory::format_bytes(refused.live_bytes).c_str());
  ok = ok && !refused.applied;
  report(svc, "after the refused configure: the old layout is still in place");

  svc.close(sessions);
  const auto applied = client.configure(s.layout_b).get();
  std::printf("\nconfigure layout B once the session caches are closed: %s\n",
              applied.applied ? "applied" : "kept, not applied (expected applied!)");
  ok = ok && applied.applied;
  report(svc, "layout B in place");

  model b{"B", 2, 2, 512, std::uint64_t{512} * 512, {}};
  svc.load(b);
  report(svc, "model B loaded: " + std::to_string(b.layers) + " layers of " + memory::format_bytes(b.weight_words * 4) +
                  " in persistent memory");

  serve_requests(svc, b, s.requests, rng, sessions);
  svc.close(sessions);
  report(svc, "model B served its requests; sessions closed");

  const std::uint64_t mismatches = svc.host_mismatches() + svc.device_mismatches();
  const std::string problem = client.check_invariants().get();
  if (kind == compute_kind::none) {
    std::printf("\ndata checks: none (the %s device has no memory behind its allocations)\n",
                client.device().name.c_str());
  } else {
    const unsigned long long checked = s.requests * 2;  // by each model
    std::printf("\ndata checks: %llu requests and %llu session caches checked, %llu mismatching words\n", checked,
                checked, static_cast<unsigned long long>(mismatches));
  }
  std::printf("errors: %llu; invariants: %s\n", static_cast<unsigned long long>(svc.failures()),
              problem.empty() ? "hold" : problem.c_str());
  ok = ok && mismatches == 0 && svc.failures() == 0 && problem.empty();
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
