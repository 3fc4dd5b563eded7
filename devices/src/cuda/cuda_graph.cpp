#include "cuda_graph.hpp"

#include "cuda_driver.hpp"

namespace devrt::devices::cuda_detail {

cuda_graph::~cuda_graph() {
  const restore_current_device restore;
  cudaSetDevice(device_);
  cudaGraphExecDestroy(exec_);
}

result<void> cuda_graph::launch() {
  cudaSetDevice(device_);
  if (auto e = cudaGraphLaunch(exec_, stream_); e != cudaSuccess) return cuda_error(e, "cudaGraphLaunch failed");
  return {};
}

result<void> cuda_graph::wait() {
  cudaSetDevice(device_);
  if (auto e = cudaStreamSynchronize(stream_); e != cudaSuccess) return cuda_error(e, "cudaStreamSynchronize failed");
  return {};
}

}  // namespace devrt::devices::cuda_detail
