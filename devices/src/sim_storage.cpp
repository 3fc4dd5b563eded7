#include "devrt/devices/sim_storage.hpp"

namespace devrt::devices {

sim_options sim_options::h200() {
  sim_options o;
  o.props.capacity = 150'109'880'320ULL;
  o.props.alignment = 512;
  o.props.max_page_size = o.props.capacity / 4;
  o.name = "sim-h200";
  return o;
}

sim_storage::sim_storage(sim_options opts) : opts_(std::move(opts)) {
  if (opts_.props.alignment == 0) opts_.props.alignment = 1;
}

result<memory::storage_handle> sim_storage::alloc(std::uint64_t size) {
  ++alloc_calls_;
  auto refuse = [&](const char* why) {
    error e = error::make(errc::out_of_memory, why);
    e.size = size;
    e.in_use = allocated_;
    e.limit = opts_.props.capacity;
    return e;
  };
  if (fail_at_ && alloc_calls_ == *fail_at_) {
    fail_at_.reset();
    return refuse("injected allocation failure");
  }
  const std::uint64_t cap = opts_.props.capacity;
  if (cap != 0 && (allocated_ > cap || size > cap - allocated_)) return refuse("simulated device capacity reached");
  const memory::storage_id id = next_id_++;
  pages_.emplace(id, size);
  allocated_ += size;
  peak_ = std::max(peak_, allocated_);
  ++allocations_;
  return memory::storage_handle{id, 0, size};
}

void sim_storage::dealloc(memory::storage_id id) { pending_.push_back(id); }

result<void> sim_storage::flush() {
  if (fail_flush_) {
    fail_flush_ = false;
    error e = error::make(errc::device_error, "injected flush failure");
    e.size = pending_.size();
    return e;
  }
  for (const memory::storage_id id : pending_) {
    auto it = pages_.find(id);
    if (it == pages_.end()) continue;
    allocated_ -= it->second;
    pages_.erase(it);
    ++frees_;
  }
  pending_.clear();
  return {};
}

result<memory::resource> sim_storage::get(const memory::storage_handle& h) {
  auto it = pages_.find(h.id);
  if (it == pages_.end()) return error::make(errc::not_found, "the simulated page does not exist");
  if (h.offset > it->second || h.size > it->second - h.offset) {
    error e = error::make(errc::invalid_argument, "the view ends past its simulated page");
    e.size = h.offset + h.size;
    e.limit = it->second;
    return e;
  }
  return memory::resource{nullptr, h.size, h};
}

result<void> sim_storage::write(const memory::storage_handle& h, const void* /*src*/) {
  auto r = get(h);
  if (!r) return std::move(r).err();
  return error::make(errc::invalid_argument, "the simulated device has no memory to write to");
}

result<void> sim_storage::read(const memory::storage_handle& h, void* /*dst*/) {
  auto r = get(h);
  if (!r) return std::move(r).err();
  return error::make(errc::invalid_argument, "the simulated device has no memory to read from");
}

}  // namespace devrt::devices
