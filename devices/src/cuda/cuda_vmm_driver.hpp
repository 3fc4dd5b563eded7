// The CUDA driver under the mapping state machine (vmm.hpp): address ranges, physical memory,
// mappings and their access for the device and its peers, each driver call timed in the storage's
// profile, and the ordering of unmaps behind the device's stream.
#pragma once

#include "../vmm.hpp"
#include "devrt/devices/cuda_storage.hpp"

namespace devrt::devices {

class cuda_storage::vmm_driver_impl final : public vmm_driver {
 public:
  explicit vmm_driver_impl(cuda_storage& owner) : s_(owner) {}
  result<std::uint64_t> reserve_addresses(std::uint64_t size) override;
  void free_addresses(std::uint64_t base, std::uint64_t size) noexcept override;
  result<std::uint64_t> create(std::uint64_t size) override;
  void release(std::uint64_t handle, std::uint64_t size) noexcept override;
  result<void> map(std::uint64_t at, std::uint64_t size, std::uint64_t handle) override;
  void unmap(std::uint64_t at, std::uint64_t size) noexcept override;
  [[nodiscard]] bool deferred() const noexcept override { return true; }
  [[nodiscard]] bool capturing() const noexcept override { return s_.capturing_; }
  result<memory::event> behind_device() override;
  result<bool> query(memory::event e) override;
  result<void> wait(memory::event e) override;
  void release_event(memory::event e) noexcept override;

 private:
  cuda_storage& s_;
};

}  // namespace devrt::devices
