// Peer access between CUDA devices: which devices may read and write another device's memory.
//
// The checks here need no GPU (they are the part of peer access that CI can test); the CUDA
// storage applies a checked list with the driver (`cuda_storage::set_peer_access`).
#pragma once

#include <optional>
#include <span>
#include <string>

#include "devrt/memory/error.hpp"

namespace devrt::devices {

/// Checks the peers of `device`: no index is negative, no peer is `device` itself, none is listed
/// twice and, when `device_count` is given, the device and every peer are among the
/// `device_count` devices of the process. Errors: invalid_argument whose text names the pair
/// ("cuda:0 -> cuda:3, 2 device(s)").
result<void> validate_peers(int device, std::span<const int> peers, std::optional<int> device_count);

/// "cuda:<device> -> cuda:<peer>", the way peer-access errors name a pair.
std::string peer_pair(int device, int peer);

}  // namespace devrt::devices
