#include "devrt/devices/cuda_storage.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <type_traits>

#include <string>

namespace devrt::devices {

namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

error cuda_error(cudaError_t e, const char* what) {
  error out = error::make(e == cudaErrorMemoryAllocation ? errc::out_of_memory : errc::device_error, what);
  out.text = cudaGetErrorName(e);
  return out;
}

// The executable graph of a capture, replayed on the stream it was captured on.
class cuda_graph final : public memory::recorded_work {
 public:
  cuda_graph(cudaGraphExec_t exec, cudaStream_t stream, int device) : exec_(exec), stream_(stream), device_(device) {}
  cuda_graph(const cuda_graph&) = delete;
  cuda_graph& operator=(const cuda_graph&) = delete;
  ~cuda_graph() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    cudaGraphExecDestroy(exec_);
  }
  result<void> launch() override {
    cudaSetDevice(device_);
    if (auto e = cudaGraphLaunch(exec_, stream_); e != cudaSuccess) return cuda_error(e, "cudaGraphLaunch failed");
    return {};
  }
  result<void> wait() override {
    cudaSetDevice(device_);
    if (auto e = cudaStreamSynchronize(stream_); e != cudaSuccess) {
      return cuda_error(e, "cudaStreamSynchronize failed");
    }
    return {};
  }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
  int device_;
};

}  // namespace

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
  struct restore_current_device {
    int previous = -1;
    restore_current_device() {
      if (cudaGetDevice(&previous) != cudaSuccess) {
        cudaGetLastError();
        previous = -1;
      }
    }
    restore_current_device(const restore_current_device&) = delete;
    restore_current_device& operator=(const restore_current_device&) = delete;
    ~restore_current_device() {
      if (previous >= 0) cudaSetDevice(previous);
    }
  } restore;
  auto fail = [&](cudaError_t e, const char* what) {
    cudaGetLastError();
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
  setup_mapping();
}

cuda_storage::~cuda_storage() {
  cudaSetDevice(device_);
  for (auto& [id, p] : pages_) cudaFreeAsync(p.ptr, as_stream(stream_));
  cudaStreamSynchronize(as_stream(stream_));
  while (!ranges_.empty()) release_range(ranges_.begin()->first);
  for (auto& b : batches_) cudaEventDestroy(static_cast<cudaEvent_t>(b.event));
  cudaStreamDestroy(as_stream(stream_));
}

result<void> cuda_storage::bind_device() const {
  if (auto e = cudaSetDevice(device_); e != cudaSuccess) return cuda_error(e, "cudaSetDevice failed");
  return {};
}

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
    cudaGetLastError();  // clear the sticky-free error state of the runtime
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

result<void> cuda_storage::flush() {
  if (pending_.empty() && requested_unmaps_.empty() && batches_.empty()) return {};
  if (auto r = bind_device(); !r) return r;
  if (auto u = record_unmaps(); !u) return u;
  if (!batches_.empty()) {
    if (auto c = complete_unmaps(false); !c) return c;
  }
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

result<memory::resource> cuda_storage::get(const memory::storage_handle& h) {
  if (auto r = ranges_.find(h.id); r != ranges_.end()) {
    if (h.offset > r->second.size || h.size > r->second.size - h.offset) {
      error e = error::make(errc::invalid_argument, "the view ends past its CUDA address range");
      e.size = h.offset + h.size;
      e.limit = r->second.size;
      return e;
    }
    return memory::resource{reinterpret_cast<void*>(r->second.base + h.offset), h.size, h};  // NOLINT
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

result<void> cuda_storage::write(const memory::storage_handle& h, const void* src) {
  auto r = get(h);
  if (!r) return std::move(r).err();
  if (auto b = bind_device(); !b) return b;
  if (h.size == 0) return {};
  // From pageable memory the call returns once the source has been staged, so the caller may
  // release `src` at once; the copy itself stays ordered on the stream.
  if (auto e = cudaMemcpyAsync(r->ptr, src, h.size, cudaMemcpyHostToDevice, as_stream(stream_)); e != cudaSuccess) {
    return cuda_error(e, "cudaMemcpyAsync (host to device) failed");
  }
  return {};
}

result<void> cuda_storage::read(const memory::storage_handle& h, void* dst) {
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

void* cuda_storage::native_queue() noexcept {
  cudaSetDevice(device_);
  return stream_;
}

result<void> cuda_storage::begin_capture() {
  if (capturing_) return {};
  if (auto b = bind_device(); !b) return b;
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
    cudaGetLastError();
    return cuda_error(e, "cudaStreamEndCapture failed");
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  if (e != cudaSuccess) return cuda_error(e, "cudaGraphInstantiate failed");
  return std::shared_ptr<memory::recorded_work>(std::make_shared<cuda_graph>(exec, as_stream(stream_), device_));
}

result<void> cuda_storage::synchronize() {
  if (auto b = bind_device(); !b) return b;
  if (auto e = cudaStreamSynchronize(as_stream(stream_)); e != cudaSuccess) {
    return cuda_error(e, "cudaStreamSynchronize failed");
  }
  return {};
}

// ---- Address ranges ----

// The driver functions the ranges use, looked up once per process through the runtime.
struct cuda_storage::driver_api {
  decltype(&cuMemAddressReserve) address_reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;
  decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&cuDeviceGetAttribute) attribute = nullptr;
  decltype(&cuGetErrorName) error_name = nullptr;

  static std::shared_ptr<const driver_api> load() {
    static const std::shared_ptr<const driver_api> api = [] {
      auto a = std::make_shared<driver_api>();
      bool ok = true;
      auto get = [&](const char* name, auto& fn) {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult q{};
        if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess || p == nullptr) {
          cudaGetLastError();
          ok = false;
          return;
        }
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
      };
      get("cuMemAddressReserve", a->address_reserve);
      get("cuMemAddressFree", a->address_free);
      get("cuMemCreate", a->create);
      get("cuMemRelease", a->release);
      get("cuMemMap", a->map);
      get("cuMemUnmap", a->unmap);
      get("cuMemSetAccess", a->set_access);
      get("cuMemGetAllocationGranularity", a->granularity);
      get("cuDeviceGetAttribute", a->attribute);
      get("cuGetErrorName", a->error_name);
      return ok ? std::shared_ptr<const driver_api>(std::move(a)) : std::shared_ptr<const driver_api>();
    }();
    return api;
  }

  error fail(CUresult r, const char* what) const {
    error e = error::make(r == CUDA_ERROR_OUT_OF_MEMORY ? errc::out_of_memory : errc::device_error, what);
    const char* name = nullptr;
    if (error_name != nullptr && error_name(r, &name) == CUDA_SUCCESS && name != nullptr) e.text = name;
    return e;
  }
};

namespace {

CUmemAllocationProp physical_props(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

}  // namespace

void cuda_storage::setup_mapping() {
  api_ = driver_api::load();
  if (!api_) return;
  int supported = 0;
  if (api_->attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device_) != CUDA_SUCCESS ||
      supported == 0) {
    api_.reset();
    return;
  }
  const CUmemAllocationProp prop = physical_props(device_);
  std::size_t granularity = 0;
  if (api_->granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS ||
      granularity == 0) {
    api_.reset();
    return;
  }
  props_.map_granularity = granularity;
}

result<memory::storage_handle> cuda_storage::reserve_range(std::uint64_t size, std::uint64_t unit_size) {
  if (!api_) return error::make(errc::unsupported, "the driver offers no virtual memory management on this GPU");
  const std::uint64_t g = props_.map_granularity;
  if (unit_size == 0 || unit_size % g != 0 || size == 0 || size % unit_size != 0) {
    error e = error::make(errc::invalid_argument,
                          "an address range is a positive multiple of its unit, and the unit of the granularity");
    e.size = size;
    e.limit = unit_size;
    return e;
  }
  if (auto b = bind_device(); !b) return std::move(b).err();
  CUdeviceptr base = 0;
  if (CUresult r = api_->address_reserve(&base, size, g, 0, 0); r != CUDA_SUCCESS) {
    error e = api_->fail(r, "cuMemAddressReserve failed");
    e.size = size;
    return e;
  }
  const memory::storage_id id = next_id_++;
  ranges_.emplace(id, range{base, size, unit_size, std::vector<unit>(size / unit_size)});
  return memory::storage_handle{id, 0, size};
}

cuda_storage::range* cuda_storage::find_range(memory::storage_id id, std::uint64_t offset, std::uint64_t size) {
  auto it = ranges_.find(id);
  if (it == ranges_.end()) return nullptr;
  range& r = it->second;
  if (size == 0 || offset > r.size || size > r.size - offset) return nullptr;
  return &r;
}

void cuda_storage::release_mapping(range& r, std::uint64_t start) {
  unit& u = r.units[start];
  const std::uint64_t bytes = u.count * r.unit_size;
  api_->unmap(r.base + start * r.unit_size, bytes);
  api_->release(u.handle);
  for (std::uint64_t k = start; k < start + u.count; ++k) r.units[k].owner = 0xffffffffU;
  u.handle = 0;
  u.count = 0;
  u.state = 0;
  mapped_ -= bytes;
  allocated_ -= bytes;
  ++driver_frees_;
}

result<void> cuda_storage::complete_unmaps(bool wait) {
  std::size_t done = 0;
  for (; done < batches_.size(); ++done) {
    auto* ev = static_cast<cudaEvent_t>(batches_[done].event);
    const cudaError_t q = wait ? cudaEventSynchronize(ev) : cudaEventQuery(ev);
    if (q == cudaErrorNotReady) break;
    if (q != cudaSuccess) return cuda_error(q, "waiting for the stream before unmapping failed");
    cudaEventDestroy(ev);
    for (const auto& [id, index] : batches_[done].units) {
      auto it = ranges_.find(id);
      // A unit mapped again since its unmap was requested keeps its memory.
      if (it == ranges_.end() || it->second.units[index].state != 3) continue;
      release_mapping(it->second, index);
    }
  }
  batches_.erase(batches_.begin(), batches_.begin() + static_cast<std::ptrdiff_t>(done));
  return {};
}

result<void> cuda_storage::map(memory::storage_id id, std::uint64_t offset, std::uint64_t size) {
  if (!api_) return error::make(errc::unsupported, "the driver offers no virtual memory management on this GPU");
  range* r = find_range(id, offset, size);
  if (r == nullptr || offset % r->unit_size != 0 || size % r->unit_size != 0) {
    error e = error::make(errc::invalid_argument, "not whole units inside a reserved CUDA address range");
    e.size = offset + size;
    return e;
  }
  if (capturing_) {
    error e = error::make(errc::capture_active, "memory had to be mapped inside a graph capture");
    e.size = size;
    return e;
  }
  if (auto b = bind_device(); !b) return b;
  if (!batches_.empty()) {
    if (auto c = complete_unmaps(false); !c) return c;
  }
  const std::uint64_t us = r->unit_size;
  const std::uint64_t first = offset / us;
  const std::uint64_t count = size / us;
  unit& head = r->units[first];
  if (head.owner == first && head.count == count && (head.state == 2 || head.state == 3)) {
    head.state = 1;  // the same mapping again before its unmap happened: it keeps its memory
    return {};
  }
  bool pending = false;
  for (std::uint64_t k = first; k < first + count; ++k) {
    const std::uint32_t o = r->units[k].owner;
    if (o == 0xffffffffU) continue;
    if (r->units[o].state == 1) {
      error e = error::make(errc::invalid_argument, "the memory is mapped already");
      e.size = k * us;
      return e;
    }
    pending = true;
  }
  if (pending) {
    // Addresses still mapped by an unmap that has not happened yet: let the stream reach it.
    if (auto u = record_unmaps(); !u) return u;
    if (auto c = complete_unmaps(true); !c) return c;
  }
  const CUmemAllocationProp prop = physical_props(device_);
  const CUdeviceptr at = r->base + offset;
  CUmemGenericAllocationHandle h = 0;
  CUresult cr = api_->create(&h, size, &prop, 0);
  if (cr == CUDA_ERROR_OUT_OF_MEMORY && (!batches_.empty() || !requested_unmaps_.empty())) {
    // Memory is on its way back: let the stream reach the pending unmaps, then try again.
    if (auto u = record_unmaps(); !u) return u;
    if (auto c = complete_unmaps(true); !c) return c;
    cr = api_->create(&h, size, &prop, 0);
  }
  const char* step = "cuMemCreate";
  if (cr == CUDA_SUCCESS) {
    ++physical_allocs_;
    step = "cuMemMap";
    cr = api_->map(at, size, 0, h, 0);
    if (cr == CUDA_SUCCESS) {
      CUmemAccessDesc access{};
      access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      access.location.id = device_;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      step = "cuMemSetAccess";
      cr = api_->set_access(at, size, &access, 1);
      if (cr != CUDA_SUCCESS) api_->unmap(at, size);
    }
    if (cr != CUDA_SUCCESS) api_->release(h);
  }
  if (cr != CUDA_SUCCESS) {
    error e = api_->fail(cr, "mapping device memory failed");
    e.size = size;
    e.in_use = allocated_;
    e.limit = props_.capacity;
    e.detail = step;
    return e;
  }
  for (std::uint64_t k = first; k < first + count; ++k) r->units[k].owner = static_cast<std::uint32_t>(first);
  head.handle = h;
  head.count = count;
  head.state = 1;
  mapped_ += size;
  allocated_ += size;
  ++driver_allocs_;
  return {};
}

void cuda_storage::unmap(memory::storage_id id, std::uint64_t offset, std::uint64_t size) {
  range* r = find_range(id, offset, size);
  if (r == nullptr || offset % r->unit_size != 0) return;
  const std::uint64_t first = offset / r->unit_size;
  unit& head = r->units[first];
  // Only what one map call mapped, whole.
  if (head.owner != first || head.state != 1 || head.count * r->unit_size != size) return;
  head.state = 2;
  requested_unmaps_.emplace_back(id, first);
}

result<void> cuda_storage::record_unmaps() {
  if (requested_unmaps_.empty() || capturing_) return {};
  cudaEvent_t ev = nullptr;
  if (auto e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess) {
    return cuda_error(e, "cudaEventCreateWithFlags failed");
  }
  if (auto e = cudaEventRecord(ev, as_stream(stream_)); e != cudaSuccess) {
    cudaEventDestroy(ev);
    return cuda_error(e, "cudaEventRecord failed");
  }
  unmap_batch b{ev, {}};
  b.units.reserve(requested_unmaps_.size());
  for (const auto& [id, k] : requested_unmaps_) {
    auto it = ranges_.find(id);
    if (it == ranges_.end() || it->second.units[k].state != 2) continue;
    it->second.units[k].state = 3;
    b.units.emplace_back(id, k);
  }
  requested_unmaps_.clear();
  batches_.push_back(std::move(b));
  return complete_unmaps(false);
}

void cuda_storage::release_range(memory::storage_id id) {
  auto it = ranges_.find(id);
  if (it == ranges_.end()) return;
  (void)bind_device();
  cudaStreamSynchronize(as_stream(stream_));
  (void)complete_unmaps(true);
  range& r = it->second;
  for (std::uint64_t k = 0; k < r.units.size(); ++k) {
    if (r.units[k].state != 0 && r.units[k].owner == k) release_mapping(r, k);
  }
  api_->address_free(r.base, r.size);
  ranges_.erase(it);
}

}  // namespace devrt::devices
