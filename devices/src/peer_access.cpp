#include "devrt/devices/peer_access.hpp"

#include <algorithm>

namespace devrt::devices {

std::string peer_pair(int device, int peer) {
  return "cuda:" + std::to_string(device) + " -> cuda:" + std::to_string(peer);
}

result<void> validate_peers(int device, std::span<const int> peers, std::optional<int> device_count) {
  const std::string count = device_count ? ", " + std::to_string(*device_count) + " device(s)" : std::string();
  if (device < 0 || (device_count && device >= *device_count)) {
    error e = error::make(errc::invalid_argument,
                          device < 0 ? "a CUDA device index is not negative"
                                     : "the device whose memory is shared is not a device of this process "
                                       "(CUDA_VISIBLE_DEVICES applies)");
    e.text = "cuda:" + std::to_string(device) + count;
    return e;
  }
  for (std::size_t i = 0; i < peers.size(); ++i) {
    const int p = peers[i];
    auto fail = [&](const char* why, const std::string& more) {
      error e = error::make(errc::invalid_argument, why);
      e.text = peer_pair(device, p) + more;
      return e;
    };
    if (p == device) {
      return fail("a device is not its own peer: it always reaches its own memory; list other devices only", "");
    }
    if (p < 0) return fail("a CUDA device index is not negative", "");
    if (device_count && p >= *device_count) {
      return fail(
          "the peer is not a device of this process; list devices the CUDA runtime shows (CUDA_VISIBLE_DEVICES "
          "applies)",
          count);
    }
    if (std::find(peers.begin(), peers.begin() + static_cast<std::ptrdiff_t>(i), p) !=
        peers.begin() + static_cast<std::ptrdiff_t>(i)) {
      return fail("a peer is listed twice", "");
    }
  }
  return {};
}

}  // namespace devrt::devices
