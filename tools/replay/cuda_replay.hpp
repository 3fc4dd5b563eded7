// Internal to the replay engine: its CUDA parts, compiled for real with DEVRT_REPLAY_CUDA and as
// stubs that answer "built without CUDA" otherwise.
#pragma once

#include "devrt/memory/error.hpp"
#include "devrt/memory/storage.hpp"
#include "replay/replay.hpp"
#include "replay/trace.hpp"

namespace devrt::replay::detail {

/// devices::cuda_storage(device), type-erased. Error device_error whose `text` says what failed
/// and names the CUDA error.
result<memory::storage> make_cuda_storage(int device);

/// When `store` is a CUDA storage: its physical allocations and driver profile into `r`
/// (driver_measured); nothing otherwise.
void note_driver_profile(memory::storage& store, replay_result& r);

/// Replays `t` against the CUDA runtime directly (`o.baseline` must be set). See baseline_kind.
result<replay_result> replay_baseline(const trace& t, const replay_options& o);

/// ns/event, events/s and the ratio from the other figures.
void finish_rates(replay_result& r);

/// error device_error with `text` = what.
error cuda_replay_error(std::string what);

}  // namespace devrt::replay::detail
