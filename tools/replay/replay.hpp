// The replay engine: plays a trace's events against devrt and measures what they cost in time
// and in memory held from the device.
//
// Core mode (threads == 0): one memory_manager on this thread; every `a` is a reserve whose
// handle is kept by id, every `f` drops it. Only the loop over the events is timed. The manager is
// driven as the device actor drives it, one event a batch: on out_of_memory one reclaim and one
// retry, and queued page frees flushed to the device after every event.
//
// Actor mode (threads >= 1): a runtime with one device actor; allocation ids are spread over the
// threads (id % threads), each thread plays its own events in trace order with create() (or
// reserve().get() when `wait`). A free never overtakes its create: a free whose create message is
// still queued is sent to the actor as a message of its own (counted in `deferred_frees`); other
// frees are plain handle drops. The time runs from the start of the threads until each has seen
// all of its messages served.
//
// Peak live is a property of the trace (sum of the sizes of live allocations, in trace order);
// peak reserved is the manager's own high-water mark of bytes held from the device.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "devrt/memory/config.hpp"
#include "devrt/memory/error.hpp"
#include "replay/trace.hpp"

namespace devrt::replay {

/// sim: a simulated H200; sim_gpu: the same with work in queue order and unmaps deferred as on a
/// GPU (the arena behaves as over cuda_storage); host: real host memory; cuda: GPU 0.
enum class device_choice { sim, sim_gpu, host, cuda };
const char* to_string(device_choice d) noexcept;
/// The properties the replay's device has: an H200 for sim, 512-byte alignment and 1 GiB pages
/// for host. For cuda the real GPU's are known only once it is opened: this gives the simulated
/// H200's, which the command line does not use to validate a layout for cuda (the memory manager
/// validates it against the real device when the replay starts).
memory::device_properties properties_of(device_choice d);

/// Whether this build has the CUDA replay (`--device cuda`, the CUDA baselines): compile
/// definition DEVRT_REPLAY_CUDA, set when the CUDA toolkit was found.
bool built_with_cuda() noexcept;
/// Why CUDA device 0 cannot be used: "" when it can; "built without CUDA" in builds without it;
/// otherwise the CUDA error (e.g. "no usable CUDA device: cudaGetDeviceCount returned
/// cudaErrorNoDevice (...)").
std::string cuda_unavailable_reason();

/// Allocators replayed directly against the CUDA runtime on device 0, for comparison.
///  - cuda_malloc: cudaMalloc / cudaFree (synchronous). Peak reserved is sampled from cudaMemGetInfo
///    (total - free, minus its value before the replay) every 1000 events and at every new peak of
///    live bytes; the sampling time is left out of the clock. Device-wide: other processes on the
///    GPU distort it, and the driver counts memory in its own page granularity (2 MiB).
///  - cuda_malloc_async: cudaMallocAsync / cudaFreeAsync on one stream, from the device's default
///    memory pool with its release threshold set to UINT64_MAX (the pool keeps what it has).
///    Peak reserved is the pool's cudaMemPoolAttrReservedMemHigh (reset and trimmed before the
///    replay; afterwards the threshold is put back and the pool trimmed to 0).
/// Size-0 allocations call nothing (cudaMalloc(0) gives no memory): they are counted as
/// allocations, not as driver calls. driver_allocs / driver_frees count the calls made. The clock
/// stops after a cudaStreamSynchronize (cudaMallocAsync) or cudaDeviceSynchronize (cudaMalloc).
enum class baseline_kind { cuda_malloc, cuda_malloc_async };
const char* to_string(baseline_kind b) noexcept;  ///< "cudaMalloc", "cudaMallocAsync"

struct replay_options {
  device_choice device = device_choice::sim;
  /// Replay against the CUDA runtime itself instead of devrt (`device`, `layout`, `threads`,
  /// `wait` and `timeline_samples` are then unused). Needs a CUDA build.
  std::optional<baseline_kind> baseline;
  memory::memory_layout layout = memory::preset::automatic;
  std::size_t threads = 0;  ///< 0: core mode; N >= 1: actor mode with N client threads
  bool wait = false;        ///< actor mode: reserve().get() instead of create()
  bool strict = false;      ///< stop at the first failed reserve
  /// sim_gpu, core mode: the simulated GPU runs this many events behind the requests (every event
  /// queues work on it, which completes that many events later), so that unmaps wait behind busy
  /// work as under a training loop; 0: the GPU is idle, as in a replay on the GPU itself.
  std::uint64_t gpu_lag = 0;
  /// The device's memory limit in bytes (0: none): devrt's (manager_options::memory_limit); for a
  /// baseline, a balloon (cudaMalloc of what is free beyond it) leaves it exactly this much.
  std::uint64_t memory_limit = 0;
  /// Core mode: about this many timeline samples (0: no timeline). Each sample is the largest
  /// live and reserved byte counts seen in its window of events.
  std::size_t timeline_samples = 0;
  /// Called now and then with (events done, events in all); from the replaying thread in core
  /// mode, from the calling thread in actor mode.
  std::function<void(std::uint64_t, std::uint64_t)> progress;
};

struct timeline_point {
  std::uint64_t event = 0;  ///< events played at the end of the window
  std::uint64_t live_bytes = 0;
  std::uint64_t reserved_bytes = 0;
};

struct replay_result {
  bool actor = false;
  std::string allocator = "devrt";  ///< "devrt", "cudaMalloc" or "cudaMallocAsync"
  std::string device;               ///< the storage's name ("sim-h200", "host", "cuda:0 (NVIDIA H200)")
  /// Where peak_reserved_bytes comes from: "manager" (devrt's memory_statistics),
  /// "cudaMemPoolAttrReservedMemHigh" or "cudaMemGetInfo" (see baseline_kind).
  std::string peak_reserved_source = "manager";
  std::size_t threads = 0;
  std::uint64_t events = 0;  ///< events played (fewer than the trace's if strict stopped it)
  std::uint64_t allocations = 0;
  std::uint64_t frees = 0;
  std::uint64_t deferred_frees = 0;  ///< actor mode: frees sent through the actor (see above)
  double seconds = 0;
  double ns_per_event = 0;
  double events_per_second = 0;
  std::uint64_t peak_live_bytes = 0;
  std::uint64_t peak_reserved_bytes = 0;
  /// The manager's own peak of bytes in use. Equals peak live when no reserve failed, in core mode
  /// and in actor mode with one thread; with more threads the interleaving decides it.
  std::uint64_t peak_in_use_bytes = 0;
  double ratio = 0;                   ///< peak reserved / peak live (0 when nothing was live)
  std::uint64_t reserved_at_end = 0;  ///< bytes still held from the device after the last event
  std::uint64_t driver_allocs = 0;
  std::uint64_t driver_frees = 0;
  std::uint64_t maps = 0;    ///< memory mapped into address ranges (arena pools), calls
  std::uint64_t unmaps = 0;  ///< memory unmapped from address ranges, calls
  /// Measured on a CUDA device (`driver_measured`): physical allocations created, maps that
  /// reused a kept one, and the driver's calls with their time over the replay (see
  /// devices::driver_profile). Elsewhere the calls are derived from maps and unmaps.
  bool driver_measured = false;
  std::uint64_t physical_creates = 0;
  std::uint64_t reused_allocations = 0;
  struct driver_time {
    std::string call;
    std::uint64_t calls = 0;
    double seconds = 0;
  };
  std::vector<driver_time> driver_times;
  std::uint64_t memory_limit = 0;  ///< the limit replayed under (0: none)
  std::uint64_t failures = 0;      ///< failed reserves
  std::string first_failure;       ///< the first one's message, with its event
  bool stopped = false;            ///< strict mode stopped at a failure
  std::vector<timeline_point> timeline;
};

/// Replays `t`. Errors: an invalid layout for the device (its validation error), a runtime that
/// fails to start, a CUDA device that cannot be used (device_error whose `text` names the CUDA
/// error), a CUDA replay asked of a build without CUDA (device_error, detail "built without CUDA"). Failed reserves are
/// not errors: they are counted in the result.
result<replay_result> replay(const trace& t, const replay_options& opts);

/// Writes the timeline as CSV: `event,live_bytes,reserved_bytes`, one sample a line.
result<void> write_timeline_csv(const std::string& path, const std::vector<timeline_point>& timeline);
/// A gnuplot script that plots `csv` into `output` (".png" or ".svg" decides the terminal).
std::string gnuplot_script(const std::string& csv, const std::string& output, const std::string& title);
/// The gnuplot executable on PATH, or empty.
std::string find_gnuplot();

}  // namespace devrt::replay
