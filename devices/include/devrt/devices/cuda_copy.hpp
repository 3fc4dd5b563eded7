// Copies between the memory of CUDA devices, and the events that order them on streams of two
// devices.
//
// An event of a storage's own pool (its events) belongs to that storage's owner thread; a copy
// between two devices is ordered from the strands of both, so its events are created for it and
// shared instead (about a microsecond each, never on the reserve path). Destroying an event whose
// work is still queued is allowed: the driver frees it once it has completed.
//
// Threading: any thread; each call binds the calling thread to the device it names.
#pragma once

#include <cstdint>
#include <memory>

#include "devrt/memory/error.hpp"

namespace devrt::devices {

/// A new event recorded behind the work queued so far on `stream` (a cudaStream_t of `device`);
/// destroyed when the last copy of the pointer goes. Error device_error.
result<std::shared_ptr<void>> cuda_record_cross_event(int device, void* stream);
/// Later work on `stream` (a stream of `device`) waits for `event`, which may belong to another
/// device (cudaStreamWaitEvent). Never blocks the host. Error device_error.
result<void> cuda_wait_cross_event(int device, void* stream, const std::shared_ptr<void>& event);
/// Enqueues a copy of `bytes` from `src` (memory of `src_device`) to `dst` (memory of
/// `dst_device`) on `stream`, a stream of `dst_device`: cudaMemcpyAsync within a device,
/// cudaMemcpyPeerAsync between two. Error device_error.
result<void> cuda_copy_async(int dst_device, void* dst, int src_device, const void* src, std::uint64_t bytes,
                             void* stream);

}  // namespace devrt::devices
