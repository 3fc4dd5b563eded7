// Peer access: letting kernels and copies of other GPUs read and write a GPU's devrt memory.
//
//     runtime_options o;
//     o.peer_access = {{0, {1}}};                 // cuda:1 reaches cuda:0's memory, from the start
//     ...
//     devrt::runtime::set_peer_access(rt.cuda(1), {0}).get();   // and cuda:0 reaches cuda:1's, later
//
// On CUDA every mapping of the device's arena, present and future, gets one access descriptor per
// device (cuMemSetAccess: the device and each peer), and the memory pool that cudaMallocAsync
// pages come from gets the same access (cudaMemPoolSetAccess on the device's current pool; that
// pool is the process's, so other users of it see the access too). cudaDeviceEnablePeerAccess is
// not needed for either and devrt does not call it. Host and sim devices have no peers: their
// memory is the process's (host) or none (sim), so asking is an `unsupported` error rather than
// a silent no-op that would let a program believe a GPU was given access.
#pragma once

#include <utility>
#include <vector>

#include "devrt/runtime/compute_client.hpp"

namespace devrt::runtime {

namespace detail {
/// On the device's strand: applies the list to the device's storage.
result<void> apply_peer_access(actor_core& c, const std::vector<int>& peers);
}  // namespace detail

/// Makes the memory of `device` readable and writable from the CUDA devices `peers` (indices as
/// the CUDA runtime numbers them), replacing the previous list: a device left out loses access.
/// Ordered with this thread's other messages to the device. Errors: invalid_argument (a peer
/// that is not a device, the device itself, a peer listed twice; the message names both),
/// unsupported (no peer path between the two GPUs, a peer without virtual memory management while
/// the arena is in use, a host or sim device), device_error.
template <class Token = compute_client::default_token>
auto set_peer_access(const compute_client& device, std::vector<int> peers, Token&& token = {}) {
  return device.async_run<void>([p = std::move(peers)](actor_core& c) { return detail::apply_peer_access(c, p); },
                                std::forward<Token>(token));
}

}  // namespace devrt::runtime
