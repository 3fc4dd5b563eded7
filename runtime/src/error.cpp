#include "devrt/runtime/error.hpp"

// Boost.System categories have a protected non-virtual destructor by design.
#pragma GCC diagnostic ignored "-Wnon-virtual-dtor"

#include <string>

namespace devrt::runtime {

namespace {

constexpr boost::ulong_long_type category_id = 0x6465767274'0001ULL;

// What a code alone can say: the kind, in words, and what to do. No sizes: the code does not have
// them, and a sentence built from zero values ("cannot allocate 0 bytes") would lie.
const char* kind_message(errc c) noexcept {
  switch (c) {
    case errc::ok: return "no error";
    case errc::not_found:
      return "memory not found: the handle or binding is stale, never bound, or from another device";
    case errc::already_bound: return "already bound: bind needs a fresh handle from memory_handle::make()";
    case errc::invalid_argument: return "invalid argument";
    case errc::buffer_too_big: return "buffer too big: no pool of the layout accepts the requested size";
    case errc::pool_capacity_exceeded: return "pool capacity exceeded: free memory and retry, or raise the cap";
    case errc::out_of_memory:
      return "out of device memory: the device refused an allocation; free memory, run an explicit cleanup and retry";
    case errc::empty_pool_list:
    case errc::zero_size:
    case errc::slice_larger_than_page:
    case errc::cap_smaller_than_page:
    case errc::too_many_pages:
    case errc::too_many_pools:
    case errc::mapping_unsupported: return "invalid layout";
    case errc::malformed_size: return "malformed size";
    case errc::malformed_layout: return "malformed layout";
    case errc::malformed_config: return "malformed configuration";
    case errc::capture_active: return "not allowed during a capture";
    case errc::no_capture: return "no capture window is open";
    case errc::shutdown: return "the runtime is shut down";
    case errc::device_error: return "device error";
    case errc::task_failed: return "a submitted task failed";
    case errc::unsupported: return "not supported by this device";
    case errc::would_deadlock: return "would deadlock: a wait on the device's own thread";
    case errc::asleep: return "the tag is asleep";
  }
  return "unknown devrt error";
}

class devrt_category final : public boost::system::error_category {
 public:
  constexpr devrt_category() noexcept : boost::system::error_category(category_id) {}
  [[nodiscard]] const char* name() const noexcept override { return "devrt"; }
  [[nodiscard]] std::string message(int ev) const override {
    return std::string(kind_message(static_cast<errc>(ev))) + " (" + to_string(static_cast<errc>(ev)) + ")";
  }
};

const devrt_category instance;

}  // namespace

const boost::system::error_category& category() noexcept { return instance; }

boost::system::error_code make_error_code(errc c) noexcept { return {static_cast<int>(c), instance}; }

boost::system::error_code to_error_code(const error& e) noexcept {
  if (e.code == errc::ok) return {};
  return runtime::make_error_code(e.code);
}

errc to_errc(const boost::system::error_code& ec) noexcept {
  if (!ec) return errc::ok;
  if (ec.category() == instance) return static_cast<errc>(ec.value());
  return errc::device_error;
}

system_error::system_error(error e)
    : boost::system::system_error(runtime::make_error_code(e.code)),
      error_(std::make_shared<const error>(std::move(e))),
      message_(std::make_shared<const std::string>(error_->message())) {}

}  // namespace devrt::runtime
