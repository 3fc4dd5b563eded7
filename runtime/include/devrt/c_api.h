/* devrt's C interface (libdevrt_c.so): memory by pointer, for programs and frameworks that are not
 * C++ (PyTorch's and CuPy's allocator hooks, ctypes, other languages).
 *
 *     void* p = NULL;
 *     if (devrt_malloc(&p, 1 << 20, 0, stream) != DEVRT_SUCCESS) fprintf(stderr, "%s\n", devrt_last_error());
 *     ...                                    // use p on `stream`
 *     devrt_free(p, 0, stream);              // free in stream order on `stream`
 *
 * Devices: -1 (DEVRT_HOST_DEVICE) is the host, with real memory; 0..N-1 are the CUDA devices
 * (devrt_device_count). Every function is safe to call from any thread, except devrt_init and
 * devrt_shutdown, which must not overlap other calls.
 *
 * Streams: a stream argument is a cudaStream_t, as in CUDA and PyTorch: NULL (like
 * DEVRT_STREAM_LEGACY, (void*)1, the value of cudaStreamLegacy) is CUDA's legacy default stream,
 * DEVRT_STREAM_PER_THREAD ((void*)2, cudaStreamPerThread) the calling thread's per-thread default
 * stream, and DEVRT_STREAM_DEVICE ((void*)3) the device's own stream (devrt's). Memory is free in
 * stream order: after devrt_free(p, d, s), later work on s may get p's memory at once, other
 * streams only once the work queued on s (and on every stream given to devrt_record_stream) by
 * then is done; no memory goes back to the driver before that either. The point s has reached is
 * recorded at the free itself, so s may be destroyed right after the free, with its work still
 * queued: a stream created later (even with the same handle) never gets that memory early. Free
 * memory before destroying the stream it is used on. The host device accepts every stream and
 * ignores it.
 *
 * Errors: every function returns a devrt_status (0 is success) and never lets an exception out;
 * devrt_last_error() is the calling thread's message of its last failed call, with the values
 * that explain it. A failed call changes nothing.
 *
 * Start-up: the first call starts devrt with default options (the host device and every CUDA
 * device found, layouts "auto", configuration from the DEVRT_* environment variables), unless
 * devrt_init started it first. */
#ifndef DEVRT_C_API_H
#define DEVRT_C_API_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t */

#if defined(DEVRT_C_API_HAS_CUDA_TYPES)
#include <cuda_runtime_api.h>
typedef cudaStream_t devrt_cuda_stream;
#else
/* cudaStream_t is a pointer (struct CUstream_st*): the same value as a void*. */
typedef void* devrt_cuda_stream;
#endif

#if defined(_WIN32)
#define DEVRT_C_EXPORT __declspec(dllexport)
#else
#define DEVRT_C_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Raised when a struct of this header grows: a library built for a newer header refuses options
 * of an older version only when they cannot be read. */
#define DEVRT_C_API_VERSION 1

#define DEVRT_HOST_DEVICE (-1)
/* The streams without a handle of their own: CUDA's legacy default stream (cudaStreamLegacy; NULL
 * names it too), the per-thread default stream (cudaStreamPerThread) and the device's own stream
 * (devrt's). */
#ifdef __cplusplus
#define DEVRT_STREAM_LEGACY (reinterpret_cast<void*>(1))
#define DEVRT_STREAM_PER_THREAD (reinterpret_cast<void*>(2))
#define DEVRT_STREAM_DEVICE (reinterpret_cast<void*>(3))
#else
#define DEVRT_STREAM_LEGACY ((void*)1)
#define DEVRT_STREAM_PER_THREAD ((void*)2)
#define DEVRT_STREAM_DEVICE ((void*)3)
#endif

/* Largest size devrt_malloc accepts: 2^62 bytes (a larger one is a bug, e.g. a negative size cast). */
#define DEVRT_MAX_ALLOCATION_SIZE (UINT64_C(1) << 62)

typedef enum devrt_status {
  DEVRT_SUCCESS = 0,
  DEVRT_ERROR_OUT_OF_MEMORY = 1,        /* the device (or a capped pool) refused; free memory and retry */
  DEVRT_ERROR_INVALID_VALUE = 2,        /* a null out-pointer or string, a bad option value */
  DEVRT_ERROR_UNKNOWN_POINTER = 3,      /* the pointer was not allocated by devrt_malloc (or was freed long ago) */
  DEVRT_ERROR_INVALID_DEVICE = 4,       /* no such device, or not the device the pointer belongs to */
  DEVRT_ERROR_DOUBLE_FREE = 5,          /* the pointer was freed already and not allocated again since */
  DEVRT_ERROR_SIZE_TOO_LARGE = 6,       /* size above DEVRT_MAX_ALLOCATION_SIZE */
  DEVRT_ERROR_NO_POOL = 7,              /* no pool of the device's layout accepts the size */
  DEVRT_ERROR_INVALID_LAYOUT = 8,       /* a layout string that does not parse or does not fit the device */
  DEVRT_ERROR_BUSY = 9,                 /* configure refused while memory of the current layout is live */
  DEVRT_ERROR_NOT_INITIALIZED = 10,     /* devrt was shut down (devrt_init starts it again) */
  DEVRT_ERROR_ALREADY_INITIALIZED = 11, /* devrt_init while devrt runs */
  DEVRT_ERROR_DEVICE = 12,              /* the driver failed */
  DEVRT_ERROR_INTERNAL = 13,            /* a bug in devrt: please report the message */
  DEVRT_ERROR_ASLEEP = 14,              /* an allocation with a tag that is asleep: devrt_wake it first */
  DEVRT_ERROR_UNSUPPORTED = 15          /* the device cannot do it (sleep on a device that cannot map memory) */
} devrt_status;

/* Options of devrt_init. Fill with devrt_options_default, then change what you need. */
typedef struct devrt_options {
  int version;             /* DEVRT_C_API_VERSION */
  int use_cuda;            /* nonzero: every CUDA device found (CUDA_VISIBLE_DEVICES chooses them) */
  const char* host_layout; /* layout string of the host device; NULL: "auto" */
  const char* cuda_layout; /* layout string of every CUDA device; NULL: "auto" */
  const char* log_level;   /* "disabled", "basic", "full"; NULL: the configuration's */
  uint64_t host_capacity;  /* bytes the host device may hold (0: the memory available, with free swap,
                              and the room left in the process's memory cgroups, when devrt starts) */
  int use_environment;     /* nonzero: read the DEVRT_* environment variables */
} devrt_options;

/* Statistics of one device. Bytes "in use" are the sizes requested by live allocations, bytes
 * "reserved" what devrt holds from the driver. */
typedef struct devrt_stats {
  uint64_t reserved_bytes;
  uint64_t peak_reserved_bytes; /* since start or devrt_reset_peak_stats */
  uint64_t in_use_bytes;
  uint64_t peak_in_use_bytes; /* since start or devrt_reset_peak_stats */
  uint64_t live_allocations;
  uint64_t allocations;          /* successful allocations */
  uint64_t frees;                /* allocations freed */
  uint64_t failed_allocations;   /* allocation calls that failed (one per call; a call that succeeds after
                                    devrt reclaimed memory is no failure) */
  uint64_t out_of_memory_errors; /* allocations and wakes that returned DEVRT_ERROR_OUT_OF_MEMORY */
  uint64_t driver_allocs;        /* memory obtained from the driver (calls) */
  uint64_t driver_frees;         /* memory returned to the driver (calls) */
  uint64_t maps;                 /* memory mapped into address ranges (calls) */
  uint64_t unmaps;               /* memory unmapped (calls) */
  uint64_t device_refusals;      /* driver allocations refused by the device */
  uint64_t cleanups;             /* explicit cleanups (devrt_empty_cache) */
  uint64_t reclaims;             /* cleanups forced by an out-of-memory before one retry */
  uint64_t stream_waits;         /* times devrt waited for its streams (memory pressure) */
  uint64_t fences;               /* fences taken or recorded on streams for frees */
  uint64_t streams;              /* streams whose memory devrt tracks now */
  /* Version 2 (DEVRT_STATS_VERSION 2): sleep and wake. */
  uint64_t sleeping_bytes;  /* memory unmapped by devrt_sleep, mapped again by devrt_wake */
  uint64_t offloaded_bytes; /* host memory holding the contents devrt_sleep kept */
  uint64_t sleeps;          /* devrt_sleep calls that put a tag to sleep */
  uint64_t wakes;           /* devrt_wake calls that woke a tag */
  /* Version 3: the pinned host memory devrt keeps after a wake for the next sleep's copy. */
  uint64_t host_cached_bytes; /* freed by devrt_release_host_copies */
  /* Version 4: the floor stream order sets. The peak of bytes in use plus bytes freed on streams
   * whose queued work may still use them, sampled when an allocation that needed new memory had
   * just checked the streams (0 on the host, and while memory is used on one stream only): memory
   * still used on a stream can neither serve another stream nor go back, so peak_in_use_bytes /
   * peak_busy_bytes bounds the memory efficiency of any allocator that waits for its streams.
   * Since start or devrt_reset_peak_stats. */
  uint64_t peak_busy_bytes;
} devrt_stats;

/* The version of devrt_stats this header describes. devrt_get_stats_v fills the fields of the
 * version it is given and no more, so a program built against an older header keeps working. */
#define DEVRT_STATS_VERSION 4

/* Fills `options` with the defaults (CUDA on, layouts "auto", the host held to the memory available
 * at start and its cgroups' limits, environment read). */
DEVRT_C_EXPORT void devrt_options_default(devrt_options* options);

/* Starts devrt. NULL options: the defaults. Errors: ALREADY_INITIALIZED (devrt runs: the first
 * call of any other function starts it; call devrt_init before that, or devrt_shutdown first),
 * INVALID_LAYOUT, INVALID_VALUE (a bad log level or version, or a malformed DEVRT_* variable or
 * config file when the environment is read). */
DEVRT_C_EXPORT int devrt_init(const devrt_options* options);

/* Frees every allocation still live, stops devrt and waits for its threads. Later calls fail
 * with NOT_INITIALIZED until devrt_init. Does nothing when devrt does not run. */
DEVRT_C_EXPORT int devrt_shutdown(void);

/* Nonzero while devrt runs. */
DEVRT_C_EXPORT int devrt_is_initialized(void);

/* The calling thread's message of its last failed call ("" if none failed yet). Valid until the
 * thread's next failed call. */
DEVRT_C_EXPORT const char* devrt_last_error(void);

/* A short stable name of a status ("DEVRT_ERROR_OUT_OF_MEMORY"). */
DEVRT_C_EXPORT const char* devrt_status_name(int status);

/* Number of CUDA devices: device indices are CUDA's (0..count-1, as the CUDA runtime numbers them
 * after CUDA_VISIBLE_DEVICES). DEVRT_CUDA_DEVICES may leave some out: a call naming one fails with
 * INVALID_DEVICE. 0 without CUDA. A device is started (context, stream, actor) by the first call
 * that names it. */
DEVRT_C_EXPORT int devrt_device_count(int* count);

/* Allocates `size` bytes on `device` for use on `stream` (see Streams above). Size 0 gives a
 * unique pointer that must be freed too. Errors: INVALID_VALUE (ptr is NULL), SIZE_TOO_LARGE,
 * INVALID_DEVICE, OUT_OF_MEMORY, NO_POOL, NOT_INITIALIZED. On error *ptr is set to NULL. */
DEVRT_C_EXPORT int devrt_malloc(void** ptr, size_t size, int device, void* stream);

/* Frees `ptr` in stream order on `stream`; when `stream` is not the stream it was allocated for,
 * the memory is first recorded as used on `stream`. Errors: UNKNOWN_POINTER, DOUBLE_FREE,
 * INVALID_DEVICE (not the pointer's device), INVALID_VALUE (`stream` is not a live stream),
 * NOT_INITIALIZED; after an error the pointer is as it was. NULL is accepted and does nothing. */
DEVRT_C_EXPORT int devrt_free(void* ptr, int device, void* stream);

/* Marks `ptr`'s memory as used on `stream` too (as PyTorch's Tensor.record_stream): when it is
 * freed, no other allocation gets it before the work queued on `stream` by then is done. `stream`
 * may be another GPU's stream (its kernels use the memory through peer access). Errors:
 * UNKNOWN_POINTER, INVALID_VALUE (`stream` is not a live stream), DEVICE, NOT_INITIALIZED. */
DEVRT_C_EXPORT int devrt_record_stream(void* ptr, void* stream);

/* Optional: `stream` (of `device`) is about to be destroyed. Its frees are fenced when they happen
 * anyway; retiring lets devrt forget the stream as soon as its memory is back. Errors:
 * INVALID_DEVICE, DEVICE, NOT_INITIALIZED. */
DEVRT_C_EXPORT int devrt_retire_stream(int device, void* stream);

/* The size `ptr` was allocated with. Errors: UNKNOWN_POINTER, INVALID_VALUE (size is NULL),
 * NOT_INITIALIZED. */
DEVRT_C_EXPORT int devrt_allocation_size(void* ptr, size_t* size);

/* Statistics of a device, after the frees made so far: the fields of `version` (1: up to `streams`;
 * 2: up to `wakes`; 3: all). Errors: INVALID_VALUE (a NULL struct, an unknown version),
 * INVALID_DEVICE. */
DEVRT_C_EXPORT int devrt_get_stats_v(int device, devrt_stats* stats, int version);
/* The version-1 fields only: the symbol programs built against the first header call. Programs
 * built against this one call devrt_get_stats_v through the macro below. */
DEVRT_C_EXPORT int devrt_get_stats(int device, devrt_stats* stats);
#ifndef DEVRT_NO_STATS_MACRO
#define devrt_get_stats(device, stats) devrt_get_stats_v((device), (stats), DEVRT_STATS_VERSION)
#endif

/* Sets the peaks to the current values. */
DEVRT_C_EXPORT int devrt_reset_peak_stats(int device);

/* Returns the device's unused memory to the driver (an explicit cleanup). */
DEVRT_C_EXPORT int devrt_empty_cache(int device);

/* The most `device` may hold for devrt, in bytes (0: no limit but the device's own), as
 * cudaMallocAsync's release threshold and PyTorch's set_per_process_memory_fraction: allocations
 * that would pass it fail with OUT_OF_MEMORY, whose message names the limit. Below what the device
 * holds now, its free memory goes back at once; live memory stays. Far from the limit (or, without
 * one, from the device's capacity) devrt keeps free memory mapped and maps in larger units; near it,
 * it trims to 1.04 times the peak of live bytes. At start: DEVRT_MEMORY_LIMIT (bytes such as 40GiB,
 * or a share of each device such as 0.8 or 80%). Errors: INVALID_DEVICE, NOT_INITIALIZED. */
DEVRT_C_EXPORT int devrt_set_memory_limit(int device, uint64_t bytes);
/* The device's memory limit in bytes (0: none). Errors: INVALID_VALUE (bytes is NULL),
 * INVALID_DEVICE, NOT_INITIALIZED. */
DEVRT_C_EXPORT int devrt_get_memory_limit(int device, uint64_t* bytes);

/* Replaces the device's pool layout (a layout string: "auto", "arena", "sliced:page=64MiB,slice=8MiB",
 * ...; see the README). A layout that does not parse or fit the device fails with INVALID_LAYOUT
 * at once; while memory of the current layout is live it fails with BUSY. Either way the current
 * layout stays in force. */
DEVRT_C_EXPORT int devrt_configure(int device, const char* layout);

/* ---- Tags, sleep and wake ----
 * A tag names allocations ("weights", "kv_cache"). Each tag has its own address range on a device,
 * so its memory can *sleep*: devrt_sleep gives its physical memory back to the device while every
 * allocation keeps its address, and devrt_wake maps new memory at the same addresses, so pointers,
 * tensors and CUDA graphs captured over them stay valid. */

/* Sets the calling thread's tag for its later allocations (devrt_malloc, devrt_torch_malloc).
 * NULL or "": no tag. The string is copied. Errors: INVALID_VALUE (longer than 63 bytes, or a
 * byte that is not printable ASCII); the tag is then unchanged. */
DEVRT_C_EXPORT int devrt_set_tag(const char* tag);
/* The calling thread's tag; NULL when it has none. Valid until the thread's next devrt_set_tag. */
DEVRT_C_EXPORT const char* devrt_get_tag(void);

/* Puts the memory of `tag` on `device` to sleep. It waits, in stream order, for the work queued on
 * the device's streams (the device's thread never waits for the GPU), copies every live allocation
 * of the tag to pinned host memory when `keep_contents` is nonzero, then unmaps and releases the
 * physical memory; the addresses stay reserved. Returns once the device has the memory back
 * (cudaMemGetInfo shows it). Allocations with the tag fail with ASLEEP until devrt_wake.
 * Freeing a sleeping allocation is allowed. Using one (a kernel, a copy) is an error of the
 * program: on CUDA it faults with an illegal address, as any unmapped address does; on the host
 * device it is a segmentation fault. A tag never used on the device, or already asleep: nothing
 * happens. Errors: INVALID_VALUE (tag NULL, empty or malformed), INVALID_DEVICE, UNSUPPORTED (the
 * device cannot map memory), OUT_OF_MEMORY (no host memory for the copy: nothing changed),
 * DEVICE, NOT_INITIALIZED. */
DEVRT_C_EXPORT int devrt_sleep(int device, const char* tag, int keep_contents);
/* Wakes `tag` on `device`: maps new physical memory at the same addresses (with the peer access
 * set for the device) and restores the contents devrt_sleep kept (memory whose contents were
 * discarded is not cleared: write it before reading). Returns once the contents are back. An
 * awake tag: nothing happens. Errors: OUT_OF_MEMORY (the device has no room: nothing changed, the
 * tag stays asleep and its kept copy is not lost; free memory and call again), INVALID_VALUE,
 * INVALID_DEVICE, DEVICE, NOT_INITIALIZED. */
DEVRT_C_EXPORT int devrt_wake(int device, const char* tag);
/* Pinned host memory outlives a wake: the next devrt_sleep with kept contents copies into it
 * instead of pinning anew, which costs far more than the copy (host_cached_bytes in devrt_stats).
 * This frees it and writes the bytes freed to `*released` (when not NULL); copies that hold a
 * sleeping tag's contents stay. On CUDA, freeing pinned memory may wait for the device's queued
 * work. Errors: INVALID_DEVICE, NOT_INITIALIZED. */
DEVRT_C_EXPORT int devrt_release_host_copies(int device, uint64_t* released);

/* ---- Memory snapshots and metrics ----
 * Text and bytes come back through a caller's buffer: `*length` always gets the bytes the answer
 * needs (without a terminating NUL). With `buffer` NULL (or `size` 0) nothing else happens; with a
 * buffer of at least *length + 1 bytes the answer is copied there, NUL-terminated. A buffer that
 * is too small fails with INVALID_VALUE and says how many bytes were needed; the answer may grow
 * between two calls, so ask again with some room. */

/* Formats of devrt_memory_snapshot. */
#define DEVRT_SNAPSHOT_PICKLE 0 /* the pickle torch.cuda.memory._snapshot() gives (for torch.cuda._memory_viz) */
#define DEVRT_SNAPSHOT_JSON 1   /* the same fields as JSON */

/* Starts (enabled 1) or stops (0) recording every device's trace of memory events (allocations,
 * frees, memory taken from and given back to the device, out-of-memory errors), those devices
 * started later included. At most `max_entries` per device are kept, the oldest dropped first (0:
 * 100000). Starting anew clears the trace. Off by default. */
DEVRT_C_EXPORT int devrt_record_memory_history(int enabled, size_t max_entries);

/* A device's snapshot: every segment of memory it holds, block by block (address, size, requested
 * size, state, stream), and the trace recorded so far. Errors: INVALID_VALUE (length is NULL, an
 * unknown format, the buffer too small), INVALID_DEVICE. */
DEVRT_C_EXPORT int devrt_memory_snapshot(int device, int format, void* buffer, size_t size, size_t* length);

/* Every started device's gauges and counters in the OpenMetrics text format, ending in "# EOF":
 * devrt_reserved_bytes, devrt_in_use_bytes, their peaks, devrt_maps_total, ... labelled
 * {device="host"}, {device="cuda:0"}. Errors: INVALID_VALUE. */
DEVRT_C_EXPORT int devrt_metrics_text(char* buffer, size_t size, size_t* length);

/* ---- PyTorch (torch.cuda.memory.CUDAPluggableAllocator) ----
 * The signatures PyTorch loads by name. Streams are CUDA's, as everywhere in this header: 0 is
 * the legacy default stream. PyTorch does not check the pointer its malloc function
 * returns, so on failure devrt_torch_malloc throws a C++ exception (std::bad_alloc carrying
 * devrt's message, which PyTorch turns into a Python RuntimeError) instead of returning NULL;
 * the message is also kept in devrt_last_error. devrt_torch_record_stream throws a
 * std::runtime_error with devrt's message when the stream cannot be tracked. Call them from C++
 * only (not from ctypes). */
DEVRT_C_EXPORT void* devrt_torch_malloc(ssize_t size, int device, devrt_cuda_stream stream);
DEVRT_C_EXPORT void devrt_torch_free(void* ptr, ssize_t size, int device, devrt_cuda_stream stream);
DEVRT_C_EXPORT void devrt_torch_record_stream(void* ptr, devrt_cuda_stream stream);
/* Empties the cache of every device (PyTorch's set_reset_fn / torch.cuda.empty_cache). */
DEVRT_C_EXPORT void devrt_torch_empty_cache(void);

#ifdef __cplusplus
}
#endif

#endif /* DEVRT_C_API_H */
