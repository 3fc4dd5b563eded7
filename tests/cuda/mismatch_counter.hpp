// A counter of mismatching words in device memory, which the check kernels add to.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

struct mismatch_counter {
  unsigned int* d = nullptr;
  mismatch_counter() {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&d), sizeof(unsigned int)), cudaSuccess);  // NOLINT
    EXPECT_EQ(cudaMemset(d, 0, sizeof(unsigned int)), cudaSuccess);
  }
  mismatch_counter(const mismatch_counter&) = delete;
  mismatch_counter& operator=(const mismatch_counter&) = delete;
  ~mismatch_counter() { cudaFree(d); }
  /// The count, once the whole device has finished.
  unsigned int value() const {
    unsigned int v = 0;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(&v, d, sizeof v, cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};
