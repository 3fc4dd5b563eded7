// Copies between allocations of two devices (or of one), ordered on the streams of both.
//
//     auto a = rt.cuda(0), b = rt.cuda(1);
//     auto x = a.reserve(n).get(), y = b.reserve(n).get();
//     devrt::runtime::copy(a, x, b, y).get();   // enqueued on y's stream, after x's stream's work
//
// Order: the copy reads the source after the work queued on the source allocation's stream
// before the call (and the messages this thread posted to the source device before it); it runs
// on the destination allocation's stream, so work queued there later waits for it; and the
// source's stream is made to wait for it too, so later work there cannot overwrite the source
// while it is read. Work queued on either allocation before the copy has completed (the
// completion below) is not ordered with it.
//
// Completion: when the copy is enqueued (CUDA) or done (host), with error_code first, through the
// usual tokens. Neither memory is reused before the copy is done: the copy holds both until
// then, and stream order on the two allocations' streams covers them afterwards. To wait for the
// bytes themselves, `synchronize` the destination's stream (or `read` it).
//
// Devices: CUDA to CUDA (the same GPU: cudaMemcpyAsync; two GPUs: cudaMemcpyPeerAsync, with
// events created for the copy ordering the two devices' streams) and host to host (memcpy on the
// strand). Between two GPUs, when the source is arena memory (mapped, the default layout) the
// destination device needs peer access to it (`runtime_options::peer_access`, `set_peer_access`),
// or the copy is refused with `unsupported`. Host and CUDA memory are copied with `write`/`read`;
// the sim device has no bytes. Errors: unsupported (those pairs), invalid_argument (sizes differ:
// both are in the message), not_found (a handle of neither device), shutdown, device_error.
#pragma once

#include <memory>
#include <utility>

#include "devrt/runtime/compute_client.hpp"

namespace devrt::runtime {

namespace detail {

/// What the source's strand hands to the destination's for a copy between two actors.
struct copy_source {
  memory::resource resource;  ///< the source bytes
  device_kind kind = device_kind::host;
  int device = 0;  ///< the source's device index
  memory::stream_id stream = memory::streams::device;
  std::shared_ptr<void> ready;  ///< CUDA: an event behind the source stream's work before the copy
};

/// Caller side: unsupported for pairs of devices that `copy` does not serve.
result<void> copy_check_devices(const device_info& src, const device_info& dst);
/// Both allocations on one device: the whole copy, on its strand.
result<void> copy_local(actor_core& c, const memory_binding& src, const memory_binding& dst);
/// Two devices, step 1 on the source's strand.
result<copy_source> copy_prepare_source(actor_core& c, const memory_binding& src, const device_info& dst);
/// Step 2 on the destination's strand: enqueues the copy; returns an event behind it (CUDA) for
/// the source's stream to wait on.
result<std::shared_ptr<void>> copy_into(actor_core& c, const copy_source& src, const memory_binding& dst);
/// Step 3 on the source's strand: the source's stream waits for the copy.
result<void> copy_finish_source(actor_core& c, const copy_source& src, const std::shared_ptr<void>& done);

}  // namespace detail

/// Copies the whole allocation `src` of `src_device` into `dst` of `dst_device` (the same size);
/// see the file comment for the order, the completion and the devices served.
template <class Token = compute_client::default_token>
auto copy(const compute_client& src_device, const memory_handle& src, const compute_client& dst_device,
          const memory_handle& dst, Token&& token = {}) {
  if (auto k = detail::copy_check_devices(src_device.device(), dst_device.device()); !k) {
    return src_device.async_fail<void>(std::move(k).err(), std::forward<Token>(token));
  }
  if (src_device.actor() == dst_device.actor()) {
    return src_device.async_run<void>(
        [s = src.binding(), d = dst.binding()](actor_core& c) { return detail::copy_local(c, s, d); },
        std::forward<Token>(token));
  }
  // Source strand, then destination strand, then the source's again, where the operation
  // completes; the bindings keep both memories until then. A step whose device has stopped
  // completes the copy with the shutdown error.
  return src_device.async_run_raw<void>(
      [s = src.binding(), d = dst.binding(), a = src_device.actor(), b = dst_device.actor()](actor_core& core,
                                                                                             auto finish) mutable {
        auto prepared = detail::copy_prepare_source(core, s, b->info());
        if (!prepared) {
          finish(result<void>(std::move(prepared).err()));
          return;
        }
        b->post(message([s = std::move(s), d = std::move(d), a = std::move(a), f = std::move(finish),
                         p = std::move(*prepared)](actor_core* bc, const error* be) mutable {
          result<std::shared_ptr<void>> done =
              bc != nullptr ? detail::copy_into(*bc, p, d) : result<std::shared_ptr<void>>(*be);
          d.reset();
          a->post(message([s = std::move(s), f = std::move(f), p = std::move(p), done = std::move(done)](
                              actor_core* ac, const error* ae) mutable {
            if (!done) {
              f(result<void>(std::move(done).err()));
            } else if (ac == nullptr) {
              f(result<void>(*ae));
            } else {
              f(detail::copy_finish_source(*ac, p, *done));
            }
            s.reset();
          }));
        }));
      },
      std::forward<Token>(token));
}

}  // namespace devrt::runtime
