/* The thinnest allocator PyTorch's pluggable interface can load: cudaMallocAsync and
 * cudaFreeAsync on the stream PyTorch passes, nothing else. alloc_cost.py times it against
 * PyTorch's own cudaMallocAsync backend (the same driver calls without the interface), which
 * gives what the interface itself costs per tensor: a cost every pluggable allocator pays and
 * PyTorch's built-in allocators never do.
 *
 *   cc -O2 -shared -fPIC -I/usr/local/cuda/include plugin_async.c -o plugin_async.so \
 *      -L/usr/local/cuda/lib64 -lcudart
 */
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <sys/types.h>

void* plugin_async_malloc(ssize_t size, int device, cudaStream_t stream) {
  void* p = NULL;
  (void)device; /* PyTorch makes the device current before it calls */
  if (cudaMallocAsync(&p, (size_t)size, stream) != cudaSuccess) return NULL;
  return p;
}

void plugin_async_free(void* ptr, ssize_t size, int device, cudaStream_t stream) {
  (void)size;
  (void)device;
  cudaFreeAsync(ptr, stream);
}
