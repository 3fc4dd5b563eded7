#include "devrt/devices/cuda_storage.hpp"

#include <cuda_runtime_api.h>

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
}

cuda_storage::~cuda_storage() {
  cudaSetDevice(device_);
  for (auto& [id, p] : pages_) cudaFreeAsync(p.ptr, as_stream(stream_));
  cudaStreamSynchronize(as_stream(stream_));
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
  if (pending_.empty()) return {};
  if (auto r = bind_device(); !r) return r;
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

}  // namespace devrt::devices
