// The executable graph of a capture on the device's stream, replayed on that stream.
#pragma once

#include <cuda_runtime_api.h>

#include "devrt/memory/storage.hpp"

namespace devrt::devices::cuda_detail {

class cuda_graph final : public memory::recorded_work {
 public:
  cuda_graph(cudaGraphExec_t exec, cudaStream_t stream, int device) : exec_(exec), stream_(stream), device_(device) {}
  cuda_graph(const cuda_graph&) = delete;
  cuda_graph& operator=(const cuda_graph&) = delete;
  // Destroyed only once its replays are done: the device releases a dropped graph behind an event
  // on its stream, and a storage that goes away drains the device first.
  ~cuda_graph() override;
  result<void> launch() override;
  result<void> wait() override;

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  int device_;
};

}  // namespace devrt::devices::cuda_detail
