// runtime::snapshot and runtime::record_memory_history: every device's memory, block by block.
#include "devrt/runtime/runtime.hpp"

namespace devrt::runtime {

std::vector<memory::memory_snapshot> runtime::snapshot() const {
  const std::vector<std::shared_ptr<device_actor>> actors = started_actors();
  // Every device is asked first, then every answer awaited: the devices work at once.
  std::vector<decltype(std::declval<compute_client>().snapshot())> asked;
  asked.reserve(actors.size());
  for (const auto& a : actors) asked.push_back(compute_client(a).snapshot());
  std::vector<memory::memory_snapshot> out;
  for (std::size_t i = 0; i < actors.size(); ++i) {
    memory::memory_snapshot s;
    try {
      s = asked[i].get();
    } catch (const boost::system::system_error& e) {
      if (to_errc(e.code()) != errc::shutdown) throw;
      continue;  // a device that shut down has no memory to show: it is left out
    }
    const device_info& d = actors[i]->info();
    s.device = d.name;
    s.device_index = d.kind == device_kind::cuda ? d.index : -1;
    out.push_back(std::move(s));
  }
  return out;
}

void runtime::record_memory_history(bool enabled, std::size_t max_entries) const {
  history_entries_.store(max_entries);
  history_on_.store(enabled);
  const std::vector<std::shared_ptr<device_actor>> actors = started_actors();
  std::vector<decltype(std::declval<compute_client>().record_memory_history(true))> asked;
  asked.reserve(actors.size());
  for (const auto& a : actors) asked.push_back(compute_client(a).record_memory_history(enabled, max_entries));
  for (auto& f : asked) {
    try {
      f.get();
    } catch (const boost::system::system_error& e) {
      if (to_errc(e.code()) != errc::shutdown) throw;  // a device that shut down records nothing more
    }
  }
}

}  // namespace devrt::runtime
