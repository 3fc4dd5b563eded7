// The guard of every CUDA test: skip with the reason when no GPU is usable (CI has the toolkit but
// no GPU).
#pragma once

#include <gtest/gtest.h>

#include "devrt/devices/cuda_storage.hpp"

#define DEVRT_REQUIRE_GPU()                                                               \
  do {                                                                                    \
    if (devrt::devices::cuda_device_count() == 0) {                                       \
      GTEST_SKIP() << "CUDA test skipped: " << devrt::devices::cuda_unavailable_reason(); \
    }                                                                                     \
  } while (false)
