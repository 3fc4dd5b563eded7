#include "devrt/devices/cuda_storage.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <type_traits>

#include "devrt/devices/peer_access.hpp"

namespace devrt::devices {

const char* driver_profile::name(kind k) noexcept {
  switch (k) {
    case address_reserve: return "cuMemAddressReserve";
    case create: return "cuMemCreate";
    case map: return "cuMemMap";
    case set_access: return "cuMemSetAccess";
    case unmap: return "cuMemUnmap";
    case release: return "cuMemRelease";
    case stream_query: return "cudaStreamQuery";
    case map_total: return "map (whole)";
    case flush_total: return "flush (whole)";
    case kinds: break;
  }
  return "?";
}

namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

// Staging: reads and writes up to this size go through pinned buffers of the device's; buffers are
// rounded up to a power of two of at least 64 KiB and kept for the next copy (freeing pinned
// memory would synchronize the device).
constexpr std::uint64_t max_staged = std::uint64_t{64} << 20;
constexpr std::uint64_t min_staging = std::uint64_t{64} << 10;

std::uint64_t staging_class(std::uint64_t n) {
  std::uint64_t c = min_staging;
  while (c < n) c <<= 1;
  return c;
}

// Adds the time of one call to a profile when it goes out of scope.
class timed_call {
 public:
  timed_call(driver_profile& p, driver_profile::kind k) noexcept
      : p_(p), k_(k), start_(std::chrono::steady_clock::now()) {}
  timed_call(const timed_call&) = delete;
  timed_call& operator=(const timed_call&) = delete;
  ~timed_call() {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_);
    p_.ns[k_] += static_cast<std::uint64_t>(ns.count());
    ++p_.calls[k_];
  }

 private:
  driver_profile& p_;
  driver_profile::kind k_;
  std::chrono::steady_clock::time_point start_;
};

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
  // Destroyed only once its replays are done: the device releases a dropped graph behind an event
  // on its stream, and a storage that goes away drains its stream first.
  ~cuda_graph() override {
    int current = 0;
    const bool restore = cudaGetDevice(&current) == cudaSuccess;
    cudaSetDevice(device_);
    cudaGraphExecDestroy(exec_);
    if (restore) cudaSetDevice(current);
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

// Puts the calling thread's current device back as it was when the scope ends.
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
  const restore_current_device restore;
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
  int current = 0;
  const bool restore = cudaGetDevice(&current) == cudaSuccess;
  cudaSetDevice(device_);
  for (auto& [id, p] : pages_) cudaFreeAsync(p.ptr, as_stream(stream_));
  // Teardown is the one place that waits: every stream's work on the memory, that of streams
  // destroyed already included, is done after this.
  cudaDeviceSynchronize();
  cudaGetLastError();
  for (auto& b : batches_) {
    cudaEventDestroy(as_event(b.event));
    for (const auto& [id, index] : b.units) {
      auto it = ranges_.find(id);
      if (it != ranges_.end() && it->second.units[index].state == unit_state::unmap_recorded &&
          it->second.units[index].batch == b.seq) {
        release_mapping(it->second, index, true);
      }
    }
  }
  batches_.clear();
  release_kept();
  while (!ranges_.empty()) free_range_now(ranges_.begin()->first);
  for (auto& t : tickets_) {
    if (t.live && t.staging != nullptr) cudaFreeHost(t.staging);
    if (t.event != nullptr) cudaEventDestroy(as_event(t.event));
  }
  for (auto& [t, b] : staging_in_flight_) cudaFreeHost(b.ptr);
  for (auto& b : staging_free_) cudaFreeHost(b.ptr);
  for (void* ev : free_events_) cudaEventDestroy(as_event(ev));
  cudaStreamDestroy(as_stream(stream_));
  if (restore) cudaSetDevice(current);
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

std::uint64_t cuda_storage::returning_bytes() const noexcept {
  std::uint64_t n = 0;
  for (const memory::storage_id id : pending_) {
    if (auto it = pages_.find(id); it != pages_.end()) n += it->second.size;
  }
  n += kept_bytes_;
  auto mapping_bytes = [&](memory::storage_id id, std::uint64_t k, unit_state want) -> std::uint64_t {
    auto it = ranges_.find(id);
    if (it == ranges_.end() || it->second.units[k].state != want) return 0;
    return it->second.units[k].count * it->second.unit_size;
  };
  for (const auto& [id, k] : requested_unmaps_) n += mapping_bytes(id, k, unit_state::unmap_requested);
  for (const auto& b : batches_) {
    for (const auto& [id, k] : b.units) {
      auto it = ranges_.find(id);
      if (it != ranges_.end() && it->second.units[k].batch == b.seq)
        n += mapping_bytes(id, k, unit_state::unmap_recorded);
    }
  }
  return n;
}

std::size_t cuda_storage::unmaps_in_flight() const noexcept {
  std::size_t n = requested_unmaps_.size();
  for (const auto& b : batches_) n += b.units.size();  // revived ones included: an upper bound
  return n;
}

result<void> cuda_storage::flush() {
  if (pending_deallocations() == 0) return {};
  const timed_call timer(profile_, driver_profile::flush_total);
  if (auto r = bind_device(); !r) return r;
  recycle_staging();
  // Nothing reaches the driver from inside a capture: it would be recorded into the graph and
  // run again at every replay. The queue is kept for the first flush after the capture.
  if (capturing_) return {};
  if (!pending_.empty() || !requested_unmaps_.empty()) {
    if (auto j = join_users(); !j) return j;
  }
  if (auto u = record_unmaps(true); !u) return u;
  if (!batches_.empty()) {
    if (auto c = complete_unmaps(false); !c) return c;
  }
  // Kept memory no map took since the last settle goes back.
  release_kept();
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
  return write_on(h, src, memory::streams::device);
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
  decltype(&cuMemGetAccess) get_access = nullptr;
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
      get("cuMemGetAccess", a->get_access);
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
  CUresult reserved = CUDA_SUCCESS;
  {
    const timed_call timer(profile_, driver_profile::address_reserve);
    reserved = api_->address_reserve(&base, size, g, 0, 0);
  }
  if (CUresult r = reserved; r != CUDA_SUCCESS) {
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

void cuda_storage::release_mapping(range& r, std::uint64_t start, bool release) {
  unit& u = r.units[start];
  const std::uint64_t bytes = u.count * r.unit_size;
  {
    const timed_call timer(profile_, driver_profile::unmap);
    api_->unmap(r.base + start * r.unit_size, bytes);
  }
  if (release) {
    const timed_call timer(profile_, driver_profile::release);
    api_->release(u.handle);
    allocated_ -= bytes;
    ++driver_frees_;
  } else {
    // No work can reach the memory any more (its unmap is done): a map of the same size before
    // the next flush may take it.
    kept_.emplace_back(bytes, u.handle);
    kept_bytes_ += bytes;
  }
  for (std::uint64_t k = start; k < start + u.count; ++k) r.units[k].owner = 0xffffffffU;
  u.handle = 0;
  u.count = 0;
  u.batch = 0;
  u.state = unit_state::none;
  mapped_ -= bytes;
}

void cuda_storage::release_kept() {
  for (const auto& [bytes, handle] : kept_) {
    const timed_call timer(profile_, driver_profile::release);
    api_->release(handle);
    allocated_ -= bytes;
    ++driver_frees_;
  }
  kept_.clear();
  kept_bytes_ = 0;
}

result<void> cuda_storage::settle() {
  if (capturing_ || (requested_unmaps_.empty() && batches_.empty())) return {};
  const timed_call timer(profile_, driver_profile::flush_total);
  if (auto r = bind_device(); !r) return r;
  // What the device takes back now is kept for the maps that follow; the next flush releases
  // what they leave.
  if (auto u = record_unmaps(); !u) return u;
  return batches_.empty() ? result<void>{} : complete_unmaps(false);
}

result<void> cuda_storage::complete_unmaps(bool wait) {
  std::size_t done = 0;
  for (; done < batches_.size(); ++done) {
    auto* ev = as_event(batches_[done].event);
    if (wait) ++gpu_waits_;
    const cudaError_t q = wait ? cudaEventSynchronize(ev) : cudaEventQuery(ev);
    if (q == cudaErrorNotReady) break;
    if (q != cudaSuccess) return cuda_error(q, "waiting for the stream before unmapping failed");
    give_event(ev);
    const std::uint64_t seq = batches_[done].seq;
    for (const auto& [id, index] : batches_[done].units) {
      auto it = ranges_.find(id);
      if (it == ranges_.end()) continue;
      // Only the batch that recorded the unmap releases it: a mapping mapped again since then
      // keeps its memory, and one unmapped again belongs to a newer batch.
      const unit& u = it->second.units[index];
      if (u.state != unit_state::unmap_recorded || u.batch != seq) continue;
      release_mapping(it->second, index);
    }
  }
  batches_.erase(batches_.begin(), batches_.begin() + static_cast<std::ptrdiff_t>(done));
  // Ranges released by their pool go once no batch refers to them any more.
  if (!dying_ranges_.empty() && batches_.empty()) {
    for (const memory::storage_id id : dying_ranges_) free_range_now(id);
    dying_ranges_.clear();
  }
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
  const timed_call timer(profile_, driver_profile::map_total);
  if (auto b = bind_device(); !b) return b;
  if (!batches_.empty()) {
    if (auto c = complete_unmaps(false); !c) return c;
  }
  const std::uint64_t us = r->unit_size;
  const std::uint64_t first = offset / us;
  const std::uint64_t count = size / us;
  unit& head = r->units[first];
  if (head.owner == first && head.count == count &&
      (head.state == unit_state::unmap_requested || head.state == unit_state::unmap_recorded)) {
    // The same mapping again before its unmap happened: it keeps its memory and leaves its batch.
    head.state = unit_state::mapped;
    head.batch = 0;
    return {};
  }
  bool pending = false;
  for (std::uint64_t k = first; k < first + count; ++k) {
    const std::uint32_t o = r->units[k].owner;
    if (o == 0xffffffffU) continue;
    if (r->units[o].state == unit_state::mapped) {
      error e = error::make(errc::invalid_argument, "the memory is mapped already");
      e.size = k * us;
      return e;
    }
    pending = true;
  }
  if (pending) {
    // Other bounds over addresses whose unmap has not happened yet: the stream has to reach it
    // first. The arena never asks for this (it maps again exactly what it unmapped); direct users
    // of the storage wait here, counted in gpu_waits().
    if (auto u = record_unmaps(); !u) return u;
    if (auto c = complete_unmaps(true); !c) return c;
  }
  const CUdeviceptr at = r->base + offset;
  CUmemGenericAllocationHandle h = 0;
  CUresult cr = CUDA_SUCCESS;
  auto create_physical = [&] {
    const CUmemAllocationProp prop = physical_props(device_);
    const timed_call t(profile_, driver_profile::create);
    return api_->create(&h, size, &prop, 0);
  };
  // A physical allocation mapped here that could not be made accessible goes back to the driver.
  auto release_physical = [&] {
    const timed_call t(profile_, driver_profile::release);
    api_->release(h);
  };
  const char* step = "cuMemCreate";
  // A kept physical allocation of the same size is mapped again at its new address: no
  // cuMemCreate now and no cuMemRelease later.
  const auto kept = std::find_if(kept_.begin(), kept_.end(), [&](const auto& k) { return k.first == size; });
  const bool reused = kept != kept_.end();
  if (reused) {
    h = kept->second;
    *kept = kept_.back();
    kept_.pop_back();
    kept_bytes_ -= size;
    allocated_ -= size;  // counted again below, with the mapping
    ++reused_allocs_;
  }
  // The rest goes back now, before this mapping counts: the pool unmapped it to make room, so the
  // device must never hold it and the new mapping together.
  release_kept();
  if (!reused) {
    cr = create_physical();
    if (cr == CUDA_ERROR_OUT_OF_MEMORY && (!batches_.empty() || !requested_unmaps_.empty())) {
      // Memory is on its way back: let the stream reach the pending unmaps (a counted wait), then
      // try again.
      if (auto u = record_unmaps(); !u) return u;
      if (auto c = complete_unmaps(true); !c) return c;
      release_kept();
      cr = create_physical();
    }
    if (cr == CUDA_SUCCESS) ++physical_allocs_;
  }
  if (cr == CUDA_SUCCESS) {
    step = "cuMemMap";
    {
      const timed_call t(profile_, driver_profile::map);
      cr = api_->map(at, size, 0, h, 0);
    }
    if (cr == CUDA_SUCCESS) {
      // The device itself and every peer given access (set_peer_access), in one call.
      step = "cuMemSetAccess";
      if (auto a = set_mapping_access(at, size, {}); !a) {
        api_->unmap(at, size);
        release_physical();
        error e = std::move(a).err();
        e.size = size;
        return e;
      }
    }
    if (cr != CUDA_SUCCESS) release_physical();
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
  head.batch = 0;
  head.state = unit_state::mapped;
  mapped_ += size;
  allocated_ += size;
  ++driver_allocs_;
  return {};
}

result<void> cuda_storage::set_mapping_access(std::uint64_t at, std::uint64_t size,
                                              const std::vector<int>& revoked) const {
  std::vector<CUmemAccessDesc> access(1 + peers_.size() + revoked.size());
  auto set = [&](std::size_t i, int device, CUmemAccess_flags flags) {
    access[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access[i].location.id = device;
    access[i].flags = flags;
  };
  set(0, device_, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  for (std::size_t i = 0; i < peers_.size(); ++i) set(1 + i, peers_[i], CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  for (std::size_t i = 0; i < revoked.size(); ++i)
    set(1 + peers_.size() + i, revoked[i], CU_MEM_ACCESS_FLAGS_PROT_NONE);
  CUresult granted = CUDA_SUCCESS;
  {
    const timed_call timer(profile_, driver_profile::set_access);
    granted = api_->set_access(at, size, access.data(), access.size());
  }
  if (CUresult r = granted; r != CUDA_SUCCESS) {
    error e = api_->fail(r, "cuMemSetAccess failed (access for the device and its peers)");
    e.detail = "cuMemSetAccess";
    return e;
  }
  return {};
}

result<void> cuda_storage::set_peer_access(std::vector<int> peers) {
  if (auto v = validate_peers(device_, peers, cuda_device_count()); !v) return v;
  // The runtime applies its options from the thread that first asks for the device.
  const restore_current_device restore;
  if (auto b = bind_device(); !b) return b;
  for (const int p : peers) {
    // Kernels and copy engines of `p` read this device's memory: can p reach it?
    int can = 0;
    if (auto e = cudaDeviceCanAccessPeer(&can, p, device_); e != cudaSuccess) {
      cudaGetLastError();
      error err = cuda_error(e, "cudaDeviceCanAccessPeer failed");
      err.code = errc::device_error;
      err.text = peer_pair(device_, p) + ": " + err.text;
      return err;
    }
    if (can == 0) {
      error e = error::make(errc::unsupported,
                            "the peer cannot reach this device's memory (no NVLink or PCIe peer-to-peer path, "
                            "cudaDeviceCanAccessPeer); copy between them with devrt::runtime::copy instead");
      e.text = peer_pair(device_, p);
      return e;
    }
    int vmm = 0;
    if (api_ && (api_->attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, p) != CUDA_SUCCESS ||
                 vmm == 0)) {
      error e = error::make(errc::unsupported,
                            "the peer has no virtual memory management, so it cannot be given access to this "
                            "device's mapped (arena) memory; use a layout without an arena on this device");
      e.text = peer_pair(device_, p);
      return e;
    }
  }
  std::vector<int> revoked;
  for (const int p : peers_) {
    if (std::find(peers.begin(), peers.end(), p) == peers.end()) revoked.push_back(p);
  }
  peers_ = std::move(peers);
  // The pool behind cudaMallocAsync: its pages, present and future, follow the pool's access.
  cudaMemPool_t pool = nullptr;
  if (auto e = cudaDeviceGetMemPool(&pool, device_); e != cudaSuccess) {
    cudaGetLastError();
    return cuda_error(e, "cudaDeviceGetMemPool failed");
  }
  std::vector<cudaMemAccessDesc> pool_access;
  for (const int p : peers_) {
    pool_access.push_back(cudaMemAccessDesc{{cudaMemLocationTypeDevice, p}, cudaMemAccessFlagsProtReadWrite});
  }
  for (const int p : revoked) {
    pool_access.push_back(cudaMemAccessDesc{{cudaMemLocationTypeDevice, p}, cudaMemAccessFlagsProtNone});
  }
  if (!pool_access.empty()) {
    if (auto e = cudaMemPoolSetAccess(pool, pool_access.data(), pool_access.size()); e != cudaSuccess) {
      cudaGetLastError();
      return cuda_error(e, "cudaMemPoolSetAccess failed");
    }
  }
  // Every mapping still there (unmaps not done yet included: a mapping can be revived).
  for (auto& [id, r] : ranges_) {
    for (std::uint64_t k = 0; k < r.units.size(); ++k) {
      const unit& u = r.units[k];
      if (u.owner != k || u.state == unit_state::none) continue;
      if (auto a = set_mapping_access(r.base + k * r.unit_size, u.count * r.unit_size, revoked); !a) return a;
    }
  }
  return {};
}

result<bool> cuda_storage::mapped_access(const void* ptr, int peer) const {
  if (!api_ || api_->get_access == nullptr) {
    return error::make(errc::unsupported, "the driver offers no virtual memory management on this GPU");
  }
  CUmemLocation where{};
  where.type = CU_MEM_LOCATION_TYPE_DEVICE;
  where.id = peer;
  unsigned long long flags = 0;  // NOLINT(google-runtime-int): the driver's type
  if (CUresult r = api_->get_access(&flags, &where, reinterpret_cast<std::uintptr_t>(ptr));
      r != CUDA_SUCCESS) {  // NOLINT
    return api_->fail(r, "cuMemGetAccess failed (is the pointer in a mapped range of this device?)");
  }
  return flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

void cuda_storage::unmap(memory::storage_id id, std::uint64_t offset, std::uint64_t size) {
  range* r = find_range(id, offset, size);
  if (r == nullptr || offset % r->unit_size != 0) return;
  const std::uint64_t first = offset / r->unit_size;
  unit& head = r->units[first];
  // Only what one map call mapped, whole.
  if (head.owner != first || head.state != unit_state::mapped || head.count * r->unit_size != size) return;
  head.state = unit_state::unmap_requested;
  requested_unmaps_.emplace_back(id, first);
}

result<void> cuda_storage::record_unmaps(bool users_joined) {
  if (requested_unmaps_.empty() || capturing_) return {};
  // The device's stream waits for every user's stream first: work queued anywhere before the
  // unmap that may still touch the memory is ahead of it.
  if (!users_joined) {
    if (auto j = join_users(); !j) return j;
  }
  // Nothing is left to run on the device's stream, joins included: no queued work can touch the
  // memory, so it goes back now, without an event (the common case between bursts of work, and
  // always when no kernel is in flight). The peak then never counts memory that is both on its
  // way back and mapped anew.
  cudaError_t idle = cudaSuccess;
  {
    const timed_call timer(profile_, driver_profile::stream_query);
    idle = cudaStreamQuery(as_stream(stream_));
  }
  if (const cudaError_t q = idle; q == cudaSuccess) {
    for (const auto& [id, k] : requested_unmaps_) {
      auto it = ranges_.find(id);
      if (it == ranges_.end() || it->second.units[k].state != unit_state::unmap_requested) continue;
      release_mapping(it->second, k);
    }
    requested_unmaps_.clear();
    ++idle_releases_;
    return batches_.empty() ? result<void>{} : complete_unmaps(false);
  } else if (q != cudaErrorNotReady) {
    return cuda_error(q, "cudaStreamQuery failed");
  }
  auto ev = take_event();
  if (!ev) return std::move(ev).err();
  // Behind the device's stream, which has joined every user's stream (see flush).
  if (auto e = cudaEventRecord(as_event(*ev), as_stream(stream_)); e != cudaSuccess) {
    give_event(*ev);
    return cuda_error(e, "cudaEventRecord failed");
  }
  unmap_batch b{*ev, next_batch_++, {}};
  b.units.reserve(requested_unmaps_.size());
  for (const auto& [id, k] : requested_unmaps_) {
    auto it = ranges_.find(id);
    if (it == ranges_.end() || it->second.units[k].state != unit_state::unmap_requested) continue;
    it->second.units[k].state = unit_state::unmap_recorded;
    it->second.units[k].batch = b.seq;
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
  // Everything still mapped is unmapped behind the work in flight; the addresses are freed once
  // no unmap of theirs is pending. Nothing here waits for the GPU.
  range& r = it->second;
  for (std::uint64_t k = 0; k < r.units.size(); ++k) {
    if (r.units[k].owner == k && r.units[k].state == unit_state::mapped) {
      unmap(id, k * r.unit_size, r.units[k].count * r.unit_size);
    }
  }
  if (!requested_unmaps_.empty() && !capturing_) (void)record_unmaps();
  dying_ranges_.push_back(id);
  (void)complete_unmaps(false);
}

void cuda_storage::free_range_now(memory::storage_id id) {
  auto it = ranges_.find(id);
  if (it == ranges_.end()) return;
  range& r = it->second;
  for (std::uint64_t k = 0; k < r.units.size(); ++k) {
    if (r.units[k].state != unit_state::none && r.units[k].owner == k) release_mapping(r, k, true);
  }
  api_->address_free(r.base, r.size);
  ranges_.erase(it);
}

// ---- Streams and events ----

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

result<void*> cuda_storage::take_event() {
  if (!free_events_.empty()) {
    void* ev = free_events_.back();
    free_events_.pop_back();
    return ev;
  }
  cudaEvent_t ev = nullptr;
  if (auto e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess) {
    return cuda_error(e, "cudaEventCreateWithFlags failed");
  }
  return static_cast<void*>(ev);
}

void cuda_storage::give_event(void* ev) noexcept { free_events_.push_back(ev); }

cuda_storage::ticket_slot* cuda_storage::slot_of(memory::event t) noexcept {
  const auto index = static_cast<std::uint32_t>(t & 0xffffffffU);
  if (index == 0 || index > tickets_.size()) return nullptr;
  ticket_slot& s = tickets_[index - 1];
  if (!s.live || s.generation != static_cast<std::uint32_t>(t >> 32)) return nullptr;
  return &s;
}

memory::event cuda_storage::new_ticket(void* ev) {
  std::uint32_t index = 0;
  if (!free_tickets_.empty()) {
    index = free_tickets_.back();
    free_tickets_.pop_back();
  } else {
    tickets_.emplace_back();
    index = static_cast<std::uint32_t>(tickets_.size() - 1);
  }
  ticket_slot& s = tickets_[index];
  s.event = ev;
  s.staging = nullptr;
  s.staging_size = 0;
  s.dst = nullptr;
  s.bytes = 0;
  s.live = true;
  s.foreign = false;
  ++s.generation;
  return (static_cast<memory::event>(s.generation) << 32) | (index + 1);
}

void cuda_storage::finish_ticket(memory::event t) noexcept {
  ticket_slot* s = slot_of(t);
  if (s == nullptr) return;
  if (s->staging != nullptr) {
    if (s->dst != nullptr && s->bytes > 0) std::memcpy(s->dst, s->staging, s->bytes);
    give_staging(staging_buffer{s->staging, s->staging_size});
  }
  if (s->foreign) {
    cudaEventDestroy(as_event(s->event));
  } else {
    give_event(s->event);
  }
  s->foreign = false;
  s->event = nullptr;
  s->staging = nullptr;
  s->dst = nullptr;
  s->live = false;
  free_tickets_.push_back(static_cast<std::uint32_t>(s - tickets_.data()));
}

result<memory::event> cuda_storage::record_event(memory::stream_id q) {
  if (capturing_ && stream_of(q) == stream_) {
    // An event recorded now would become a node of the graph: the fence waits for the capture end.
    return error::make(errc::capture_active, "no fence is recorded on the device's stream during a capture");
  }
  if (auto b = bind_device(); !b) return std::move(b).err();
  auto ev = take_event();
  if (!ev) return std::move(ev).err();
  if (auto e = cudaEventRecord(as_event(*ev), as_stream(stream_of(q))); e != cudaSuccess) {
    cudaGetLastError();
    give_event(*ev);
    return cuda_error(e, "cudaEventRecord failed");
  }
  return new_ticket(*ev);
}

result<bool> cuda_storage::query_event(memory::event t) {
  ticket_slot* s = slot_of(t);
  if (s == nullptr) return true;
  const cudaError_t q = cudaEventQuery(as_event(s->event));
  if (q == cudaErrorNotReady) return false;
  finish_ticket(t);
  if (q != cudaSuccess) {
    cudaGetLastError();
    return cuda_error(q, "cudaEventQuery failed");
  }
  return true;
}

result<void> cuda_storage::wait_event(memory::event t) {
  ticket_slot* s = slot_of(t);
  if (s == nullptr) return {};
  ++gpu_waits_;
  if (auto e = cudaEventSynchronize(as_event(s->event)); e != cudaSuccess) {
    cudaGetLastError();
    return cuda_error(e, "cudaEventSynchronize failed");
  }
  return {};
}

result<void> cuda_storage::stream_wait_event(memory::stream_id q, memory::event t) {
  ticket_slot* s = slot_of(t);
  if (s == nullptr) return {};
  if (auto b = bind_device(); !b) return b;
  // The wait is enqueued with the event as it is now; the event stays the caller's.
  if (const cudaError_t e = cudaStreamWaitEvent(as_stream(stream_of(q)), as_event(s->event), 0); e != cudaSuccess) {
    cudaGetLastError();
    return cuda_error(e, "cudaStreamWaitEvent failed");
  }
  return {};
}

void cuda_storage::release_event(memory::event t) noexcept { finish_ticket(t); }

result<memory::stream_identity> cuda_storage::identify(memory::stream_id s) {
  cudaStream_t stream = as_stream(stream_of(s));
  unsigned long long id = 0;  // NOLINT(google-runtime-int): the runtime's type
  if (const cudaError_t e = cudaStreamGetId(stream, &id); e != cudaSuccess) {
    cudaGetLastError();
    error err = cuda_error(e, "cudaStreamGetId failed: the handle names no live CUDA stream (destroyed?)");
    err.code = errc::invalid_argument;
    return err;
  }
  int dev = device_;
  if (const cudaError_t e = cudaStreamGetDevice(stream, &dev); e != cudaSuccess) {
    cudaGetLastError();
    error err = cuda_error(e, "cudaStreamGetDevice failed");
    err.code = errc::invalid_argument;
    return err;
  }
  return memory::stream_identity{static_cast<std::uint64_t>(id), dev, dev != device_};
}

// One native stream's free-time fences: `current` is recorded again at every free (from the
// freeing thread, under a spin lock held only around the record), and swapped for a fresh event
// when the owner takes it. Events of another device's stream are made on that device.
class cuda_storage::free_fence_impl final : public memory::free_fence {
 public:
  free_fence_impl(cuda_storage& owner, cudaStream_t stream, int device, bool foreign, cudaEvent_t first)
      : owner_(owner), stream_(stream), device_(device), foreign_(foreign), current_(first) {}
  free_fence_impl(const free_fence_impl&) = delete;
  free_fence_impl& operator=(const free_fence_impl&) = delete;
  ~free_fence_impl() override {
    if (current_ != nullptr) cudaEventDestroy(current_);
  }
  void record() noexcept override {
    while (lock_.test_and_set(std::memory_order_acquire)) {
    }
    if (cudaEventRecord(current_, stream_) == cudaSuccess) {
      ++records_;
    } else {
      cudaGetLastError();
      failed_ = true;
    }
    lock_.clear(std::memory_order_release);
  }
  result<memory::event> take() override {
    auto fresh = make_event();
    if (!fresh) return std::move(fresh).err();
    while (lock_.test_and_set(std::memory_order_acquire)) {
    }
    const bool failed = std::exchange(failed_, false);
    cudaEvent_t taken = nullptr;
    if (!failed && records_ > 0) {
      taken = std::exchange(current_, *fresh);
      records_ = 0;
    }
    lock_.clear(std::memory_order_release);
    if (taken == nullptr) cudaEventDestroy(*fresh);
    if (failed) {
      return error::make(errc::device_error,
                         "a free-time cudaEventRecord failed (the stream was destroyed before its memory was freed, or "
                         "is being captured)");
    }
    if (taken == nullptr) return memory::event{0};
    return owner_.adopt_event(taken, foreign_);
  }
  result<cudaEvent_t> make_event() const {
    const restore_current_device restore;
    cudaSetDevice(device_);
    cudaEvent_t ev = nullptr;
    if (auto e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); e != cudaSuccess) {
      cudaGetLastError();
      return cuda_error(e, "cudaEventCreateWithFlags failed");
    }
    return ev;
  }

 private:
  cuda_storage& owner_;
  cudaStream_t stream_;
  int device_;
  bool foreign_;
  std::atomic_flag lock_ = ATOMIC_FLAG_INIT;
  cudaEvent_t current_;
  std::uint64_t records_ = 0;
  bool failed_ = false;
};

result<std::unique_ptr<memory::free_fence>> cuda_storage::make_free_fence(memory::stream_id s,
                                                                          const memory::stream_identity& id) {
  cudaEvent_t first = nullptr;
  {
    const restore_current_device restore;
    cudaSetDevice(id.device);
    if (auto e = cudaEventCreateWithFlags(&first, cudaEventDisableTiming); e != cudaSuccess) {
      cudaGetLastError();
      return cuda_error(e, "cudaEventCreateWithFlags failed");
    }
  }
  return std::unique_ptr<memory::free_fence>(
      std::make_unique<free_fence_impl>(*this, as_stream(stream_of(s)), id.device, id.foreign, first));
}

memory::event cuda_storage::adopt_event(void* ev, bool foreign) {
  const memory::event t = new_ticket(ev);
  slot_of(t)->foreign = foreign;
  return t;
}

result<void> cuda_storage::synchronize_device() {
  if (capturing_) return error::make(errc::capture_active, "the device cannot be synchronized during a capture");
  if (auto b = bind_device(); !b) return b;
  ++gpu_waits_;
  if (auto e = cudaDeviceSynchronize(); e != cudaSuccess) {
    cudaGetLastError();
    return cuda_error(e, "cudaDeviceSynchronize failed");
  }
  return {};
}

void cuda_storage::return_after(memory::stream_id s) {
  if (std::find(return_after_.begin(), return_after_.end(), s) == return_after_.end()) return_after_.push_back(s);
}

result<void> cuda_storage::join_users() {
  for (const memory::stream_id q : return_after_) {
    auto t = record_event(q);
    if (!t) return std::move(t).err();
    auto j = stream_wait_event(memory::streams::device, *t);
    release_event(*t);
    if (!j) return j;
  }
  return {};
}

result<cuda_storage::staging_buffer> cuda_storage::take_staging(std::uint64_t size) {
  const std::uint64_t want = staging_class(size);
  recycle_staging();
  // The smallest free buffer that holds it.
  std::size_t best = staging_free_.size();
  for (std::size_t i = 0; i < staging_free_.size(); ++i) {
    if (staging_free_[i].size >= want &&
        (best == staging_free_.size() || staging_free_[i].size < staging_free_[best].size)) {
      best = i;
    }
  }
  if (best != staging_free_.size()) {
    staging_buffer b = staging_free_[best];
    staging_free_[best] = staging_free_.back();
    staging_free_.pop_back();
    return b;
  }
  void* p = nullptr;
  if (auto e = cudaHostAlloc(&p, want, cudaHostAllocDefault); e != cudaSuccess) {
    cudaGetLastError();
    error err = cuda_error(e, "cudaHostAlloc (pinned staging memory) failed");
    err.code = errc::out_of_memory;
    err.size = want;
    return err;
  }
  staging_bytes_ += want;
  return staging_buffer{p, want};
}

void cuda_storage::give_staging(staging_buffer b) noexcept {
  // Kept for the next copy; freeing pinned memory (cudaFreeHost) would synchronize the device, so
  // buffers are kept until the storage goes away, up to what the pool holds.
  try {
    staging_free_.push_back(b);
  } catch (...) {
    cudaFreeHost(b.ptr);
    staging_bytes_ -= b.size;
  }
}

void cuda_storage::recycle_staging() noexcept {
  for (std::size_t i = 0; i < staging_in_flight_.size();) {
    ticket_slot* s = slot_of(staging_in_flight_[i].first);
    if (s != nullptr && cudaEventQuery(as_event(s->event)) == cudaErrorNotReady) {
      ++i;
      continue;
    }
    finish_ticket(staging_in_flight_[i].first);
    give_staging(staging_in_flight_[i].second);
    staging_in_flight_[i] = staging_in_flight_.back();
    staging_in_flight_.pop_back();
  }
}

result<void> cuda_storage::write_on(const memory::storage_handle& h, const void* src, memory::stream_id q) {
  auto r = get(h);
  if (!r) return std::move(r).err();
  if (auto b = bind_device(); !b) return b;
  if (h.size == 0) return {};
  cudaStream_t s = as_stream(stream_of(q));
  if (h.size > max_staged) {
    // Too large to stage: from pageable memory the driver stages it itself and may wait for the
    // stream meanwhile.
    if (auto e = cudaMemcpyAsync(r->ptr, src, h.size, cudaMemcpyHostToDevice, s); e != cudaSuccess) {
      return cuda_error(e, "cudaMemcpyAsync (host to device) failed");
    }
    return {};
  }
  auto buf = take_staging(h.size);
  if (!buf) return std::move(buf).err();
  std::memcpy(buf->ptr, src, h.size);
  if (auto e = cudaMemcpyAsync(r->ptr, buf->ptr, h.size, cudaMemcpyHostToDevice, s); e != cudaSuccess) {
    give_staging(*buf);
    return cuda_error(e, "cudaMemcpyAsync (host to device) failed");
  }
  auto t = record_event(q);
  if (!t) {
    // Without an event the buffer cannot be known free: keep it out of the pool.
    return std::move(t).err();
  }
  staging_in_flight_.emplace_back(*t, *buf);
  return {};
}

result<memory::event> cuda_storage::read_async(const memory::storage_handle& h, void* dst, memory::stream_id q) {
  auto r = get(h);
  if (!r) return std::move(r).err();
  if (auto b = bind_device(); !b) return std::move(b).err();
  if (h.size == 0) return record_event(q);
  auto buf = take_staging(h.size);
  if (!buf) return std::move(buf).err();
  if (auto e = cudaMemcpyAsync(buf->ptr, r->ptr, h.size, cudaMemcpyDeviceToHost, as_stream(stream_of(q)));
      e != cudaSuccess) {
    give_staging(*buf);
    return cuda_error(e, "cudaMemcpyAsync (device to host) failed");
  }
  auto t = record_event(q);
  if (!t) {
    give_staging(*buf);
    return std::move(t).err();
  }
  ticket_slot* s = slot_of(*t);
  s->staging = buf->ptr;
  s->staging_size = buf->size;
  s->dst = dst;
  s->bytes = h.size;
  return *t;
}

}  // namespace devrt::devices
