#include "devrt/runtime/copy.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#ifdef DEVRT_WITH_CUDA
#include "devrt/devices/cuda_copy.hpp"
#include "devrt/devices/cuda_storage.hpp"
#endif

namespace devrt::runtime::detail {

namespace {

std::string name_of(const device_info& d) { return std::string(to_string(d.kind)) + ":" + std::to_string(d.index); }

error sizes_differ(std::uint64_t src, std::uint64_t dst) {
  error e = error::make(errc::invalid_argument, "a copy needs allocations of the same size");
  e.text = "source " + std::to_string(src) + " bytes, destination " + std::to_string(dst) + " bytes";
  return e;
}

#ifdef DEVRT_WITH_CUDA
devices::cuda_storage* cuda_of(actor_core& c) { return c.manager().backing_storage().backend<devices::cuda_storage>(); }
#endif

}  // namespace

result<void> copy_check_devices(const device_info& src, const device_info& dst) {
  auto refuse = [&](const char* why) {
    error e = error::make(errc::unsupported, why);
    e.text = name_of(src) + " -> " + name_of(dst);
    return e;
  };
  if (src.kind == device_kind::sim || dst.kind == device_kind::sim) {
    return refuse("the sim device has no bytes to copy (ids and sizes only)");
  }
  if (src.kind != dst.kind) {
    return refuse("copy serves CUDA to CUDA and host to host; between host and CUDA memory use write and read");
  }
  return {};
}

result<void> copy_local(actor_core& c, const memory_binding& src, const memory_binding& dst) {
  auto s = c.get_resource(src);
  if (!s) return std::move(s).err();
  auto d = c.get_resource(dst);
  if (!d) return std::move(d).err();
  if (s->size != d->size) return sizes_differ(s->size, d->size);
  auto& store = c.manager().backing_storage();
  if (!store.ordered()) {
    // Host memory: the device's work is done when the call that does it returns.
    if (s->size != 0 && s->ptr != d->ptr) std::memmove(d->ptr, s->ptr, s->size);
    return {};
  }
#ifdef DEVRT_WITH_CUDA
  devices::cuda_storage* cuda = cuda_of(c);
  if (cuda == nullptr) return error::make(errc::unsupported, "copy on a device with queues that is not a CUDA GPU");
  const memory::stream_id qs = src.raw()->stream;
  const memory::stream_id qd = dst.raw()->stream;
  // The destination's stream waits for the source stream's work, then copies; the source's memory
  // is not reused before the copy stream passed it; the source's stream waits for the copy.
  if (qs != qd) {
    auto t = store.record_event(qs);
    if (!t) return std::move(t).err();
    auto j = store.stream_wait_event(qd, *t);
    store.release_event(*t);
    if (!j) return j;
  }
  if (auto r = devices::cuda_copy_async(cuda->device(), d->ptr, cuda->device(), s->ptr, s->size, cuda->stream_of(qd));
      !r) {
    return r;
  }
  if (auto r = c.manager().record_stream(src, qd); !r) return r;
  if (qs != qd) {
    auto t = store.record_event(qd);
    if (!t) return std::move(t).err();
    auto j = store.stream_wait_event(qs, *t);
    store.release_event(*t);
    if (!j) return j;
  }
  return {};
#else
  return error::make(errc::unsupported, "copy on a device with queues in a build without CUDA");
#endif
}

result<copy_source> copy_prepare_source(actor_core& c, const memory_binding& src, const device_info& dst) {
  auto s = c.get_resource(src);
  if (!s) return std::move(s).err();
  copy_source out;
  out.resource = *s;
  out.kind = c.info().kind;
  out.device = c.info().index;
  out.stream = src.raw()->stream;
  if (c.info().kind != device_kind::cuda) return out;
#ifdef DEVRT_WITH_CUDA
  devices::cuda_storage* cuda = cuda_of(c);
  if (cuda == nullptr) return error::make(errc::unsupported, "a CUDA device without CUDA storage");
  const auto& peers = cuda->peers();
  if (cuda->mapped(s->handle) && std::find(peers.begin(), peers.end(), dst.index) == peers.end()) {
    error e = error::make(errc::unsupported,
                          "the source is arena memory (mapped), which the destination GPU reaches only with peer "
                          "access: give it access first (runtime_options::peer_access, set_peer_access)");
    e.text = "cuda:" + std::to_string(dst.index) + " reading cuda:" + std::to_string(out.device) +
             "; peer_access = {{" + std::to_string(out.device) + ", {" + std::to_string(dst.index) + "}}}";
    return e;
  }
  auto ready = devices::cuda_record_cross_event(cuda->device(), cuda->stream_of(out.stream));
  if (!ready) return std::move(ready).err();
  out.ready = std::move(*ready);
  return out;
#else
  (void)dst;
  return error::make(errc::unsupported, "a CUDA device in a build without CUDA");
#endif
}

result<std::shared_ptr<void>> copy_into(actor_core& c, const copy_source& src, const memory_binding& dst) {
  auto d = c.get_resource(dst);
  if (!d) return std::move(d).err();
  if (d->size != src.resource.size) return sizes_differ(src.resource.size, d->size);
  if (c.info().kind != device_kind::cuda) {
    // Host memory of another actor: the source strand resolved it and the binding keeps it; its
    // bytes were written before the source step ran (that step's post orders them before this).
    if (d->size != 0) std::memmove(d->ptr, src.resource.ptr, d->size);
    return std::shared_ptr<void>();
  }
#ifdef DEVRT_WITH_CUDA
  devices::cuda_storage* cuda = cuda_of(c);
  if (cuda == nullptr) return error::make(errc::unsupported, "a CUDA device without CUDA storage");
  void* stream = cuda->stream_of(dst.raw()->stream);
  if (auto w = devices::cuda_wait_cross_event(cuda->device(), stream, src.ready); !w) return std::move(w).err();
  if (auto r = devices::cuda_copy_async(cuda->device(), d->ptr, src.device, src.resource.ptr, d->size, stream); !r) {
    return std::move(r).err();
  }
  return devices::cuda_record_cross_event(cuda->device(), stream);
#else
  return error::make(errc::unsupported, "a CUDA device in a build without CUDA");
#endif
}

result<void> copy_finish_source(actor_core& c, const copy_source& src, const std::shared_ptr<void>& done) {
  if (!done) return {};
#ifdef DEVRT_WITH_CUDA
  devices::cuda_storage* cuda = cuda_of(c);
  if (cuda == nullptr) return {};
  return devices::cuda_wait_cross_event(cuda->device(), cuda->stream_of(src.stream), done);
#else
  (void)c;
  (void)src;
  return {};
#endif
}

}  // namespace devrt::runtime::detail
