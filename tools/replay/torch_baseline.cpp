// devrt-torch-baseline: replays an allocation trace through PyTorch's CUDA caching allocator, from
// C++, on GPU 0, and prints the same figures as devrt-replay (ns/event, peak live, peak reserved,
// ratio). Not part of the default build: it needs PyTorch's C++ headers and libraries, which the GPU
// machine's python3 has. Build it there with tools/replay/build_torch_baseline.sh (or
// -DDEVRT_TORCH_BASELINE=ON).
//
//     devrt-torch-baseline TRACE [--limit N] [--memory-limit BYTES|Fx] [--json]
//
// --memory-limit: a balloon (cudaMalloc of what is free beyond it, before PyTorch starts) leaves
// PyTorch exactly BYTES of the GPU, or F times the trace's peak of live bytes; an allocation
// PyTorch then refuses is counted as a failure and the replay goes on.
//
// TRACE is devrt's trace format (gzip'd or plain): `# {json}` header, `a <id> <bytes>`, `f <id>`.
// The reader here is a small standalone one (zlib only), so the program needs nothing of devrt.
// Every `a` is raw_alloc(bytes) (raw_alloc(0) gives nullptr and is a no-op), every `f`
// raw_delete. The clock stops after cudaDeviceSynchronize. Peak reserved is
// getDeviceStats(0).reserved_bytes[0].peak (the aggregate pool), reset before the replay.
// PYTORCH_CUDA_ALLOC_CONF (e.g. expandable_segments:True) is read by PyTorch itself.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

struct event {
  std::uint64_t size;
  std::uint32_t id;  // dense, in allocation order
  bool alloc;
};

struct trace {
  std::vector<event> events;
  std::uint32_t allocations = 0;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "devrt-torch-baseline: %s\n", what.c_str());
  std::exit(1);
}

std::string read_all(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // passes plain files through
  if (f == nullptr) die(path + ": cannot open");
  std::string out;
  std::vector<char> buf(1 << 20);
  for (;;) {
    const int n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()));
    if (n < 0) die(path + ": read error");
    if (n == 0) break;
    out.append(buf.data(), static_cast<std::size_t>(n));
  }
  gzclose(f);
  return out;
}

trace parse(const std::string& path, std::uint64_t limit) {
  const std::string text = read_all(path);
  trace t;
  std::unordered_map<std::uint64_t, std::uint32_t> ids;  // trace id -> dense id
  std::vector<std::uint64_t> sizes;
  std::size_t pos = 0;
  std::uint64_t line_no = 0;
  while (pos < text.size() && t.events.size() < limit) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    char kind = 0;
    unsigned long long id = 0;
    unsigned long long bytes = 0;
    const int got = std::sscanf(line.c_str(), " %c %llu %llu", &kind, &id, &bytes);
    if (kind == 'a' && got == 3) {
      if (ids.count(id) != 0) die(path + ":" + std::to_string(line_no) + ": id allocated twice");
      ids.emplace(id, t.allocations);
      sizes.push_back(bytes);
      t.events.push_back(event{bytes, t.allocations++, true});
    } else if (kind == 'f' && got >= 2) {
      auto it = ids.find(id);
      if (it == ids.end()) die(path + ":" + std::to_string(line_no) + ": free of an unknown id");
      t.events.push_back(event{sizes[it->second], it->second, false});
      ids.erase(it);
    } else {
      die(path + ":" + std::to_string(line_no) + ": malformed line '" + line.substr(0, 60) + "'");
    }
  }
  return t;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  std::uint64_t limit = UINT64_MAX;
  bool json = false;
  std::uint64_t cap = 0;
  double cap_factor = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--limit" && i + 1 < argc) {
      limit = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--json") {
      json = true;
    } else if (a == "--memory-limit" && i + 1 < argc) {
      const std::string v = argv[++i];
      if (!v.empty() && (v.back() == 'x' || v.back() == 'X')) {
        cap_factor = std::strtod(v.c_str(), nullptr);
      } else {
        cap = std::strtoull(v.c_str(), nullptr, 10);
      }
      if (cap == 0 && cap_factor <= 0) {
        std::fprintf(stderr, "devrt-torch-baseline: bad --memory-limit '%s' (bytes, or F times the peak: 1.05x)\n",
                     v.c_str());
        return 2;
      }
    } else if (a == "--help" || a == "-h" || (!a.empty() && a[0] == '-') || !path.empty()) {
      std::fprintf(stderr, "usage: devrt-torch-baseline TRACE [--limit N] [--memory-limit BYTES|Fx] [--json]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    } else {
      path = a;
    }
  }
  if (path.empty()) {
    std::fprintf(stderr, "usage: devrt-torch-baseline TRACE [--limit N] [--json]\n");
    return 2;
  }
  const trace t = parse(path, limit);

  const char* conf = std::getenv("PYTORCH_CUDA_ALLOC_CONF");
  try {
    namespace alloc = c10::cuda::CUDACachingAllocator;
    check(cudaSetDevice(0), "cudaSetDevice(0)");
    check(cudaFree(nullptr), "cudaFree(nullptr)");  // the context, outside the clock
    void* balloon = nullptr;
    if (cap_factor > 0) {
      std::uint64_t l = 0;
      std::uint64_t p = 0;
      for (const event& e : t.events) {
        l = e.alloc ? l + e.size : l - e.size;
        p = std::max(p, l);
      }
      cap = static_cast<std::uint64_t>(static_cast<double>(p) * cap_factor);
    }
    if (cap != 0) {
      std::size_t free_bytes = 0;
      std::size_t total_bytes = 0;
      check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
      if (free_bytes > cap) check(cudaMalloc(&balloon, free_bytes - cap), "cudaMalloc (the balloon)");
    }
    std::uint64_t failures = 0;
    c10::cuda::set_device(0);
    alloc::init(1);
    alloc::resetPeakStats(0);

    std::vector<void*> ptrs(t.allocations, nullptr);
    std::uint64_t live = 0;
    std::uint64_t peak_live = 0;
    const auto start = std::chrono::steady_clock::now();
    for (const event& e : t.events) {
      if (e.alloc) {
        live += e.size;
        peak_live = std::max(peak_live, live);
        if (e.size != 0) {
          try {
            ptrs[e.id] = alloc::raw_alloc(e.size);
          } catch (const std::exception&) {
            if (cap == 0) throw;
            ++failures;  // refused under the memory limit: counted, the replay goes on
          }
        }
      } else {
        live -= e.size;
        if (ptrs[e.id] != nullptr) alloc::raw_delete(ptrs[e.id]);
        ptrs[e.id] = nullptr;
      }
    }
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const auto stop = std::chrono::steady_clock::now();
    const auto stats = alloc::getDeviceStats(0);
    const auto peak_reserved = static_cast<std::uint64_t>(stats.reserved_bytes[0].peak);
    const auto peak_allocated = static_cast<std::uint64_t>(stats.allocated_bytes[0].peak);
    for (void* p : ptrs) {
      if (p != nullptr) alloc::raw_delete(p);
    }

    const double seconds = std::chrono::duration<double>(stop - start).count();
    const double ns = t.events.empty() ? 0.0 : seconds * 1e9 / static_cast<double>(t.events.size());
    const double ratio = peak_live != 0 ? static_cast<double>(peak_reserved) / static_cast<double>(peak_live) : 0.0;
    const double gib = 1073741824.0;
    std::string name = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
    if (json) {
      std::printf(
          "{\"trace\": \"%s\", \"allocator\": \"torch\", \"alloc_conf\": \"%s\", \"events\": %zu, "
          "\"seconds\": %.6f, \"ns_per_event\": %.1f, \"peak_live_bytes\": %llu, \"peak_allocated_bytes\": %llu, "
          "\"peak_reserved_bytes\": %llu, \"ratio\": %.3f, \"memory_limit_bytes\": %llu, \"failures\": %llu}\n",
          name.c_str(), conf != nullptr ? conf : "", t.events.size(), seconds, ns,
          static_cast<unsigned long long>(peak_live), static_cast<unsigned long long>(peak_allocated),
          static_cast<unsigned long long>(peak_reserved), ratio, static_cast<unsigned long long>(cap),
          static_cast<unsigned long long>(failures));
    } else {
      std::printf("trace          %s (%zu events)\n", name.c_str(), t.events.size());
      std::printf("allocator      PyTorch CUDA caching allocator, PYTORCH_CUDA_ALLOC_CONF=%s\n",
                  conf != nullptr ? conf : "(unset)");
      std::printf("time           %.3f s, %.1f ns/event\n", seconds, ns);
      std::printf("peak live      %.3f GiB (%llu bytes)\n", static_cast<double>(peak_live) / gib,
                  static_cast<unsigned long long>(peak_live));
      std::printf("peak allocated %.3f GiB (%llu bytes), PyTorch's count (rounded sizes)\n",
                  static_cast<double>(peak_allocated) / gib, static_cast<unsigned long long>(peak_allocated));
      std::printf("peak reserved  %.3f GiB (%llu bytes)\n", static_cast<double>(peak_reserved) / gib,
                  static_cast<unsigned long long>(peak_reserved));
      std::printf("ratio          %.3f\n", ratio);
      if (cap != 0) {
        std::printf("memory limit   %llu bytes (a balloon), %llu failures\n", static_cast<unsigned long long>(cap),
                    static_cast<unsigned long long>(failures));
      }
    }
    if (balloon != nullptr) cudaFree(balloon);
  } catch (const std::exception& e) {
    // c10::Error (out of memory included) derives from std::exception.
    die(e.what());
  }
  return 0;
}
