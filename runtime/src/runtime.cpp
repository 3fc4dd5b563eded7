#include "devrt/runtime/runtime.hpp"

#ifdef DEVRT_WITH_CUDA
#include "devrt/devices/cuda_storage.hpp"
#endif

#include "devrt/devices/peer_access.hpp"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <algorithm>

namespace devrt::runtime {

namespace {

result<runtime_config> resolve_config(const runtime_options& opts) {
  env_lookup env = opts.use_environment ? env_lookup(process_env)
                                        : env_lookup([](const char*) { return std::optional<std::string>(); });
  auto cfg = load_config(opts.config_file, env);
  if (!cfg) return cfg;
  if (opts.persistent_memory) cfg->persistent_memory = *opts.persistent_memory;
  if (opts.log) cfg->log = *opts.log;
  if (opts.serve_in_place) cfg->serve_in_place = *opts.serve_in_place;
  if (opts.memory_limit) cfg->memory_limit = *opts.memory_limit;
  return cfg;
}

spdlog::level::level_enum spdlog_level(log_level l) {
  switch (l) {
    case log_level::disabled: return spdlog::level::off;
    case log_level::basic: return spdlog::level::info;
    case log_level::full: return spdlog::level::trace;
  }
  return spdlog::level::off;
}

// Completion handlers without an executor of their own run here. The pool is shared by every
// runtime of the process and never stopped, so a completion posted by a client that races the
// runtime's shutdown, or outlives it, still runs (and never runs inline in the caller).
boost::asio::thread_pool& completion_pool(std::size_t threads) {
  static auto* pool = new boost::asio::thread_pool(std::max<std::size_t>(threads, 1));  // NOLINT: lives to exit
  return *pool;
}

}  // namespace

runtime::runtime(runtime_options opts) {
  auto cfg = resolve_config(opts);
  if (!cfg) throw exception(std::move(cfg).err());
  config_ = *cfg;
  if (opts.cuda_devices) config_.cuda_devices = opts.cuda_devices;
  log_ = std::make_shared<spdlog::logger>("devrt", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  log_->set_level(spdlog_level(config_.log));
  log_->set_pattern("[%H:%M:%S.%e] [devrt] [%l] %v");
  completions_ = &completion_pool(opts.completion_threads);
  idle_spin_ = opts.idle_spin;
  cuda_layout_ = opts.cuda_layout;

  // The CUDA devices are chosen now and validated whether or not devrt has CUDA; their actors are
  // created by `client`, on first use.
  if (config_.cuda_devices) {
    for (std::size_t i = 0; i < config_.cuda_devices->size(); ++i) {
      const int d = (*config_.cuda_devices)[i];
      const bool repeated =
          std::find(config_.cuda_devices->begin(), config_.cuda_devices->begin() + static_cast<std::ptrdiff_t>(i), d) !=
          config_.cuda_devices->begin() + static_cast<std::ptrdiff_t>(i);
      if (d < 0 || repeated) {
        error e = error::make(errc::invalid_argument,
                              d < 0 ? "a CUDA device index is not negative (runtime_options::cuda_devices)"
                                    : "a CUDA device is listed twice (runtime_options::cuda_devices)");
        e.text = std::to_string(d);
        throw exception(e);
      }
    }
  }
  // Peer lists are checked for what needs no GPU now; the devices themselves on first use.
  for (const auto& [device, peers] : opts.peer_access) {
    if (auto v = devices::validate_peers(device, peers, std::nullopt); !v) throw exception(std::move(v).err());
  }
  peer_access_ = opts.peer_access;
#ifdef DEVRT_WITH_CUDA
  if (opts.use_cuda) cuda_visible_ = devices::cuda_device_count();
#endif
  if (config_.cuda_devices) {
    for (const int d : *config_.cuda_devices) {
      if (d < cuda_visible_) cuda_devices_.push_back(d);
    }
    std::sort(cuda_devices_.begin(), cuda_devices_.end());
  } else {
    for (int d = 0; d < cuda_visible_; ++d) cuda_devices_.push_back(d);
  }

  try {
    actors_.push_back(make_actor(device_info{device_kind::host, 0, "host", {}},
                                 memory::storage::make<devices::host_storage>(opts.host), opts.host_layout));
    if (opts.sim) {
      actors_.push_back(make_actor(device_info{device_kind::sim, 0, "sim", {}},
                                   memory::storage::make<devices::sim_storage>(*opts.sim), opts.sim_layout));
    }
  } catch (...) {
    shutdown();
    throw;
  }
}

result<std::unique_ptr<runtime>> runtime::create(runtime_options opts) {
  try {
    return std::make_unique<runtime>(std::move(opts));
  } catch (const exception& e) {
    return e.err();
  }
}

runtime::~runtime() { shutdown(); }

std::shared_ptr<device_actor> runtime::make_actor(device_info info, memory::storage store,
                                                  const memory::memory_layout& layout) const {
  info.properties = store.properties();
  memory::manager_options opts{info.name, layout, config_.persistent_memory, std::nullopt};
  opts.reclaim_on_out_of_memory = true;  // one reclaim and one retry before a reserve fails
  if (config_.memory_limit) opts.memory_limit = config_.memory_limit->on(info.properties.capacity);
  auto manager = std::make_unique<memory::memory_manager>(std::move(store), std::move(opts));
  if (history_on_.load()) manager->record_history(true, history_entries_.load());
  return std::make_shared<device_actor>(std::move(info), std::move(manager), completions_->get_executor(), log_,
                                        actor_options{idle_spin_, config_.serve_in_place});
}

void runtime::shutdown() noexcept {
  std::vector<std::shared_ptr<device_actor>> actors;
  {
    std::lock_guard lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
    actors = actors_;
  }
  for (auto& a : actors) a->shutdown();
  // Completions already handed to the completion threads run there; nothing is dropped.
}

std::vector<std::shared_ptr<device_actor>> runtime::started_actors() const {
  std::vector<std::shared_ptr<device_actor>> actors;
  {
    std::lock_guard lock(mutex_);
    actors = actors_;
  }
  std::sort(actors.begin(), actors.end(), [](const auto& a, const auto& b) {
    return std::pair(static_cast<int>(a->info().kind), a->info().index) <
           std::pair(static_cast<int>(b->info().kind), b->info().index);
  });
  return actors;
}

const std::shared_ptr<device_actor>* runtime::find(device_kind kind, int index) const {
  for (const auto& a : actors_) {
    if (a->info().kind == kind && a->info().index == index) return &a;
  }
  return nullptr;
}

std::vector<device_info> runtime::devices() const {
  std::lock_guard lock(mutex_);
  std::vector<device_info> out;
  out.reserve(actors_.size() + cuda_devices_.size());
  for (const auto& a : actors_) {
    if (a->info().kind != device_kind::cuda) out.push_back(a->info());
  }
  for (const int d : cuda_devices_) {
    const auto* a = find(device_kind::cuda, d);
    out.push_back(a != nullptr ? (*a)->info() : device_info{device_kind::cuda, d, "cuda:" + std::to_string(d), {}});
  }
  return out;
}

int runtime::count(device_kind kind) const {
  if (kind == device_kind::cuda) return static_cast<int>(cuda_devices_.size());
  std::lock_guard lock(mutex_);
  int n = 0;
  for (const auto& a : actors_) n += a->info().kind == kind ? 1 : 0;
  return n;
}

bool runtime::started(device_kind kind, int index) const {
  std::lock_guard lock(mutex_);
  return find(kind, index) != nullptr;
}

compute_client runtime::client(device_kind kind, int index) const {
  std::lock_guard lock(mutex_);
  if (const auto* a = find(kind, index)) return compute_client(*a);
  auto missing = [&](const char* why) {
    error e = error::make(errc::not_found, why);
    e.text = std::string(to_string(kind)) + ":" + std::to_string(index);
    return exception(e);
  };
  if (kind != device_kind::cuda) throw missing("no device of that kind and index; runtime::devices() lists them");
#ifndef DEVRT_WITH_CUDA
  throw missing("no such CUDA device: devrt was built without CUDA; use runtime::host() or runtime::sim()");
#else
  if (index < 0 || index >= cuda_visible_) {
    throw missing(cuda_visible_ == 0 ? "no such CUDA device: no CUDA GPU or driver was found, or use_cuda is off "
                                       "(CUDA_VISIBLE_DEVICES applies); use runtime::host() or runtime::sim()"
                                     : "no such CUDA device: the index is past the devices the CUDA runtime shows "
                                       "(CUDA_VISIBLE_DEVICES applies); runtime::devices() lists them");
  }
  if (std::find(cuda_devices_.begin(), cuda_devices_.end(), index) == cuda_devices_.end()) {
    throw missing("the CUDA device is not among those chosen (runtime_options::cuda_devices, DEVRT_CUDA_DEVICES)");
  }
  if (stopped_) {
    throw exception(error::make(errc::shutdown, "the runtime shut down before this CUDA device was first used"));
  }
  // First use: the context, stream and actor of this device only. cuda_storage leaves the calling
  // thread's current device as it was.
  auto store = memory::storage::make<devices::cuda_storage>(index);
  if (auto p = peer_access_.find(index); p != peer_access_.end()) {
    if (auto r = store.backend<devices::cuda_storage>()->set_peer_access(p->second); !r) {
      throw exception(std::move(r).err());
    }
  }
  actors_.push_back(make_actor(device_info{device_kind::cuda, index, "cuda:" + std::to_string(index), {}},
                               std::move(store), cuda_layout_));
  return compute_client(actors_.back());
#endif
}

}  // namespace devrt::runtime
