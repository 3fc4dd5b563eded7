#include "devrt/runtime/runtime.hpp"

#ifdef DEVRT_WITH_CUDA
#include "devrt/devices/cuda_storage.hpp"
#endif

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace devrt::runtime {

namespace {

result<runtime_config> resolve_config(const runtime_options& opts) {
  env_lookup env = opts.use_environment ? env_lookup(process_env)
                                        : env_lookup([](const char*) { return std::optional<std::string>(); });
  auto cfg = load_config(opts.config_file, env);
  if (!cfg) return cfg;
  if (opts.persistent_memory) cfg->persistent_memory = *opts.persistent_memory;
  if (opts.log) cfg->log = *opts.log;
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
  log_ = std::make_shared<spdlog::logger>("devrt", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  log_->set_level(spdlog_level(config_.log));
  log_->set_pattern("[%H:%M:%S.%e] [devrt] [%l] %v");
  completions_ = &completion_pool(opts.completion_threads);

  try {
    add_device(device_info{device_kind::host, 0, "host", {}}, memory::storage::make<devices::host_storage>(opts.host),
               opts.host_layout, opts.idle_spin);
    if (opts.sim) {
      add_device(device_info{device_kind::sim, 0, "sim", {}}, memory::storage::make<devices::sim_storage>(*opts.sim),
                 opts.sim_layout, opts.idle_spin);
    }
#ifdef DEVRT_WITH_CUDA
    if (opts.use_cuda) {
      const int n = devices::cuda_device_count();
      for (int i = 0; i < n; ++i) {
        add_device(device_info{device_kind::cuda, i, "cuda:" + std::to_string(i), {}},
                   memory::storage::make<devices::cuda_storage>(i), opts.cuda_layout, opts.idle_spin);
      }
    }
#endif
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

void runtime::add_device(device_info info, memory::storage store, const memory::memory_layout& layout,
                         std::chrono::microseconds idle_spin) {
  info.properties = store.properties();
  auto manager = std::make_unique<memory::memory_manager>(
      std::move(store), memory::manager_options{info.name, layout, config_.persistent_memory, std::nullopt});
  actors_.push_back(std::make_shared<device_actor>(std::move(info), std::move(manager), completions_->get_executor(),
                                                   log_, idle_spin));
}

void runtime::shutdown() noexcept {
  if (stopped_) return;
  stopped_ = true;
  for (auto& a : actors_) a->shutdown();
  // Completions already handed to the completion threads run there; nothing is dropped.
}

std::vector<device_info> runtime::devices() const {
  std::vector<device_info> out;
  out.reserve(actors_.size());
  for (const auto& a : actors_) out.push_back(a->info());
  return out;
}

int runtime::count(device_kind kind) const {
  int n = 0;
  for (const auto& a : actors_) n += a->info().kind == kind ? 1 : 0;
  return n;
}

compute_client runtime::client(device_kind kind, int index) const {
  for (const auto& a : actors_) {
    if (a->info().kind == kind && a->info().index == index) return compute_client(a);
  }
  error e = error::make(errc::not_found, "no device of that kind and index; runtime::devices() lists them");
  e.text = std::string(to_string(kind)) + ":" + std::to_string(index);
  throw exception(e);
}

}  // namespace devrt::runtime
