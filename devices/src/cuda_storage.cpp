// The CUDA storage: the composition of the mechanisms under cuda/ (see cuda_storage.hpp).
#include "devrt/devices/cuda_storage.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_driver.hpp"
#include "cuda/cuda_events.hpp"
#include "cuda/cuda_graph.hpp"
#include "cuda/cuda_staging.hpp"
#include "cuda/cuda_vmm_driver.hpp"
#include "vmm.hpp"

namespace devrt::devices {

using cuda_detail::as_event;
using cuda_detail::as_stream;
using cuda_detail::cuda_error;
using cuda_detail::restore_current_device;
using cuda_detail::timed_call;

int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA device: cudaGetDeviceCount returned ") + cudaGetErrorName(e) + " (" +
           cudaGetErrorString(e) + ")";
  }
  return n == 0 ? "no CUDA device is present" : "";
}

cuda_storage::cuda_storage(int device) : device_(device), name_("cuda:" + std::to_string(device)) {
  // The storage is created on the caller's thread (the runtime creates a device on its first use):
  // leave that thread's current device as it was, failure or not.
  const restore_current_device restore;
  auto fail = [&](cudaError_t e, const char* what) {
    error err = cuda_error(e, what);
    err.code = errc::device_error;
    throw exception(err);
  };
  if (auto e = cudaSetDevice(device_); e != cudaSuccess) fail(e, "cudaSetDevice failed");
  cudaDeviceProp prop{};
  if (auto e = cudaGetDeviceProperties(&prop, device_); e != cudaSuccess) fail(e, "cudaGetDeviceProperties failed");
  props_.capacity = prop.totalGlobalMem;
  // Slices are offset by multiples of the texture alignment (512 bytes on current GPUs), which
  // every kernel argument and vectorized access accepts.
  props_.alignment = prop.textureAlignment > 0 ? prop.textureAlignment : 512;
  props_.max_page_size = prop.totalGlobalMem / 4 / props_.alignment * props_.alignment;
  name_ += std::string(" (") + prop.name + ")";
  cudaStream_t s = nullptr;
  if (auto e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
    fail(e, "cudaStreamCreateWithFlags failed");
  }
  stream_ = s;
  events_ = std::make_unique<cuda_detail::event_table>(device_);
  staging_ = std::make_unique<cuda_detail::staging_pool>();
  // Address ranges where the driver offers virtual memory management.
  api_ = cuda_detail::driver_api::load();
  if (!api_) return;
  int supported = 0;
  if (api_->attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device_) != CUDA_SUCCESS ||
      supported == 0) {
    api_.reset();
    return;
  }
  const CUmemAllocationProp physical = cuda_detail::physical_props(device_);
  std::size_t granularity = 0;
  if (api_->granularity(&granularity, &physical, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS ||
      granularity == 0) {
    api_.reset();
    return;
  }
  props_.map_granularity = granularity;
  vmm_driver_ = std::make_unique<vmm_driver_impl>(*this);
  vmm_ = std::make_unique<vmm>(*vmm_driver_, granularity);
}

cuda_storage::~cuda_storage() {
  const restore_current_device restore;
  cudaSetDevice(device_);
  for (auto& [id, p] : pages_) cudaFreeAsync(p.ptr, as_stream(stream_));
  // Teardown is the one place that waits: every stream's work on the memory, that of streams
  // destroyed already included, is done after this.
  cudaDeviceSynchronize();
  cudaGetLastError();
  if (vmm_) vmm_->teardown();
  vmm_.reset();
  staging_.reset();
  events_.reset();
  cudaStreamDestroy(as_stream(stream_));
}

result<void> cuda_storage::bind_device() const {
  if (auto e = cudaSetDevice(device_); e != cudaSuccess) return cuda_error(e, "cudaSetDevice failed");
  return {};
}

result<void> cuda_storage::refuse_in_capture(memory::stream_id q, const char* what) const {
  if (!capturing_ || stream_of(q) != stream_) return {};
  error e = error::make(errc::capture_active,
                        "the device's stream records a capture: the copy would become part of the graph; copy before "
                        "capture_begin or after capture_end");
  e.text = what;
  return e;
}

// ---- Pages ----

result<memory::storage_handle> cuda_storage::alloc(std::uint64_t size) {
  if (capturing_) {
    error e = error::make(errc::capture_active,
                          "a driver allocation was needed inside a graph capture; reserve the memory the graph uses "
                          "once before capture_begin so the persistent pool holds it");
    e.size = size;
    return e;
  }
  if (auto r = bind_device(); !r) return std::move(r).err();
  void* ptr = nullptr;
  const cudaError_t e = cudaMallocAsync(&ptr, size == 0 ? 1 : size, as_stream(stream_));
  if (e != cudaSuccess) {
    error err = cuda_error(e, "cudaMallocAsync failed");
    err.size = size;
    err.in_use = allocated_;
    err.limit = props_.capacity;
    err.detail = cudaGetErrorName(e);
    return err;
  }
  const memory::storage_id id = next_id_++;
  pages_.emplace(id, page{ptr, size});
  allocated_ += size;
  ++driver_allocs_;
  return memory::storage_handle{id, 0, size};
}

void cuda_storage::dealloc(memory::storage_id id) { pending_.push_back(id); }

std::uint64_t cuda_storage::returning_bytes() const noexcept {
  std::uint64_t n = vmm_ ? vmm_->returning_bytes() : 0;
  for (const memory::storage_id id : pending_) {
    if (auto it = pages_.find(id); it != pages_.end()) n += it->second.size;
  }
  return n;
}

std::optional<std::uint64_t> cuda_storage::device_free() {
  // The device is current on the thread serving the actor (its own, or a caller's borrowed one).
  std::size_t free_bytes = 0;
  std::size_t total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
    (void)cudaGetLastError();
    return std::nullopt;
  }
  return free_bytes;
}

std::size_t cuda_storage::pending_deallocations() const noexcept {
  return pending_.size() + (vmm_ ? vmm_->pending() : 0);
}

std::size_t cuda_storage::unmaps_in_flight() const noexcept { return vmm_ ? vmm_->unmaps_in_flight() : 0; }

result<void> cuda_storage::flush() {
  if (pending_deallocations() == 0) return {};
  const timed_call timer(profile_, driver_profile::flush_total);
  if (auto r = bind_device(); !r) return r;
  staging_->recycle(*events_);
  // Nothing reaches the driver from inside a capture: it would be recorded into the graph and
  // run again at every replay. The queue is kept for the first flush after the capture.
  if (capturing_) return {};
  if (vmm_) {
    if (auto u = vmm_->flush(); !u) return u;
  }
  if (pending_.empty()) return {};
  // Behind the device's stream, after it waited for the streams returns wait for.
  if (auto j = wait_for_return_streams(); !j) return j;
  result<void> out;
  for (const memory::storage_id id : pending_) {
    auto it = pages_.find(id);
    if (it == pages_.end()) continue;
    // Stream-ordered: work already enqueued that reads the page finishes first.
    if (auto e = cudaFreeAsync(it->second.ptr, as_stream(stream_)); e != cudaSuccess && out) {
      out = cuda_error(e, "cudaFreeAsync failed");
    }
    allocated_ -= it->second.size;
    ++driver_frees_;
    pages_.erase(it);
  }
  pending_.clear();
  return out;
}

result<void> cuda_storage::settle() {
  if (!vmm_ || capturing_) return {};
  const timed_call timer(profile_, driver_profile::flush_total);
  if (auto r = bind_device(); !r) return r;
  return vmm_->settle();
}

result<memory::resource> cuda_storage::get(const memory::storage_handle& h) {
  if (vmm_ && vmm_->has_range(h.id)) {
    const std::uint64_t size = vmm_->range_size(h.id);
    if (h.offset > size || h.size > size - h.offset) {
      error e = error::make(errc::invalid_argument, "the view ends past its CUDA address range");
      e.size = h.offset + h.size;
      e.limit = size;
      return e;
    }
    return memory::resource{reinterpret_cast<void*>(vmm_->base(h.id) + h.offset), h.size, h};  // NOLINT
  }
  auto it = pages_.find(h.id);
  if (it == pages_.end()) return error::make(errc::not_found, "the CUDA page does not exist");
  if (h.offset > it->second.size || h.size > it->second.size - h.offset) {
    error e = error::make(errc::invalid_argument, "the view ends past its CUDA page");
    e.size = h.offset + h.size;
    e.limit = it->second.size;
    return e;
  }
  return memory::resource{static_cast<std::byte*>(it->second.ptr) + h.offset, h.size, h};
}

// ---- Copies ----

result<void> cuda_storage::write(const memory::storage_handle& h, const void* src) {
  return write_on(h, src, memory::streams::device);
}

result<void> cuda_storage::read(const memory::storage_handle& h, void* dst) {
  if (auto c = refuse_in_capture(memory::streams::device, "read"); !c) return c;
  auto r = get(h);
  if (!r) return std::move(r).err();
  if (auto b = bind_device(); !b) return b;
  if (h.size == 0) return {};
  if (auto e = cudaMemcpyAsync(dst, r->ptr, h.size, cudaMemcpyDeviceToHost, as_stream(stream_)); e != cudaSuccess) {
    return cuda_error(e, "cudaMemcpyAsync (device to host) failed");
  }
  if (auto e = cudaStreamSynchronize(as_stream(stream_)); e != cudaSuccess) {
    return cuda_error(e, "cudaStreamSynchronize failed");
  }
  return {};
}

result<void> cuda_storage::write_on(const memory::storage_handle& h, const void* src, memory::stream_id q) {
  if (auto c = refuse_in_capture(q, "write"); !c) return c;
  auto r = get(h);
  if (!r) return std::move(r).err();
  if (auto b = bind_device(); !b) return b;
  if (h.size == 0) return {};
  cudaStream_t s = as_stream(stream_of(q));
  if (h.size > cuda_detail::staging_pool::max_staged) {
    // Too large to stage: from pageable memory the driver stages it itself and may wait for the
    // stream meanwhile.
    if (auto e = cudaMemcpyAsync(r->ptr, src, h.size, cudaMemcpyHostToDevice, s); e != cudaSuccess) {
      return cuda_error(e, "cudaMemcpyAsync (host to device) failed");
    }
    return {};
  }
  auto buf = staging_->take(h.size, *events_);
  if (!buf) return std::move(buf).err();
  std::memcpy(buf->ptr, src, h.size);
  if (auto e = cudaMemcpyAsync(r->ptr, buf->ptr, h.size, cudaMemcpyHostToDevice, s); e != cudaSuccess) {
    staging_->give(*buf);
    return cuda_error(e, "cudaMemcpyAsync (host to device) failed");
  }
  auto ev = events_->take();
  if (ev && cudaEventRecord(*ev, s) == cudaSuccess) {
    staging_->give_after(*events_, *ev, *buf, false);
    return {};
  }
  // No event to know the copy done by: wait for it (a rare path) so the buffer is free again.
  cudaGetLastError();
  if (ev) events_->give(*ev);
  if (auto e = cudaStreamSynchronize(s); e != cudaSuccess) {
    return cuda_error(e, "cudaStreamSynchronize failed");  // the buffer stays out of the pool
  }
  staging_->give(*buf);
  return {};
}

// Pinned memory for a sleeping tag's copy. Pinning is the kernel faulting every page in, zeroing
// it and locking it; cudaHostAlloc does that on one thread (16 GiB in 17 s on the H200 host,
// devrt_bench_pinned). Here the pages are faulted in by several threads at once, and
// cudaHostRegister then pins memory already there (1.4 s with 16 threads, the same copy speed).
result<void*> cuda_storage::alloc_host(std::uint64_t size) {
  if (auto b = bind_device(); !b) return std::move(b).err();
  const std::size_t bytes = static_cast<std::size_t>(size == 0 ? 1 : size);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    error err = error::make(errc::out_of_memory, "the host has no address space for a sleeping tag's copy (mmap)");
    err.size = size;
    return err;
  }
  constexpr std::size_t os_page = 4096;
  constexpr std::size_t per_thread = std::size_t{256} << 20;
  const std::size_t threads =
      std::min<std::size_t>({16, std::max(1u, std::thread::hardware_concurrency()), bytes / per_thread + 1});
  const auto touch = [p, bytes, os_page](std::size_t lo, std::size_t hi) {
    auto* b = static_cast<volatile char*>(p);
    for (std::size_t i = lo; i < std::min(hi, bytes); i += os_page) b[i] = 0;
  };
  if (threads <= 1) {
    touch(0, bytes);
  } else {
    const std::size_t part = (bytes / threads + os_page - 1) / os_page * os_page;
    std::vector<std::thread> pool;
    std::size_t t = 1;
    try {
      pool.reserve(threads - 1);
      for (; t < threads; ++t) pool.emplace_back(touch, t * part, (t + 1) * part);
    } catch (const std::exception&) {
      touch(t * part, bytes);  // no more threads: this one faults in the rest
    }
    touch(0, part);
    for (auto& th : pool) th.join();
  }
  if (auto e = cudaHostRegister(p, bytes, cudaHostRegisterPortable); e != cudaSuccess) {
    cudaGetLastError();
    munmap(p, bytes);
    error err = error::make(errc::out_of_memory, "cudaHostRegister refused to pin the memory for a sleeping tag");
    err.size = size;
    err.text = cudaGetErrorName(e);
    return err;
  }
  return p;
}

void cuda_storage::free_host(void* p, std::uint64_t size) noexcept {
  if (p == nullptr) return;
  cudaHostUnregister(p);
  munmap(p, static_cast<std::size_t>(size == 0 ? 1 : size));
}

result<void> cuda_storage::copy_to_host(const memory::storage_handle& h, void* dst) {
  if (auto c = refuse_in_capture(memory::streams::device, "copy"); !c) return c;
  auto r = get(h);
  if (!r) return std::move(r).err();
  if (auto b = bind_device(); !b) return b;
  if (h.size == 0) return {};
  if (auto e = cudaMemcpyAsync(dst, r->ptr, h.size, cudaMemcpyDeviceToHost, as_stream(stream_)); e != cudaSuccess) {
    return cuda_error(e, "cudaMemcpyAsync (device to pinned host) failed");
  }
  return {};
}

result<void> cuda_storage::copy_from_host(const memory::storage_handle& h, const void* src) {
  if (auto c = refuse_in_capture(memory::streams::device, "copy"); !c) return c;
  auto r = get(h);
  if (!r) return std::move(r).err();
  if (auto b = bind_device(); !b) return b;
  if (h.size == 0) return {};
  if (auto e = cudaMemcpyAsync(r->ptr, src, h.size, cudaMemcpyHostToDevice, as_stream(stream_)); e != cudaSuccess) {
    return cuda_error(e, "cudaMemcpyAsync (pinned host to device) failed");
  }
  return {};
}

result<memory::event> cuda_storage::read_async(const memory::storage_handle& h, void* dst, memory::stream_id q) {
  if (auto c = refuse_in_capture(q, "read"); !c) return std::move(c).err();
  auto r = get(h);
  if (!r) return std::move(r).err();
  if (auto b = bind_device(); !b) return std::move(b).err();
  if (h.size == 0) return record_event(q);
  auto buf = staging_->take(h.size, *events_);
  if (!buf) return std::move(buf).err();
  if (auto e = cudaMemcpyAsync(buf->ptr, r->ptr, h.size, cudaMemcpyDeviceToHost, as_stream(stream_of(q)));
      e != cudaSuccess) {
    staging_->give(*buf);
    return cuda_error(e, "cudaMemcpyAsync (device to host) failed");
  }
  auto t = events_->record(as_stream(stream_of(q)));
  if (!t) {
    // The copy is queued but nothing says when it is done: wait for it before the buffer returns.
    cudaStreamSynchronize(as_stream(stream_of(q)));
    cudaGetLastError();
    staging_->give(*buf);
    return std::move(t).err();
  }
  events_->on_completion(*t, *buf, dst, h.size, staging_.get());
  return *t;
}

// ---- The device's stream and capture ----

std::uint64_t cuda_storage::borrow_thread() noexcept {
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) {
    cudaGetLastError();
    previous = -1;
  }
  if (previous != device_) cudaSetDevice(device_);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) {
    cudaGetLastError();
    mode = cudaStreamCaptureModeRelaxed;
  }
  // Low 32 bits: the previous device + 1 (0: none); high 32 bits: the capture mode.
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(mode)) << 32U) |
         static_cast<std::uint32_t>(previous + 1);
}

void cuda_storage::return_thread(std::uint64_t saved) noexcept {
  auto mode = static_cast<cudaStreamCaptureMode>(static_cast<std::uint32_t>(saved >> 32U));
  if (mode != cudaStreamCaptureModeRelaxed) cudaThreadExchangeStreamCaptureMode(&mode);
  const int previous = static_cast<int>(static_cast<std::uint32_t>(saved)) - 1;
  if (previous >= 0 && previous != device_) cudaSetDevice(previous);
}

void* cuda_storage::native_stream() noexcept {
  cudaSetDevice(device_);
  return stream_;
}

result<void> cuda_storage::begin_capture() {
  if (capturing_) return {};
  if (auto b = bind_device(); !b) return b;
  // Frees queued so far go to the driver now, so that none is recorded into the graph.
  if (auto f = flush(); !f) return f;
  // Thread-local mode: other threads may keep calling CUDA while this stream records.
  if (auto e = cudaStreamBeginCapture(as_stream(stream_), cudaStreamCaptureModeThreadLocal); e != cudaSuccess) {
    return cuda_error(e, "cudaStreamBeginCapture failed");
  }
  capturing_ = true;
  return {};
}

result<std::shared_ptr<memory::recorded_work>> cuda_storage::end_capture() {
  if (!capturing_) return std::shared_ptr<memory::recorded_work>();
  capturing_ = false;
  if (auto b = bind_device(); !b) return std::move(b).err();
  cudaGraph_t graph = nullptr;
  if (auto e = cudaStreamEndCapture(as_stream(stream_), &graph); e != cudaSuccess) {
    return cuda_error(e, "cudaStreamEndCapture failed");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) return cuda_error(e, "cudaGraphInstantiate failed");
  return std::shared_ptr<memory::recorded_work>(
      std::make_shared<cuda_detail::cuda_graph>(exec, as_stream(stream_), device_));
}

result<void> cuda_storage::synchronize() {
  if (auto c = refuse_in_capture(memory::streams::device, "synchronize"); !c) return c;
  if (auto b = bind_device(); !b) return b;
  if (auto e = cudaStreamSynchronize(as_stream(stream_)); e != cudaSuccess) {
    return cuda_error(e, "cudaStreamSynchronize failed");
  }
  return {};
}

// ---- Events and streams ----

void* cuda_storage::stream_of(memory::stream_id q) const noexcept {
  switch (q) {
    case memory::streams::none:
    case memory::streams::device: return stream_;
    // The per-thread default stream of a client is a blocking stream: the legacy stream waits for
    // its work and it waits for the legacy stream's, so the legacy stream orders both ways.
    case memory::streams::legacy:
    case memory::streams::per_thread: return cudaStreamLegacy;
    default: return reinterpret_cast<void*>(static_cast<std::uintptr_t>(q));  // NOLINT
  }
}

result<memory::event> cuda_storage::record_event(memory::stream_id q) {
  if (capturing_ && stream_of(q) == stream_) {
    // An event recorded now would become a node of the graph: the fence waits for the capture end.
    return error::make(errc::capture_active, "no fence is recorded on the device's stream during a capture");
  }
  if (auto b = bind_device(); !b) return std::move(b).err();
  return events_->record(as_stream(stream_of(q)));
}

result<bool> cuda_storage::query_event(memory::event t) { return events_->query(t); }

result<void> cuda_storage::wait_event(memory::event t) {
  if (events_->event_of(t) == nullptr) return {};
  ++gpu_waits_;
  return events_->wait(t);
}

result<void> cuda_storage::stream_wait_event(memory::stream_id q, memory::event t) {
  if (auto b = bind_device(); !b) return b;
  return events_->stream_wait(as_stream(stream_of(q)), t);
}

void cuda_storage::release_event(memory::event t) noexcept { events_->release(t); }

result<memory::stream_identity> cuda_storage::identify(memory::stream_id s) {
  cudaStream_t stream = as_stream(stream_of(s));
  unsigned long long id = 0;  // NOLINT(google-runtime-int): the runtime's type
  // Asked first: cudaStreamGetId on a capturing stream fails and invalidates the capture.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t asked = cudaStreamIsCapturing(stream, &capture);
  if (asked == cudaSuccess && capture != cudaStreamCaptureStatusNone) {
    error err = error::make(errc::capture_active,
                            "the stream is capturing a CUDA graph, and CUDA names a stream (cudaStreamGetId) only "
                            "outside a capture; reserve the graph's memory before the capture or for another "
                            "stream, or capture through compute_client::capture_begin");
    return err;
  }
  if (asked != cudaSuccess) cudaGetLastError();  // a failed question is answered below
  if (const cudaError_t e = cudaStreamGetId(stream, &id); e != cudaSuccess) {
    error err = cuda_error(e, "cudaStreamGetId failed: the handle names no live CUDA stream (destroyed?)");
    err.code = errc::invalid_argument;
    return err;
  }
  const auto uid = static_cast<std::uint64_t>(id);
  known_stream& known = known_streams_[(uid * 0x9E3779B97F4A7C15ULL) >> 58];
  if (known.uid != uid || uid == 0) {
    int dev = device_;
    if (const cudaError_t e = cudaStreamGetDevice(stream, &dev); e != cudaSuccess) {
      error err = cuda_error(e, "cudaStreamGetDevice failed");
      err.code = errc::invalid_argument;
      return err;
    }
    known = known_stream{uid, dev};
  }
  return memory::stream_identity{uid, known.device, known.device != device_};
}

result<std::unique_ptr<memory::free_fence>> cuda_storage::make_free_fence(memory::stream_id s,
                                                                          const memory::stream_identity& id) {
  auto first = id.foreign ? cuda_detail::stream_free_fence::make_event(id.device) : events_->take();
  if (!first) return std::move(first).err();
  return std::unique_ptr<memory::free_fence>(std::make_unique<cuda_detail::stream_free_fence>(
      *events_, as_stream(stream_of(s)), id.device, id.foreign, *first));
}

result<void> cuda_storage::synchronize_device() {
  if (capturing_) return error::make(errc::capture_active, "the device cannot be synchronized during a capture");
  if (auto b = bind_device(); !b) return b;
  ++gpu_waits_;
  if (auto e = cudaDeviceSynchronize(); e != cudaSuccess) return cuda_error(e, "cudaDeviceSynchronize failed");
  return {};
}

void cuda_storage::return_after(memory::stream_id s) {
  if (std::find(return_after_.begin(), return_after_.end(), s) == return_after_.end()) return_after_.push_back(s);
}

result<void> cuda_storage::wait_for_return_streams() {
  for (const memory::stream_id q : return_after_) {
    auto t = events_->record(as_stream(stream_of(q)));
    if (!t) return std::move(t).err();
    auto j = events_->stream_wait(as_stream(stream_), *t);
    events_->release(*t);
    if (!j) return j;
  }
  return {};
}

std::uint64_t cuda_storage::gpu_waits() const noexcept { return gpu_waits_; }
std::uint64_t cuda_storage::idle_releases() const noexcept { return vmm_ ? vmm_->idle_releases() : 0; }
std::uint64_t cuda_storage::staging_bytes() const noexcept { return staging_->bytes(); }

// ---- Address ranges ----

result<memory::storage_handle> cuda_storage::reserve_range(std::uint64_t size, std::uint64_t unit_size) {
  if (!vmm_) return error::make(errc::unsupported, "the driver offers no virtual memory management on this GPU");
  if (auto b = bind_device(); !b) return std::move(b).err();
  return vmm_->reserve_range(next_id_++, size, unit_size);
}

result<void> cuda_storage::map(memory::storage_id id, std::uint64_t offset, std::uint64_t size) {
  if (!vmm_) return error::make(errc::unsupported, "the driver offers no virtual memory management on this GPU");
  if (!vmm_->has_range(id)) {
    error e = error::make(errc::invalid_argument, "not whole units inside a reserved CUDA address range");
    e.size = offset + size;
    return e;
  }
  const timed_call timer(profile_, driver_profile::map_total);
  if (auto b = bind_device(); !b) return b;
  return vmm_->map(id, offset, size);
}

void cuda_storage::unmap(memory::storage_id id, std::uint64_t offset, std::uint64_t size) {
  if (vmm_) vmm_->unmap(id, offset, size);
}

void cuda_storage::unmap_idle(memory::storage_id id, std::uint64_t offset, std::uint64_t size) {
  if (!vmm_) return;
  if (capturing_ || !bind_device()) {
    vmm_->unmap(id, offset, size);
    return;
  }
  const timed_call timer(profile_, driver_profile::flush_total);
  vmm_->unmap_idle(id, offset, size);
}

void cuda_storage::release_range(memory::storage_id id) {
  if (vmm_) vmm_->release_range(id);
}

std::uint64_t cuda_storage::mapped_bytes() const noexcept { return vmm_ ? vmm_->mapped_bytes() : 0; }
std::uint64_t cuda_storage::physical_allocations() const noexcept { return vmm_ ? vmm_->physical_allocations() : 0; }
std::uint64_t cuda_storage::reused_allocations() const noexcept { return vmm_ ? vmm_->reused_allocations() : 0; }
std::size_t cuda_storage::kept_allocations() const noexcept { return vmm_ ? vmm_->kept_allocations() : 0; }
std::uint64_t cuda_storage::kept_bytes() const noexcept { return vmm_ ? vmm_->kept_bytes() : 0; }

}  // namespace devrt::devices
