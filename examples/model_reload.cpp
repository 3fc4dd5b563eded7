// Model reload: two models, each larger than half the device, served in turn without freeing either.
//
// A service holds models A and B. Each has weights (tag "A.weights", "B.weights") and a KV cache
// ("A.kv", "B.kv"), and each takes --model-fraction of the device (0.6 by default), so the two do
// not fit together. Instead of freeing a model's tensors and loading it again, the service puts its
// tags to sleep: devrt unmaps the tags' physical memory and keeps the addresses, and a later wake
// maps new memory at the same addresses. The weights sleep with their contents kept (copied to host
// memory and back), the KV cache sleeps with its contents discarded (the next requests rewrite it).
//
//   1. load A: weights under "A.weights", a KV cache under "A.kv"; serve requests, check outputs;
//   2. sleep A: the device's held bytes drop by A's size (the tags() table and the statistics);
//      a reserve under a sleeping tag fails with errc::asleep;
//   3. load B the same way, serve and check; sleep B;
//   4. wake A: the same weight pointers, the same weight checksum, the same outputs as in step 1;
//   5. wake B while A is awake: the two do not fit, so the wake fails with out_of_memory and B stays
//      asleep with its copy; sleep A, and B's wake succeeds: same pointers, checksum and outputs.
//
// On the host device the capacity is --capacity (256 MiB by default), on the simulated device too
// (it has no memory behind its allocations: the data checks are skipped there); on a CUDA GPU it is
// the GPU's memory. The compute is the toy model of inference_kernels.hpp, checked exactly; the
// weights' checksum covers every byte on the host and the first 64 MiB of each tensor on CUDA (read
// back to the host). The exit code is non-zero if any check fails.
//
//   devrt_model_reload [--device host|cuda|sim|auto] [--requests N] [--seed N] [--capacity BYTES]
//                      [--model-fraction F]
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
using memory::format_bytes;
using memory::memory_handle;

namespace {

constexpr const char* program = "devrt_model_reload";

constexpr const char* usage_text =
    "usage: devrt_model_reload [options]\n"
    "  --device D           host (default), cuda, sim, or auto (the first CUDA GPU if there is one, else host)\n"
    "  --requests N         requests served by each model each time it is awake (default 8)\n"
    "  --seed N             seed of the requests (default 1)\n"
    "  --capacity BYTES     the memory of the host and sim devices (default 256MiB; 128MiB to 16GiB);\n"
    "                       a CUDA GPU's is its own\n"
    "  --model-fraction F   each model's share of the device, from 0.55 to 0.75 (default 0.6): more than\n"
    "                       half, so that the two models never fit together\n";

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct settings {
  std::string device = "host";
  std::uint64_t requests = 8;
  std::uint64_t seed = 1;
  std::uint64_t capacity = std::uint64_t{256} << 20;
  double model_fraction = 0.6;
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

std::uint64_t parse_capacity(std::string_view text) {
  auto v = memory::parse_size(text);
  if (!v || *v < (std::uint64_t{128} << 20) || *v > (std::uint64_t{16} << 30)) {
    throw usage_error("--capacity expects a size from 128MiB to 16GiB, not '" + std::string(text) + "'");
  }
  return *v;
}

double parse_fraction(std::string_view text) {
  const std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !(v >= 0.55 && v <= 0.75)) {
    throw usage_error("--model-fraction expects a number from 0.55 to 0.75, not '" + s + "'");
  }
  return v;
}

std::optional<settings> parse_args(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") return std::nullopt;
    if (arg != "--device" && arg != "--requests" && arg != "--seed" && arg != "--capacity" &&
        arg != "--model-fraction") {
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
    } else if (arg == "--capacity") {
      s.capacity = parse_capacity(value);
    } else {
      s.model_fraction = parse_fraction(value);
    }
  }
  return s;
}

// ---- The model ----

enum class compute_kind { host, cuda, none };

constexpr std::uint64_t mib = std::uint64_t{1} << 20;
constexpr std::uint64_t hidden = 128;               // words per token
constexpr std::uint32_t layers = 4;                 // weight tensors per model
constexpr std::uint32_t kv_slots = 4;               // KV cache tensors per model (one per conversation in flight)
constexpr std::uint64_t checksum_limit = 64 * mib;  // bytes of each tensor read back for a checksum on CUDA

/// One request: the seed of its input and its number of tokens.
struct request {
  std::uint32_t seed = 0;
  std::uint64_t tokens = 0;
};

struct model {
  std::string name;  // "A": its tags are "A.weights" and "A.kv"
  std::uint32_t id = 0;
  std::uint64_t layer_bytes = 0;  // each weight tensor
  std::uint64_t slot_bytes = 0;   // each KV cache tensor
  std::vector<request> requests;

  std::vector<memory_handle> weights;
  std::vector<memory_handle> kv;
  std::vector<void*> addresses;        // of the weights, at load
  std::uint64_t weights_checksum = 0;  // at load
  std::vector<std::uint64_t> outputs;  // a digest of each request's output, the first time it served

  [[nodiscard]] std::string weights_tag() const { return name + ".weights"; }
  [[nodiscard]] std::string kv_tag() const { return name + ".kv"; }
  [[nodiscard]] std::uint64_t weight_words() const { return layer_bytes / 4; }
  [[nodiscard]] std::uint64_t weight_bytes() const { return layer_bytes * layers; }
  [[nodiscard]] std::uint64_t kv_bytes() const { return slot_bytes * kv_slots; }
  [[nodiscard]] std::uint64_t bytes() const { return weight_bytes() + kv_bytes(); }
};

/// A model of `fraction` of `capacity`: a third weights, two thirds KV cache (a serving engine gives
/// most of its memory to the cache), every tensor a whole number of 2 MiB granules.
model make_model(std::string name, std::uint32_t id, std::uint64_t capacity, double fraction) {
  const auto total = static_cast<std::uint64_t>(static_cast<double>(capacity) * fraction);
  const std::uint64_t granule = 2 * mib;
  model m;
  m.name = std::move(name);
  m.id = id;
  m.layer_bytes = std::max(granule, total / 3 / layers / granule * granule);
  m.slot_bytes = std::max(granule, (total - m.weight_bytes()) / kv_slots / granule * granule);
  return m;
}

std::vector<request> make_requests(std::uint64_t n, std::mt19937_64& rng) {
  std::uniform_int_distribution<std::uint64_t> batch(1, 8);
  std::uniform_int_distribution<std::uint64_t> sequence(16, 512);
  std::vector<request> out;
  for (std::uint64_t i = 0; i < n; ++i) {
    const auto seed = static_cast<std::uint32_t>(rng());
    out.push_back(request{seed, batch(rng) * sequence(rng)});
  }
  return out;
}

std::uint32_t* words(const memory::resource& r) { return static_cast<std::uint32_t*>(r.ptr); }
unsigned long long* counter_of(const memory::resource& r) { return static_cast<unsigned long long*>(r.ptr); }

/// A 64-bit digest of words (order-dependent).
std::uint64_t digest(const std::uint32_t* w, std::uint64_t n, std::uint64_t h = 0xcbf29ce484222325ULL) {
  for (std::uint64_t i = 0; i < n; ++i) h = (h ^ w[i]) * 0x100000001b3ULL;
  return h;
}
std::uint64_t digest(const std::vector<std::byte>& bytes, std::uint64_t h = 0xcbf29ce484222325ULL) {
  std::vector<std::uint32_t> w(bytes.size() / 4);
  std::memcpy(w.data(), bytes.data(), w.size() * 4);
  return digest(w.data(), w.size(), h);
}

void check_launch(const char* cuda_error) {
  if (cuda_error != nullptr) throw std::runtime_error(std::string("kernel launch failed: ") + cuda_error);
}

// ---- The service ----

/// A tag whose wake failed, and why.
struct wake_failure {
  std::string tag;
  devrt::runtime::system_error error;
};

/// `text` with `prefix` before each line.
std::string indented(const std::string& text, const std::string& prefix) {
  std::string out = prefix;
  for (std::size_t i = 0; i < text.size(); ++i) {
    out += text[i];
    if (text[i] == '\n' && i + 1 < text.size()) out += prefix;
  }
  if (!out.empty() && out.back() != '\n') out += '\n';
  return out;
}

/// The device, the models' memory on it, and what the checks found. Every operation waits for its
/// futures: this program is sequential, and the futures carry any error.
class service {
 public:
  service(compute_client client, compute_kind kind) : client_(std::move(client)), kind_(kind) {
    counter_ = client_.create(sizeof(unsigned long long));
    if (kind_ == compute_kind::cuda) wait(client_.write(counter_.binding(), std::vector<std::byte>(8)));
  }

  [[nodiscard]] const compute_client& client() const noexcept { return client_; }
  [[nodiscard]] bool has_contents() const noexcept { return kind_ != compute_kind::none; }
  [[nodiscard]] std::uint64_t failed_checks() const noexcept { return failed_; }
  [[nodiscard]] std::uint64_t errors() const noexcept { return errors_; }

  /// Prints one check and counts it when it fails.
  bool check(bool ok, const std::string& what) {
    std::printf("  [%s] %s\n", ok ? " ok " : "FAIL", what.c_str());
    if (!ok) ++failed_;
    return ok;
  }

  /// Reserves the model's tensors under its two tags and writes its weights. The weights use the
  /// thread's tag (a scope); the KV cache names its tag on each create.
  void load(model& m) {
    {
      const tag_scope scope = compute_client::tag(m.weights_tag());
      for (std::uint32_t l = 0; l < layers; ++l) m.weights.push_back(client_.create(m.layer_bytes));
    }
    const memory::tag_name kv_tag(m.kv_tag());
    for (std::uint32_t s = 0; s < kv_slots; ++s) m.kv.push_back(client_.create(m.slot_bytes, memory::stream(), kv_tag));
    for (std::uint32_t l = 0; l < layers; ++l) {
      wait(client_.submit({m.weights[l].binding()},
                          [kind = kind_, l, n = m.weight_words(), id = m.id](submit_context& c) {
                            if (kind == compute_kind::host) example::host_fill_weights(words(c.resources[0]), n, id, l);
                            if (kind == compute_kind::cuda)
                              check_launch(example::cuda_fill_weights(words(c.resources[0]), n, id, l, c.stream));
                          }));
    }
    for (const auto& w : m.weights) m.addresses.push_back(w.ptr());
    m.weights_checksum = weights_checksum(m);
  }

  /// A digest of the weights: every byte on the host, the first 64 MiB of each tensor on CUDA (read
  /// back to the host), 0 on the simulated device (no contents).
  std::uint64_t weights_checksum(const model& m) {
    std::uint64_t h = 0xcbf29ce484222325ULL;
    for (const auto& w : m.weights) {
      if (kind_ == compute_kind::host) {
        h = get(client_.submit({w.binding()}, [n = m.weight_words(), h](submit_context& c) {
          return digest(words(c.resources[0]), n, h);
        }));
      } else if (kind_ == compute_kind::cuda) {
        h = digest(read_prefix(w, std::min(m.layer_bytes, checksum_limit)), h);
      }
    }
    return h;
  }

  /// Serves the model's requests; returns the mismatching words (outputs and KV slots) and fills
  /// `outputs` with a digest of each output.
  std::uint64_t serve(const model& m, std::vector<std::uint64_t>& outputs) {
    const std::uint64_t before = device_mismatches();
    std::uint64_t wrong = 0;
    outputs.clear();
    for (std::size_t i = 0; i < m.requests.size(); ++i) {
      wrong += serve_one(m, m.requests[i], m.kv[i % kv_slots], outputs);
    }
    return wrong + device_mismatches() - before;
  }

  /// Puts the model to sleep: its weights with their contents, its KV cache without.
  void sleep(const model& m) {
    wait(client_.sleep(m.weights_tag(), true));
    wait(client_.sleep(m.kv_tag(), false));
  }

  /// Wakes the model's tags, all or none: the KV cache first (it has no contents to restore), then
  /// the weights. When one fails, the tags already woken go back to sleep (a service cannot serve
  /// half a model), and the failure names the tag.
  std::optional<wake_failure> wake(const model& m) {
    const std::string order[] = {m.kv_tag(), m.weights_tag()};
    for (std::size_t i = 0; i < 2; ++i) {
      try {
        client_.wake(order[i]).get();
      } catch (const devrt::runtime::system_error& e) {
        for (std::size_t j = 0; j < i; ++j) wait(client_.sleep(order[j], order[j] == m.weights_tag()));
        return wake_failure{order[i], e};
      }
    }
    return std::nullopt;
  }

  /// The usage of one tag (an empty one if the device has never seen it).
  memory::tag_usage tag(const std::string& name) {
    for (auto& t : get(client_.tags())) {
      if (t.name == name) return t;
    }
    return {};
  }

  /// What the device holds for devrt: mapped now, plus memory given back and not yet taken.
  std::uint64_t held() {
    const auto s = get(client_.statistics());
    return s.bytes_reserved + s.bytes_returning;
  }

  void print_tags() {
    std::printf("  %-10s %-7s %-5s %12s %7s %12s %12s %12s\n", "tag", "state", "kept", "in use", "allocs", "mapped",
                "sleeping", "offloaded");
    for (const auto& t : get(client_.tags())) {
      std::printf("  %-10s %-7s %-5s %12s %7llu %12s %12s %12s\n", t.name.c_str(), memory::to_string(t.state),
                  t.contents_kept ? "yes" : "-", format_bytes(t.bytes_in_use).c_str(),
                  static_cast<unsigned long long>(t.allocations), format_bytes(t.bytes_reserved).c_str(),
                  format_bytes(t.bytes_sleeping).c_str(), format_bytes(t.bytes_offloaded).c_str());
    }
  }

  void print_statistics() {
    const auto s = get(client_.statistics());
    std::printf("  device: %s held, %s in use, %s sleeping, %s offloaded to the host; %llu sleeps, %llu wakes\n",
                format_bytes(s.bytes_reserved + s.bytes_returning).c_str(), format_bytes(s.bytes_in_use).c_str(),
                format_bytes(s.bytes_sleeping).c_str(), format_bytes(s.bytes_offloaded).c_str(),
                static_cast<unsigned long long>(s.sleeps), static_cast<unsigned long long>(s.wakes));
  }

 private:
  /// One request: input, the layers, the check of the output and its digest; its keys and values
  /// go to its KV slot, which is checked at the end.
  std::uint64_t serve_one(const model& m, const request& r, const memory_handle& slot,
                          std::vector<std::uint64_t>& outputs) {
    const std::uint64_t n = r.tokens * hidden;
    memory_handle x = client_.create(n * 4);
    launch({x.binding()}, [n, seed = r.seed](compute_kind k, submit_context& c) {
      if (k == compute_kind::host) example::host_input(words(c.resources[0]), n, seed);
      if (k == compute_kind::cuda) check_launch(example::cuda_input(words(c.resources[0]), n, seed, c.stream));
    });
    for (std::uint32_t l = 0; l < layers; ++l) {
      memory_handle h = client_.create(2 * n * 4);
      memory_handle y = client_.create(n * 4);
      launch({x.binding(), m.weights[l].binding(), h.binding(), y.binding()},
             [n, wn = m.weight_words()](compute_kind k, submit_context& c) {
               const auto& res = c.resources;
               if (k == compute_kind::host)
                 example::host_layer(words(res[0]), words(res[1]), wn, words(res[2]), words(res[3]), n);
               if (k == compute_kind::cuda) {
                 check_launch(
                     example::cuda_layer(words(res[0]), words(res[1]), wn, words(res[2]), words(res[3]), n, c.stream));
               }
             });
      x = std::move(y);
    }
    const std::uint32_t kv_seed = example::mix32(r.seed ^ 0x6b76U);
    launch({slot.binding()}, [words_n = m.slot_bytes / 4, kv_seed](compute_kind k, submit_context& c) {
      if (k == compute_kind::host) example::host_probe_fill(words(c.resources[0]), words_n, kv_seed);
      if (k == compute_kind::cuda)
        check_launch(example::cuda_probe_fill(words(c.resources[0]), words_n, kv_seed, c.stream));
    });
    std::uint64_t wrong = checked(x, n, r.seed, m) + checked_slot(slot, m.slot_bytes / 4, kv_seed);
    outputs.push_back(has_contents() ? digest(get(client_.read(x.binding()))) : 0);
    return wrong;
  }

  /// Submits `fn(kind, context)`; its errors are counted.
  template <class F>
  void launch(std::vector<memory::memory_binding> bindings, F fn) {
    wait(client_.submit(std::move(bindings), [kind = kind_, fn](submit_context& c) { fn(kind, c); }));
  }

  /// Mismatching words of an output (counted on the host; on CUDA in the device counter).
  std::uint64_t checked(const memory_handle& y, std::uint64_t n, std::uint32_t seed, const model& m) {
    return get(client_.submit({y.binding(), counter_.binding()}, [kind = kind_, n, seed, id = m.id,
                                                                  wn = m.weight_words()](submit_context& c) {
      const auto& r = c.resources;
      if (kind == compute_kind::host) return example::host_verify(words(r[0]), n, seed, id, layers, wn);
      if (kind == compute_kind::cuda) {
        check_launch(example::cuda_verify(words(r[0]), n, seed, id, layers, wn, counter_of(r[1]), c.stream));
      }
      return std::uint64_t{0};
    }));
  }

  std::uint64_t checked_slot(const memory_handle& slot, std::uint64_t n, std::uint32_t seed) {
    return get(client_.submit({slot.binding(), counter_.binding()}, [kind = kind_, n, seed](submit_context& c) {
      const auto& r = c.resources;
      if (kind == compute_kind::host) return example::host_probe_check(words(r[0]), n, seed);
      if (kind == compute_kind::cuda)
        check_launch(example::cuda_probe_check(words(r[0]), n, seed, counter_of(r[1]), c.stream));
      return std::uint64_t{0};
    }));
  }

  /// Mismatches counted in device memory so far (CUDA devices; 0 elsewhere).
  std::uint64_t device_mismatches() {
    if (kind_ != compute_kind::cuda) return 0;
    const auto bytes = get(client_.read(counter_.binding()));
    unsigned long long v = 0;
    if (bytes.size() >= sizeof(v)) std::memcpy(&v, bytes.data(), sizeof(v));
    return v;
  }

  /// The first `size` bytes of an allocation, copied in order after the work queued on its stream.
  std::vector<std::byte> read_prefix(const memory_handle& h, std::uint64_t size) {
    return get(client_.async_device<std::vector<std::byte>>(
        [b = h.binding(), size](actor_core& c) -> result<std::pair<memory::event, std::vector<std::byte>>> {
          std::vector<std::byte> out(size);
          auto t = c.read_async(b, out.data(), out.size());
          if (!t) return std::move(t).err();
          return std::make_pair(*t, std::move(out));  // the buffer does not move with the vector
        },
        use_future));
  }

  template <class Future>
  auto get(Future&& f) -> decltype(f.get()) {
    using R = decltype(f.get());
    try {
      return f.get();
    } catch (const boost::system::system_error& e) {
      fail(e);
      if constexpr (!std::is_void_v<R>) return R{};
    }
  }
  template <class Future>
  void wait(Future&& f) {
    get(std::forward<Future>(f));
  }
  void fail(const boost::system::system_error& e) {
    ++errors_;
    std::printf("  error: %s\n", e.what());
  }

  compute_client client_;
  compute_kind kind_;
  memory_handle counter_;
  std::uint64_t failed_ = 0;
  std::uint64_t errors_ = 0;
};

// ---- The steps ----

void heading(const std::string& title) { std::printf("\n== %s ==\n", title.c_str()); }

std::string requests_text(const model& m) {
  std::uint64_t tokens = 0;
  for (const auto& r : m.requests) tokens += r.tokens;
  return std::to_string(m.requests.size()) + " requests (" + std::to_string(tokens) + " tokens)";
}

/// Serves the model's requests and checks them: exact outputs, and the same outputs as the first
/// time (`first`: this is the first time, the digests are kept).
void serve_and_check(service& svc, model& m, bool first) {
  std::vector<std::uint64_t> outputs;
  const std::uint64_t wrong = svc.serve(m, outputs);
  if (!svc.has_contents()) {
    std::printf("  served %s with model %s (no data checks on this device)\n", requests_text(m).c_str(),
                m.name.c_str());
    return;
  }
  svc.check(wrong == 0, "served " + requests_text(m) + " with model " + m.name + ": " + std::to_string(wrong) +
                            " mismatching words in the outputs and KV slots");
  if (first) {
    m.outputs = outputs;
  } else {
    svc.check(outputs == m.outputs, "the outputs are those model " + m.name + " gave the first time");
  }
}

void load_and_serve(service& svc, model& m) {
  svc.load(m);
  std::printf("  weights: %u tensors of %s under tag %s; KV cache: %u tensors of %s under tag %s\n", layers,
              format_bytes(m.layer_bytes).c_str(), m.weights_tag().c_str(), kv_slots,
              format_bytes(m.slot_bytes).c_str(), m.kv_tag().c_str());
  serve_and_check(svc, m, true);
  svc.print_statistics();
}

/// Sleeps the model and checks that the device got its memory back.
void sleep_model(service& svc, const model& m) {
  const std::uint64_t mapped = svc.tag(m.weights_tag()).bytes_reserved + svc.tag(m.kv_tag()).bytes_reserved;
  const std::uint64_t before = svc.held();
  std::printf("  sleep model %s: %s with its contents kept, %s with its contents discarded\n", m.name.c_str(),
              m.weights_tag().c_str(), m.kv_tag().c_str());
  svc.sleep(m);
  const std::uint64_t after = svc.held();
  svc.print_tags();
  svc.print_statistics();
  svc.check(before >= after + mapped, "the device holds " + format_bytes(before) + " before, " + format_bytes(after) +
                                          " after: model " + m.name + "'s " + format_bytes(mapped) + " went back");
  const auto w = svc.tag(m.weights_tag());
  const auto kv = svc.tag(m.kv_tag());
  svc.check(w.state == memory::tag_state::asleep && kv.state == memory::tag_state::asleep,
            m.weights_tag() + " and " + m.kv_tag() + " are asleep");
  if (svc.has_contents()) {
    svc.check(
        w.contents_kept && !kv.contents_kept,
        "the weights' contents are kept (" + format_bytes(w.bytes_offloaded) + " on the host), the KV cache's are not");
  }
}

/// A reserve under a sleeping tag fails with errc::asleep.
void check_asleep_refuses(service& svc, const model& m) {
  try {
    (void)svc.client().reserve(mib, memory::stream(), memory::tag_name(m.kv_tag())).get();
    svc.check(false, "a reserve under " + m.kv_tag() + " while it sleeps: served (expected errc::asleep)");
  } catch (const devrt::runtime::system_error& e) {
    svc.check(e.code() == errc::asleep, "a reserve under " + m.kv_tag() + " while it sleeps: " + e.what());
  }
}

/// Wakes the model and checks that its weights are where and what they were, and that it serves as
/// it did the first time.
void wake_and_serve(service& svc, model& m) {
  if (auto f = svc.wake(m)) {
    svc.check(false, "wake model " + m.name + ": " + f->tag + ": " + f->error.what());
    return;
  }
  svc.check(true, "woke model " + m.name);
  std::vector<void*> addresses;
  for (const auto& w : m.weights) addresses.push_back(w.ptr());
  svc.check(addresses == m.addresses, "its weight handles have the same addresses as at load");
  if (svc.has_contents()) {
    svc.check(svc.weights_checksum(m) == m.weights_checksum, "its weights' checksum is the one taken at load");
  }
  serve_and_check(svc, m, false);
  svc.print_statistics();
}

/// While `awake` is awake, `sleeping` does not fit: its wake fails and changes nothing.
void check_wake_without_room(service& svc, const model& awake, const model& sleeping) {
  const auto before = svc.tag(sleeping.weights_tag());
  const auto f = svc.wake(sleeping);
  const bool oom = f && f->error.code() == errc::out_of_memory;
  svc.check(oom,
            "wake model " + sleeping.name + " while model " + awake.name + " is awake: " +
                (!f ? std::string("woke (expected out_of_memory)")
                    : f->tag + " failed with " + (oom ? std::string("out_of_memory") : f->error.code().message())));
  if (f) std::printf("    what the error says:\n%s", indented(f->error.what(), "    | ").c_str());
  const auto w = svc.tag(sleeping.weights_tag());
  const auto kv = svc.tag(sleeping.kv_tag());
  svc.check(w.state == memory::tag_state::asleep && kv.state == memory::tag_state::asleep,
            "model " + sleeping.name + " is still asleep, both tags");
  if (svc.has_contents()) {
    svc.check(w.contents_kept && w.bytes_offloaded == before.bytes_offloaded,
              "its weights' kept copy is intact (" + format_bytes(w.bytes_offloaded) + " on the host)");
  }
  svc.print_tags();
}

int run(const settings& s) {
#ifndef DEVRT_EXAMPLE_CUDA
  if (s.device == "cuda") throw usage_error("--device cuda: this build has no CUDA support");
#endif
  runtime_options opts;
  opts.host.alignment = 256;
  opts.host.capacity = s.capacity;
  opts.use_cuda = s.device == "cuda" || s.device == "auto";
  if (s.device == "sim") {
    devices::sim_options sim;
    sim.props = memory::device_properties{1ULL << 30, 512, s.capacity, 2 * mib};
    opts.sim = sim;
  }
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

  const std::uint64_t capacity = client.device().properties.capacity;
  std::mt19937_64 rng(s.seed);
  model a = make_model("A", 1, capacity, s.model_fraction);
  model b = make_model("B", 2, capacity, s.model_fraction);
  a.requests = make_requests(s.requests, rng);
  b.requests = make_requests(s.requests, rng);
  std::printf("%s on the %s device (%s): models A and B of %s each (%.0f%% of it), together %s\n", program,
              client.device().name.c_str(), format_bytes(capacity).c_str(), format_bytes(a.bytes()).c_str(),
              s.model_fraction * 100, format_bytes(a.bytes() + b.bytes()).c_str());
  if (kind == compute_kind::none) {
    std::printf("(the %s device has no memory behind its allocations: no data checks)\n", client.device().name.c_str());
  }

  service svc(client, kind);
  heading("1. load model A and serve");
  load_and_serve(svc, a);

  heading("2. sleep model A: weights kept, KV cache discarded");
  sleep_model(svc, a);
  check_asleep_refuses(svc, a);

  heading("3. load model B and serve, then sleep it");
  load_and_serve(svc, b);
  sleep_model(svc, b);

  heading("4. wake model A and serve again");
  wake_and_serve(svc, a);

  heading("5. wake model B while A is awake (no room); sleep A, wake B and serve again");
  check_wake_without_room(svc, a, b);
  sleep_model(svc, a);
  wake_and_serve(svc, b);

  heading("summary: devrt's usage report, then the checks");
  std::printf("%s", indented(client.report().get(), "  ").c_str());
  const std::string problem = client.check_invariants().get();
  svc.check(problem.empty(), "the memory manager's invariants " + (problem.empty() ? std::string("hold") : problem));
  const bool ok = svc.failed_checks() == 0 && svc.errors() == 0;
  std::printf("%llu failed checks, %llu errors\n%s\n", static_cast<unsigned long long>(svc.failed_checks()),
              static_cast<unsigned long long>(svc.errors()), ok ? "PASS" : "FAIL");
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
