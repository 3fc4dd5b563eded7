#include "cuda_vmm_driver.hpp"

#include "cuda_driver.hpp"
#include "cuda_events.hpp"

namespace devrt::devices {

using cuda_detail::as_stream;
using cuda_detail::timed_call;

result<std::uint64_t> cuda_storage::vmm_driver_impl::reserve_addresses(std::uint64_t size) {
  CUdeviceptr base = 0;
  CUresult r = CUDA_SUCCESS;
  {
    const timed_call timer(s_.profile_, driver_profile::address_reserve);
    r = s_.api_->address_reserve(&base, size, s_.props_.map_granularity, 0, 0);
  }
  if (r != CUDA_SUCCESS) return s_.api_->fail(r, "cuMemAddressReserve failed");
  return static_cast<std::uint64_t>(base);
}

void cuda_storage::vmm_driver_impl::free_addresses(std::uint64_t base, std::uint64_t size) noexcept {
  s_.api_->address_free(base, size);
}

result<std::uint64_t> cuda_storage::vmm_driver_impl::create(std::uint64_t size) {
  const CUmemAllocationProp prop = cuda_detail::physical_props(s_.device_);
  CUmemGenericAllocationHandle h = 0;
  CUresult r = CUDA_SUCCESS;
  {
    const timed_call timer(s_.profile_, driver_profile::create);
    r = s_.api_->create(&h, size, &prop, 0);
  }
  if (r != CUDA_SUCCESS) {
    error e = s_.api_->fail(r, "mapping device memory failed");
    e.in_use = s_.allocated_;
    e.limit = s_.props_.capacity;
    e.detail = "cuMemCreate";
    return e;
  }
  s_.allocated_ += size;
  ++s_.driver_allocs_;
  return static_cast<std::uint64_t>(h);
}

void cuda_storage::vmm_driver_impl::release(std::uint64_t handle, std::uint64_t size) noexcept {
  const timed_call timer(s_.profile_, driver_profile::release);
  s_.api_->release(handle);
  s_.allocated_ -= size;
  ++s_.driver_frees_;
}

result<void> cuda_storage::vmm_driver_impl::map(std::uint64_t at, std::uint64_t size, std::uint64_t handle) {
  CUresult r = CUDA_SUCCESS;
  {
    const timed_call timer(s_.profile_, driver_profile::map);
    r = s_.api_->map(at, size, 0, handle, 0);
  }
  if (r != CUDA_SUCCESS) {
    error e = s_.api_->fail(r, "mapping device memory failed");
    e.in_use = s_.allocated_;
    e.limit = s_.props_.capacity;
    e.detail = "cuMemMap";
    return e;
  }
  // The device itself and every peer given access (set_peer_access), in one call.
  if (auto a = s_.set_mapping_access(at, size, {}); !a) {
    s_.api_->unmap(at, size);
    return a;
  }
  return {};
}

void cuda_storage::vmm_driver_impl::unmap(std::uint64_t at, std::uint64_t size) noexcept {
  const timed_call timer(s_.profile_, driver_profile::unmap);
  s_.api_->unmap(at, size);
}

result<memory::event> cuda_storage::vmm_driver_impl::behind_device() {
  if (auto b = s_.bind_device(); !b) return std::move(b).err();
  if (auto j = s_.wait_for_return_streams(); !j) return std::move(j).err();
  // Nothing left to run on the device's stream, joins included: the unmaps may happen now.
  cudaError_t idle = cudaSuccess;
  {
    const timed_call timer(s_.profile_, driver_profile::stream_query);
    idle = cudaStreamQuery(as_stream(s_.stream_));
  }
  if (idle == cudaSuccess) return memory::event{0};
  if (idle == cudaErrorNotReady) (void)cudaGetLastError();  // not an error; a client's thread may run this
  if (idle != cudaErrorNotReady) return cuda_detail::cuda_error(idle, "cudaStreamQuery failed");
  return s_.events_->record(as_stream(s_.stream_));
}

result<bool> cuda_storage::vmm_driver_impl::query(memory::event e) {
  auto r = s_.events_->query(e);
  if (!r) {
    error err = std::move(r).err();
    err.detail = "waiting for the stream before unmapping failed";
    return err;
  }
  return *r;
}

result<void> cuda_storage::vmm_driver_impl::wait(memory::event e) {
  ++s_.gpu_waits_;
  return s_.events_->wait(e);
}

void cuda_storage::vmm_driver_impl::release_event(memory::event e) noexcept { s_.events_->release(e); }

}  // namespace devrt::devices
