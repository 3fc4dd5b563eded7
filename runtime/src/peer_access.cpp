#include "devrt/runtime/peer_access.hpp"

#include <string>

#ifdef DEVRT_WITH_CUDA
#include "devrt/devices/cuda_storage.hpp"
#endif

namespace devrt::runtime::detail {

result<void> apply_peer_access(actor_core& c, const std::vector<int>& peers) {
  const device_info& d = c.info();
  if (d.kind != device_kind::cuda) {
    error e = error::make(errc::unsupported,
                          d.kind == device_kind::host
                              ? "peer access is for CUDA devices: host memory is the process's, reachable from every "
                                "thread already (give a GPU access to host memory by pinning it, outside devrt)"
                              : "peer access is for CUDA devices: the sim device has no memory to share");
    e.text = std::string(to_string(d.kind)) + ":" + std::to_string(d.index);
    return e;
  }
#ifdef DEVRT_WITH_CUDA
  devices::cuda_storage* cuda = c.manager().backing_storage().backend<devices::cuda_storage>();
  if (cuda == nullptr) return error::make(errc::unsupported, "a CUDA device without CUDA storage");
  return cuda->set_peer_access(peers);
#else
  (void)peers;
  return error::make(errc::unsupported, "a CUDA device in a build without CUDA");
#endif
}

}  // namespace devrt::runtime::detail
