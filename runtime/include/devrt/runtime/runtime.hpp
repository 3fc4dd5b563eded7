// The runtime: discovers the devices, gives each a memory actor on a thread of its own, runs
// completion handlers on a small pool of threads, loads the configuration, and shuts everything
// down in order.
//
// CUDA devices: the runtime uses the devices the CUDA runtime shows (CUDA_VISIBLE_DEVICES applies;
// devrt never sets it), or those of `runtime_options::cuda_devices` / DEVRT_CUDA_DEVICES, and
// creates a device's context, stream and actor only when `client` is first asked for it (under
// torchrun, each process touches only its own GPU). Neither that nor the start changes the
// calling thread's current CUDA device.
//
//     devrt::runtime::runtime rt;                 // host device, configuration from the environment
//     auto client = rt.host();
//     auto h = client.reserve(1 << 20).get();
//
// Threading: construct and destroy from one thread (not from a device strand or a completion
// handler); every other member is safe from any thread.
#pragma once

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "devrt/devices/host_storage.hpp"
#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/config.hpp"
#include "devrt/memory/snapshot.hpp"
#include "devrt/runtime/compute_client.hpp"
#include "devrt/runtime/config.hpp"
#include "devrt/runtime/device_actor.hpp"
#include "devrt/runtime/device_report.hpp"

namespace devrt::runtime {

struct runtime_options {
  devices::host_options host;
  memory::memory_layout host_layout = memory::preset::automatic;
  /// Adds a simulated device (index 0 of kind sim) with these options.
  std::optional<devices::sim_options> sim;
  memory::memory_layout sim_layout = memory::preset::automatic;
  /// Uses CUDA devices (when devrt is built with CUDA).
  bool use_cuda = true;
  /// Which CUDA devices to use, by index as the CUDA runtime numbers them (after
  /// CUDA_VISIBLE_DEVICES). nullopt: DEVRT_CUDA_DEVICES (or the config file's cuda_devices) if
  /// set, else every visible device. Negative or repeated indices are refused (invalid_argument);
  /// an index that is not a device is a not_found error from `client`.
  std::optional<std::vector<int>> cuda_devices;
  memory::memory_layout cuda_layout = memory::preset::automatic;
  /// Peer access between CUDA devices: the memory of device `key` is made readable and writable
  /// from the devices listed (`{{0, {1}}}`: kernels and copies on cuda:1 reach cuda:0's memory),
  /// when the device is first used, before any allocation (see peer_access.hpp; later changes:
  /// `set_peer_access`). Negative indices, a device listed as its own peer, or a peer listed twice
  /// are refused here (invalid_argument); a peer that is not a device, or a pair without a peer
  /// path, makes `client` of that device throw (invalid_argument, unsupported).
  std::map<int, std::vector<int>> peer_access;
  /// Config file; by default DEVRT_CONFIG names it, if set.
  std::optional<std::string> config_file;
  /// Read DEVRT_* environment variables.
  bool use_environment = true;
  /// Override the configuration's policy or log level.
  std::optional<memory::persistent_policy> persistent_memory;
  std::optional<log_level> log;
  /// Overrides the configuration's serve_in_place (config.hpp; DEVRT_SERVE_IN_PLACE).
  std::optional<bool> serve_in_place;
  /// Overrides the configuration's memory limit (config.hpp; DEVRT_MEMORY_LIMIT): the most each
  /// device may hold for devrt, in bytes or as a share of the device. Later changes, per device:
  /// compute_client::set_memory_limit.
  std::optional<memory_limit_spec> memory_limit;
  /// Threads that run completion handlers without an executor of their own. The pool is shared by
  /// every runtime of the process; the first runtime created sizes it.
  std::size_t completion_threads = 2;
  /// How long a device thread that has run out of messages keeps polling for more before it
  /// sleeps: a message arriving meanwhile is served without a thread wake-up (several
  /// microseconds). 0 makes device threads sleep at once, spending no CPU while idle.
  std::chrono::microseconds idle_spin{20};
};

class runtime {
 public:
  /// Starts the runtime. Throws devrt::exception (malformed_config, an invalid layout) when the
  /// configuration is wrong; `create` returns the error instead.
  explicit runtime(runtime_options opts = {});
  static result<std::unique_ptr<runtime>> create(runtime_options opts = {});
  runtime(const runtime&) = delete;
  runtime& operator=(const runtime&) = delete;
  /// Shuts down (see `shutdown`).
  ~runtime();

  /// Stops every actor: requests not yet served complete with errc::shutdown, every page is
  /// returned, the device threads are joined, then pending completions run. Handles that outlive
  /// the runtime stay safe to copy and drop. Idempotent.
  void shutdown() noexcept;

  /// The usable devices. A CUDA device whose actor was not created yet is listed with its kind,
  /// index and name, and empty properties.
  [[nodiscard]] std::vector<device_info> devices() const;
  /// The client of a device; a CUDA device's storage and actor are created on the first call
  /// (thread-safe). Throws devrt::exception: not_found if there is no such device (or it is not
  /// among the CUDA devices chosen), shutdown for a device first asked for after shutdown,
  /// device_error if the device cannot be used.
  [[nodiscard]] compute_client client(device_kind kind, int index = 0) const;
  [[nodiscard]] compute_client host() const { return client(device_kind::host); }
  [[nodiscard]] compute_client sim() const { return client(device_kind::sim); }
  [[nodiscard]] compute_client cuda(int index = 0) const { return client(device_kind::cuda, index); }
  /// Number of usable devices of a kind (CUDA devices count before their actors exist).
  [[nodiscard]] int count(device_kind kind) const;
  /// Number of CUDA devices the CUDA runtime shows (their indices are 0..n-1; devices() lists those
  /// devrt uses among them).
  [[nodiscard]] int cuda_visible() const noexcept { return cuda_visible_; }
  /// Whether the device's actor runs (CUDA actors start on the first `client` call).
  [[nodiscard]] bool started(device_kind kind, int index = 0) const;
  [[nodiscard]] const runtime_config& config() const noexcept { return config_; }
  /// Every started device's statistics and report, and a table of them side by side
  /// (`report().table()`). Waits for each device's answer; a device that has shut down is listed
  /// with the reason. Not from a device strand (its own device would have to answer first).
  [[nodiscard]] runtime_report report() const;
  /// Every started device's snapshot (memory/snapshot.hpp), the host first, then the sim device,
  /// then the CUDA devices by index. `memory::to_pickle` writes them for PyTorch's memory viewer.
  /// A device that has shut down is left out (after `shutdown`, the list is empty). Not from a
  /// device strand.
  [[nodiscard]] std::vector<memory::memory_snapshot> snapshot() const;
  /// Starts (or stops) recording the trace of memory events on every device, those started later
  /// included: at most `max_entries` per device (see compute_client::record_memory_history).
  /// Devices that have shut down are passed over.
  void record_memory_history(bool enabled,
                             std::size_t max_entries = memory::memory_manager::default_history_entries) const;
  /// Every started device's gauges and counters in the OpenMetrics text format, for a server's
  /// /metrics: bytes reserved, in use, returning, held for streams and their peaks; reserves,
  /// failed reserves, maps, unmaps, driver allocations and frees, fences, stream waits, refusals
  /// by the device, cleanups, reclaims, each labelled with its device. Ends with "# EOF". A device
  /// that has shut down is left out (so after `shutdown` only the families' headers remain). Not
  /// from a device strand.
  [[nodiscard]] std::string metrics_text() const;

 private:
  std::shared_ptr<device_actor> make_actor(device_info info, memory::storage store,
                                           const memory::memory_layout& layout) const;
  [[nodiscard]] const std::shared_ptr<device_actor>* find(device_kind kind, int index) const;
  /// The actors started so far: the host, the sim device, then the CUDA devices by index.
  [[nodiscard]] std::vector<std::shared_ptr<device_actor>> started_actors() const;

  runtime_config config_;
  std::shared_ptr<spdlog::logger> log_;
  boost::asio::thread_pool* completions_ = nullptr;  // process-wide, never stopped
  std::chrono::microseconds idle_spin_{0};
  memory::memory_layout cuda_layout_;
  std::vector<int> cuda_devices_;                // the usable CUDA devices, by CUDA index
  std::map<int, std::vector<int>> peer_access_;  // applied to a CUDA device when it is first used
  int cuda_visible_ = 0;                         // devices the CUDA runtime shows (0 without CUDA)
  // Guards actors_ and stopped_: CUDA actors are added by `client` from any thread.
  mutable std::mutex mutex_;
  mutable std::vector<std::shared_ptr<device_actor>> actors_;
  bool stopped_ = false;
  // record_memory_history's setting, for the devices that start later.
  mutable std::atomic<bool> history_on_{false};
  mutable std::atomic<std::size_t> history_entries_{memory::memory_manager::default_history_entries};
};

}  // namespace devrt::runtime
