#include "devrt/devices/cuda_copy.hpp"

#include <cuda_runtime_api.h>

#include <string>

namespace devrt::devices {

namespace {

error failed(cudaError_t e, const char* what, int device) {
  cudaGetLastError();  // leave no error behind for the next call on this thread
  error out = error::make(errc::device_error, what);
  out.text = std::string(cudaGetErrorName(e)) + " on cuda:" + std::to_string(device);
  return out;
}

}  // namespace

result<std::shared_ptr<void>> cuda_record_cross_event(int device, void* stream) {
  if (auto e = cudaSetDevice(device); e != cudaSuccess) return failed(e, "cudaSetDevice failed", device);
  cudaEvent_t ev = nullptr;
  if (auto e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess) {
    return failed(e, "cudaEventCreateWithFlags failed", device);
  }
  std::shared_ptr<void> out(static_cast<void*>(ev), [](void* p) { cudaEventDestroy(static_cast<cudaEvent_t>(p)); });
  if (auto e = cudaEventRecord(ev, static_cast<cudaStream_t>(stream)); e != cudaSuccess) {
    return failed(e, "cudaEventRecord failed (a stream destroyed while devrt memory was in use on it?)", device);
  }
  return out;
}

result<void> cuda_wait_cross_event(int device, void* stream, const std::shared_ptr<void>& event) {
  if (!event) return {};
  if (auto e = cudaSetDevice(device); e != cudaSuccess) return failed(e, "cudaSetDevice failed", device);
  if (auto e = cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event.get()), 0);
      e != cudaSuccess) {
    return failed(e, "cudaStreamWaitEvent failed", device);
  }
  return {};
}

result<void> cuda_copy_async(int dst_device, void* dst, int src_device, const void* src, std::uint64_t bytes,
                             void* stream) {
  if (bytes == 0) return {};
  if (auto e = cudaSetDevice(dst_device); e != cudaSuccess) return failed(e, "cudaSetDevice failed", dst_device);
  auto s = static_cast<cudaStream_t>(stream);
  const cudaError_t e = src_device == dst_device ? cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s)
                                                 : cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, s);
  if (e != cudaSuccess) {
    return failed(e,
                  src_device == dst_device ? "cudaMemcpyAsync (device to device) failed" : "cudaMemcpyPeerAsync failed",
                  dst_device);
  }
  return {};
}

}  // namespace devrt::devices
