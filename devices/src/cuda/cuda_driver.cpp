#include "cuda_driver.hpp"

#include <type_traits>

namespace devrt::devices {

const char* driver_profile::name(kind k) noexcept {
  switch (k) {
    case address_reserve: return "cuMemAddressReserve";
    case create: return "cuMemCreate";
    case map: return "cuMemMap";
    case set_access: return "cuMemSetAccess";
    case unmap: return "cuMemUnmap";
    case release: return "cuMemRelease";
    case stream_query: return "cudaStreamQuery";
    case map_total: return "map (whole)";
    case flush_total: return "flush (whole)";
    case kinds: break;
  }
  return "?";
}

namespace cuda_detail {

error cuda_error(cudaError_t e, const char* what) {
  cudaGetLastError();
  error out = error::make(e == cudaErrorMemoryAllocation ? errc::out_of_memory : errc::device_error, what);
  out.text = cudaGetErrorName(e);
  return out;
}

std::shared_ptr<const driver_api> driver_api::load() {
  static const std::shared_ptr<const driver_api> api = [] {
    auto a = std::make_shared<driver_api>();
    bool ok = true;
    auto get = [&](const char* name, auto& fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult q{};
      if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
          q != cudaDriverEntryPointSuccess || p == nullptr) {
        cudaGetLastError();
        ok = false;
        return;
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);  // NOLINT
    };
    get("cuMemAddressReserve", a->address_reserve);
    get("cuMemAddressFree", a->address_free);
    get("cuMemCreate", a->create);
    get("cuMemRelease", a->release);
    get("cuMemMap", a->map);
    get("cuMemUnmap", a->unmap);
    get("cuMemSetAccess", a->set_access);
    get("cuMemGetAccess", a->get_access);
    get("cuMemGetAllocationGranularity", a->granularity);
    get("cuDeviceGetAttribute", a->attribute);
    get("cuGetErrorName", a->error_name);
    return ok ? std::shared_ptr<const driver_api>(std::move(a)) : std::shared_ptr<const driver_api>();
  }();
  return api;
}

error driver_api::fail(CUresult r, const char* what) const {
  error e = error::make(r == CUDA_ERROR_OUT_OF_MEMORY ? errc::out_of_memory : errc::device_error, what);
  const char* name = nullptr;
  if (error_name != nullptr && error_name(r, &name) == CUDA_SUCCESS && name != nullptr) e.text = name;
  return e;
}

CUmemAllocationProp physical_props(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

restore_current_device::restore_current_device() {
  if (cudaGetDevice(&previous) != cudaSuccess) {
    cudaGetLastError();
    previous = -1;
  }
}

restore_current_device::~restore_current_device() {
  if (previous >= 0) cudaSetDevice(previous);
}

}  // namespace cuda_detail
}  // namespace devrt::devices
