#include "cuda_staging.hpp"

#include "cuda_driver.hpp"

namespace devrt::devices::cuda_detail {

namespace {

constexpr std::uint64_t min_staging = std::uint64_t{64} << 10;

std::uint64_t staging_class(std::uint64_t n) {
  std::uint64_t c = min_staging;
  while (c < n) c <<= 1;
  return c;
}

}  // namespace

staging_pool::~staging_pool() {
  for (auto& f : in_flight_) {
    cudaFreeHost(f.b.ptr);
    cudaEventDestroy(f.ev);
  }
  for (auto& b : free_) cudaFreeHost(b.ptr);
}

result<staging_buffer> staging_pool::take(std::uint64_t size, event_table& events) {
  const std::uint64_t want = staging_class(size);
  recycle(events);
  std::size_t best = free_.size();
  for (std::size_t i = 0; i < free_.size(); ++i) {
    if (free_[i].size >= want && (best == free_.size() || free_[i].size < free_[best].size)) best = i;
  }
  if (best != free_.size()) {
    const staging_buffer b = free_[best];
    free_[best] = free_.back();
    free_.pop_back();
    return b;
  }
  void* p = nullptr;
  if (auto e = cudaHostAlloc(&p, want, cudaHostAllocDefault); e != cudaSuccess) {
    error err = cuda_error(e, "cudaHostAlloc (pinned staging memory) failed");
    err.code = errc::out_of_memory;
    err.size = want;
    return err;
  }
  bytes_ += want;
  return staging_buffer{p, want};
}

void staging_pool::give(staging_buffer b) noexcept {
  try {
    free_.push_back(b);
  } catch (...) {
    cudaFreeHost(b.ptr);
    bytes_ -= b.size;
  }
}

void staging_pool::give_after(event_table& events, cudaEvent_t ev, staging_buffer b, bool foreign) noexcept {
  try {
    in_flight_.push_back(in_flight{ev, b, foreign});
  } catch (...) {
    // No room to track it: wait for the copy, then the buffer is free (a wait on a rare path).
    cudaEventSynchronize(ev);
    give(b);
    if (foreign) {
      cudaEventDestroy(ev);
    } else {
      events.give(ev);
    }
  }
}

void staging_pool::recycle(event_table& events) noexcept {
  for (std::size_t i = 0; i < in_flight_.size();) {
    if (cudaEventQuery(in_flight_[i].ev) == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error; a client's thread may run this
      ++i;
      continue;
    }
    cudaGetLastError();
    give(in_flight_[i].b);
    if (in_flight_[i].foreign) {
      cudaEventDestroy(in_flight_[i].ev);
    } else {
      events.give(in_flight_[i].ev);
    }
    in_flight_[i] = in_flight_.back();
    in_flight_.pop_back();
  }
}

}  // namespace devrt::devices::cuda_detail
