// Peer access: which devices may read and write this device's memory, for every mapping of its
// address ranges and for the pool its pages come from.
#include <algorithm>

#include "../vmm.hpp"
#include "cuda_driver.hpp"
#include "devrt/devices/cuda_storage.hpp"
#include "devrt/devices/peer_access.hpp"

namespace devrt::devices {

using cuda_detail::cuda_error;
using cuda_detail::restore_current_device;
using cuda_detail::timed_call;

bool cuda_storage::mapped(const memory::storage_handle& h) const noexcept { return vmm_ && vmm_->has_range(h.id); }

result<void> cuda_storage::set_mapping_access(std::uint64_t at, std::uint64_t size,
                                              const std::vector<int>& revoked) const {
  std::vector<CUmemAccessDesc> access(1 + peers_.size() + revoked.size());
  auto set = [&](std::size_t i, int device, CUmemAccess_flags flags) {
    access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[i].location.id = device;
    access[i].flags = flags;
  };
  set(0, device_, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  for (std::size_t i = 0; i < peers_.size(); ++i) set(1 + i, peers_[i], CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  for (std::size_t i = 0; i < revoked.size(); ++i)
    set(1 + peers_.size() + i, revoked[i], CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CUresult granted = CUDA_SUCCESS;
  {
    const timed_call timer(profile_, driver_profile::set_access);
    granted = api_->set_access(at, size, access.data(), access.size());
  }
  if (CUresult r = granted; r != CUDA_SUCCESS) {
    error e = api_->fail(r, "cuMemSetAccess failed (access for the device and its peers)");
    e.detail = "cuMemSetAccess";
    return e;
  }
  return {};
}

result<void> cuda_storage::set_peer_access(std::vector<int> peers) {
  if (auto v = validate_peers(device_, peers, cuda_device_count()); !v) return v;
  // The runtime applies its options from the thread that first asks for the device.
  const restore_current_device restore;
  if (auto b = bind_device(); !b) return b;
  for (const int p : peers) {
    // Kernels and copy engines of `p` read this device's memory: can p reach it?
    int can = 0;
    if (auto e = cudaDeviceCanAccessPeer(&can, p, device_); e != cudaSuccess) {
      cudaGetLastError();
      error err = cuda_error(e, "cudaDeviceCanAccessPeer failed");
      err.code = errc::device_error;
      err.text = peer_pair(device_, p) + ": " + err.text;
      return err;
    }
    if (can == 0) {
      error e = error::make(errc::unsupported,
                            "the peer cannot reach this device's memory (no NVLink or PCIe peer-to-peer path, "
                            "cudaDeviceCanAccessPeer); copy between them with devrt::runtime::copy instead");
      e.text = peer_pair(device_, p);
      return e;
    }
    int has_vmm = 0;
    if (api_ &&
        (api_->attribute(&has_vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, p) != CUDA_SUCCESS ||
         has_vmm == 0)) {
      error e = error::make(errc::unsupported,
                            "the peer has no virtual memory management, so it cannot be given access to this "
                            "device's mapped (arena) memory; use a layout without an arena on this device");
      e.text = peer_pair(device_, p);
      return e;
    }
  }
  std::vector<int> revoked;
  for (const int p : peers_) {
    if (std::find(peers.begin(), peers.end(), p) == peers.end()) revoked.push_back(p);
  }
  peers_ = std::move(peers);
  // The pool behind cudaMallocAsync: its pages, present and future, follow the pool's access.
  cudaMemPool_t pool = nullptr;
  if (auto e = cudaDeviceGetMemPool(&pool, device_); e != cudaSuccess) {
    cudaGetLastError();
    return cuda_error(e, "cudaDeviceGetMemPool failed");
  }
  std::vector<cudaMemAccessDesc> pool_access;
  for (const int p : peers_) {
    pool_access.push_back(cudaMemAccessDesc{{cudaMemLocationTypeDevice, p}, cudaMemAccessFlagsProtReadWrite});
  }
  for (const int p : revoked) {
    pool_access.push_back(cudaMemAccessDesc{{cudaMemLocationTypeDevice, p}, cudaMemAccessFlagsProtNone});
  }
  if (!pool_access.empty()) {
    if (auto e = cudaMemPoolSetAccess(pool, pool_access.data(), pool_access.size()); e != cudaSuccess) {
      cudaGetLastError();
      return cuda_error(e, "cudaMemPoolSetAccess failed");
    }
  }
  // Every mapping still there (unmaps not done yet included: a mapping can be revived).
  if (!vmm_) return {};
  return vmm_->for_each_mapping(
      [&](std::uint64_t at, std::uint64_t bytes) { return set_mapping_access(at, bytes, revoked); });
}

result<bool> cuda_storage::mapped_access(const void* ptr, int peer) const {
  if (!api_ || api_->get_access == nullptr) {
    return error::make(errc::unsupported, "the driver offers no virtual memory management on this GPU");
  }
  CUmemLocation where{};
  where.type = CU_MEM_LOCATION_TYPE_DEVICE;
  where.id = peer;
  unsigned long long flags = 0;  // NOLINT(google-runtime-int): the driver's type
  if (CUresult r = api_->get_access(&flags, &where, reinterpret_cast<std::uintptr_t>(ptr));
      r != CUDA_SUCCESS) {  // NOLINT
    return api_->fail(r, "cuMemGetAccess failed (is the pointer in a mapped range of this device?)");
  }
  return flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

}  // namespace devrt::devices
