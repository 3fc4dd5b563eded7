// The CUDA parts of the replay engine: devrt over devices::cuda_storage, and the baselines that
// replay the events against the CUDA runtime directly (see baseline_kind in replay.hpp).
#include "replay/cuda_replay.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#ifndef DEVRT_REPLAY_CUDA
#define DEVRT_REPLAY_CUDA 0
#endif

#if DEVRT_REPLAY_CUDA
#include <cuda_runtime_api.h>

#include "devrt/devices/cuda_storage.hpp"
#endif

namespace devrt::replay {

bool built_with_cuda() noexcept { return DEVRT_REPLAY_CUDA != 0; }

const char* to_string(baseline_kind b) noexcept {
  return b == baseline_kind::cuda_malloc ? "cudaMalloc" : "cudaMallocAsync";
}

namespace detail {

error cuda_replay_error(std::string what) {
  error e = error::make(errc::device_error, DEVRT_REPLAY_CUDA != 0 ? "CUDA" : "built without CUDA");
  e.text = std::move(what);
  return e;
}

void finish_rates(replay_result& r) {
  r.ns_per_event = r.events != 0 ? r.seconds * 1e9 / static_cast<double>(r.events) : 0.0;
  r.events_per_second = r.seconds > 0 ? static_cast<double>(r.events) / r.seconds : 0.0;
  r.ratio = r.peak_live_bytes != 0 ? static_cast<double>(r.peak_reserved_bytes) / static_cast<double>(r.peak_live_bytes)
                                   : 0.0;
}

}  // namespace detail

#if !DEVRT_REPLAY_CUDA

std::string cuda_unavailable_reason() { return "built without CUDA"; }

namespace detail {

result<memory::storage> make_cuda_storage(int /*device*/) {
  return cuda_replay_error("built without CUDA: --device cuda needs a build with the CUDA toolkit");
}

void note_driver_profile(memory::storage& /*store*/, replay_result& /*r*/) {}

result<replay_result> replay_baseline(const trace& /*t*/, const replay_options& /*o*/) {
  return cuda_replay_error("built without CUDA: the CUDA baselines need a build with the CUDA toolkit");
}

}  // namespace detail

#else

std::string cuda_unavailable_reason() { return devices::cuda_unavailable_reason(); }

namespace detail {

namespace {

using clock_type = std::chrono::steady_clock;

std::string cuda_text(cudaError_t e) { return fmt::format("{} ({})", cudaGetErrorName(e), cudaGetErrorString(e)); }

error call_failed(const char* call, cudaError_t e) {
  cudaGetLastError();  // clear the error so that the cleanup's calls run
  return cuda_replay_error(fmt::format("{} failed: {}", call, cuda_text(e)));
}

/// What a baseline changed on the device, put back however the replay ends: the pointers still
/// live are freed, the pool's release threshold restored and the pool trimmed, the stream destroyed.
struct baseline_state {
  bool async = false;
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;
  bool threshold_set = false;
  std::uint64_t old_threshold = 0;
  std::vector<void*> ptrs;
  void* balloon = nullptr;  // what is free beyond a memory limit, held for the replay

  baseline_state() = default;
  baseline_state(const baseline_state&) = delete;
  baseline_state& operator=(const baseline_state&) = delete;
  ~baseline_state() {
    for (void* p : ptrs) {
      if (p == nullptr) continue;
      if (async) {
        cudaFreeAsync(p, stream);
      } else {
        cudaFree(p);
      }
    }
    cudaDeviceSynchronize();
    if (balloon != nullptr) cudaFree(balloon);
    if (threshold_set) cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &old_threshold);
    if (pool != nullptr) cudaMemPoolTrimTo(pool, 0);
    if (stream != nullptr) cudaStreamDestroy(stream);
    cudaGetLastError();
  }
};

}  // namespace

result<memory::storage> make_cuda_storage(int device) {
  try {
    return memory::storage::make<devices::cuda_storage>(device);
  } catch (const exception& e) {
    const std::string reason = devices::cuda_unavailable_reason();
    return cuda_replay_error(fmt::format("CUDA device {} cannot be used: {}: {}{}", device, e.err().detail,
                                         e.err().text, reason.empty() ? "" : fmt::format(" ({})", reason)));
  }
}

void note_driver_profile(memory::storage& store, replay_result& r) {
  const auto* cuda = store.backend<devices::cuda_storage>();
  if (cuda == nullptr) return;
  r.driver_measured = true;
  r.physical_creates = cuda->physical_allocations();
  r.reused_allocations = cuda->reused_allocations();
  const devices::driver_profile& p = cuda->profile();
  r.driver_times.clear();
  for (std::size_t k = 0; k < devices::driver_profile::kinds; ++k) {
    const auto kind = static_cast<devices::driver_profile::kind>(k);
    r.driver_times.push_back({devices::driver_profile::name(kind), p.calls[k], static_cast<double>(p.ns[k]) * 1e-9});
  }
}

result<replay_result> replay_baseline(const trace& t, const replay_options& o) {
  const baseline_kind kind = *o.baseline;
  const bool async = kind == baseline_kind::cuda_malloc_async;
  if (const std::string reason = devices::cuda_unavailable_reason(); !reason.empty()) {
    return cuda_replay_error(fmt::format("CUDA device 0 cannot be used: {}", reason));
  }
  if (auto e = cudaSetDevice(0); e != cudaSuccess) return call_failed("cudaSetDevice(0)", e);
  cudaDeviceProp prop{};
  if (auto e = cudaGetDeviceProperties(&prop, 0); e != cudaSuccess) return call_failed("cudaGetDeviceProperties", e);
  // The context is made here, not inside the timed loop.
  if (auto e = cudaFree(nullptr); e != cudaSuccess) return call_failed("cudaFree(nullptr)", e);

  baseline_state st;
  st.async = async;
  st.ptrs.assign(t.allocations, nullptr);
  if (async) {
    if (auto e = cudaStreamCreateWithFlags(&st.stream, cudaStreamNonBlocking); e != cudaSuccess) {
      return call_failed("cudaStreamCreateWithFlags", e);
    }
    if (auto e = cudaDeviceGetDefaultMemPool(&st.pool, 0); e != cudaSuccess) {
      return call_failed("cudaDeviceGetDefaultMemPool", e);
    }
    if (auto e = cudaMemPoolGetAttribute(st.pool, cudaMemPoolAttrReleaseThreshold, &st.old_threshold);
        e != cudaSuccess) {
      return call_failed("cudaMemPoolGetAttribute(cudaMemPoolAttrReleaseThreshold)", e);
    }
    std::uint64_t keep_all = std::numeric_limits<std::uint64_t>::max();
    if (auto e = cudaMemPoolSetAttribute(st.pool, cudaMemPoolAttrReleaseThreshold, &keep_all); e != cudaSuccess) {
      return call_failed("cudaMemPoolSetAttribute(cudaMemPoolAttrReleaseThreshold)", e);
    }
    st.threshold_set = true;
    // Start from an empty pool with fresh high-water marks (only 0 may be written to them).
    cudaDeviceSynchronize();
    if (auto e = cudaMemPoolTrimTo(st.pool, 0); e != cudaSuccess) return call_failed("cudaMemPoolTrimTo", e);
    std::uint64_t zero = 0;
    if (auto e = cudaMemPoolSetAttribute(st.pool, cudaMemPoolAttrReservedMemHigh, &zero); e != cudaSuccess) {
      return call_failed("cudaMemPoolSetAttribute(cudaMemPoolAttrReservedMemHigh)", e);
    }
    zero = 0;
    if (auto e = cudaMemPoolSetAttribute(st.pool, cudaMemPoolAttrUsedMemHigh, &zero); e != cudaSuccess) {
      return call_failed("cudaMemPoolSetAttribute(cudaMemPoolAttrUsedMemHigh)", e);
    }
  }

  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  cudaDeviceSynchronize();
  if (auto e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess) return call_failed("cudaMemGetInfo", e);
  if (o.memory_limit != 0 && free_bytes > o.memory_limit) {
    // A balloon: the allocator finds exactly the limit free.
    if (auto e = cudaMalloc(&st.balloon, free_bytes - o.memory_limit); e != cudaSuccess) {
      return call_failed("cudaMalloc (the balloon that leaves the memory limit free)", e);
    }
    cudaDeviceSynchronize();
    if (auto e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess) return call_failed("cudaMemGetInfo", e);
  }
  const std::uint64_t used_before = total_bytes - free_bytes;
  std::uint64_t peak_used = used_before;
  clock_type::duration sampling{0};
  const auto sample = [&] {
    const auto s0 = clock_type::now();
    std::size_t f = 0;
    std::size_t tot = 0;
    if (cudaMemGetInfo(&f, &tot) == cudaSuccess) peak_used = std::max<std::uint64_t>(peak_used, tot - f);
    sampling += clock_type::now() - s0;
  };

  replay_result r;
  r.allocator = to_string(kind);
  r.device = fmt::format("cuda:0 ({})", prop.name);
  r.peak_reserved_source = async ? "cudaMemPoolAttrReservedMemHigh" : "cudaMemGetInfo";
  const std::vector<trace_event>& events = t.events;
  const std::uint64_t n = events.size();
  std::uint64_t live = 0;
  std::uint64_t peak_live = 0;
  std::uint64_t played = n;

  const auto start = clock_type::now();
  for (std::uint64_t i = 0; i < n; ++i) {
    const trace_event& e = events[i];
    if ((i & 0x3fff) == 0 && o.progress) o.progress(i, n);
    bool new_peak = false;
    if (e.kind == event_kind::alloc) {
      ++r.allocations;
      live += e.size;
      new_peak = live > peak_live;
      peak_live = std::max(peak_live, live);
      if (e.size != 0) {  // cudaMalloc(0) gives nullptr: a size-0 allocation calls nothing
        void* p = nullptr;
        const cudaError_t err = async ? cudaMallocAsync(&p, e.size, st.stream) : cudaMalloc(&p, e.size);
        if (err == cudaSuccess) {
          ++r.driver_allocs;
          st.ptrs[e.id] = p;
        } else {
          cudaGetLastError();
          if (r.failures++ == 0) {
            r.first_failure =
                fmt::format("event {} (a {} {}): {} failed: {}", i, e.id, e.size, r.allocator, cuda_text(err));
          }
          if (o.strict) {
            played = i + 1;
            r.stopped = true;
            break;
          }
        }
      }
    } else {
      ++r.frees;
      live -= e.size;
      if (void* p = std::exchange(st.ptrs[e.id], nullptr); p != nullptr) {
        const cudaError_t err = async ? cudaFreeAsync(p, st.stream) : cudaFree(p);
        if (err != cudaSuccess) return call_failed(async ? "cudaFreeAsync" : "cudaFree", err);
        ++r.driver_frees;
      }
    }
    if (!async && (new_peak || (i + 1) % 1000 == 0)) sample();
  }
  const cudaError_t synced = async ? cudaStreamSynchronize(st.stream) : cudaDeviceSynchronize();
  const auto stop = clock_type::now();
  if (synced != cudaSuccess) return call_failed(async ? "cudaStreamSynchronize" : "cudaDeviceSynchronize", synced);
  if (o.progress) o.progress(played, n);

  r.events = played;
  r.seconds = std::chrono::duration<double>(stop - start - sampling).count();
  r.peak_live_bytes = peak_live;
  if (async) {
    std::uint64_t high = 0;
    std::uint64_t current = 0;
    std::uint64_t used_high = 0;
    if (auto e = cudaMemPoolGetAttribute(st.pool, cudaMemPoolAttrReservedMemHigh, &high); e != cudaSuccess) {
      return call_failed("cudaMemPoolGetAttribute(cudaMemPoolAttrReservedMemHigh)", e);
    }
    cudaMemPoolGetAttribute(st.pool, cudaMemPoolAttrReservedMemCurrent, &current);
    cudaMemPoolGetAttribute(st.pool, cudaMemPoolAttrUsedMemHigh, &used_high);
    r.peak_reserved_bytes = high;
    r.reserved_at_end = current;
    r.peak_in_use_bytes = used_high;
  } else {
    sample();
    std::size_t f = 0;
    std::size_t tot = 0;
    cudaMemGetInfo(&f, &tot);
    r.peak_reserved_bytes = peak_used - used_before;
    const std::uint64_t used_now = tot - f;
    r.reserved_at_end = used_now > used_before ? used_now - used_before : 0;
    r.peak_in_use_bytes = peak_live;
  }
  finish_rates(r);
  return r;  // st's destructor frees what is still live and puts the pool back
}

}  // namespace detail

#endif

}  // namespace devrt::replay
