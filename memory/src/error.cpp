#include "devrt/memory/error.hpp"

#include <fmt/format.h>
#include <string_view>

namespace devrt {

const char* to_string(errc c) noexcept {
  switch (c) {
    case errc::ok: return "ok";
    case errc::not_found: return "not_found";
    case errc::already_bound: return "already_bound";
    case errc::invalid_argument: return "invalid_argument";
    case errc::buffer_too_big: return "buffer_too_big";
    case errc::pool_capacity_exceeded: return "pool_capacity_exceeded";
    case errc::out_of_memory: return "out_of_memory";
    case errc::empty_pool_list: return "empty_pool_list";
    case errc::zero_size: return "zero_size";
    case errc::slice_larger_than_page: return "slice_larger_than_page";
    case errc::cap_smaller_than_page: return "cap_smaller_than_page";
    case errc::too_many_pages: return "too_many_pages";
    case errc::too_many_pools: return "too_many_pools";
    case errc::malformed_size: return "malformed_size";
    case errc::malformed_layout: return "malformed_layout";
    case errc::malformed_config: return "malformed_config";
    case errc::mapping_unsupported: return "mapping_unsupported";
    case errc::capture_active: return "capture_active";
    case errc::no_capture: return "no_capture";
    case errc::shutdown: return "shutdown";
    case errc::device_error: return "device_error";
    case errc::task_failed: return "task_failed";
    case errc::unsupported: return "unsupported";
    case errc::would_deadlock: return "would_deadlock";
    case errc::asleep: return "asleep";
  }
  return "unknown";
}

std::string error::message() const {
  const std::string where = text.empty() ? std::string() : fmt::format(" ({})", text);
  switch (code) {
    case errc::ok: return "no error";
    case errc::not_found:
      if (!text.empty()) return fmt::format("not found ({}): {}", text, detail);
      return fmt::format(
          "memory not found: {}; the handle may be stale (replaced by bind), never bound, or from "
          "another device",
          detail);
    case errc::already_bound: return fmt::format("{}: bind needs a fresh handle from memory_handle::make()", detail);
    case errc::invalid_argument:
      if (size != 0 || limit != 0) return fmt::format("invalid argument: {} ({} > {}){}", detail, size, limit, where);
      return fmt::format("invalid argument: {}{}", detail, where);
    case errc::buffer_too_big:
      if (detail[0] != '\0') {
        return fmt::format("cannot allocate {} bytes: {}: it takes {} bytes at most", size, detail, limit);
      }
      if (!text.empty()) {
        return fmt::format(
            "cannot allocate {} bytes: no pool of the layout accepts this size (the largest pool takes {} "
            "bytes, and the layout takes {}); use a layout whose pools take it",
            size, limit, text);
      }
      return fmt::format(
          "cannot allocate {} bytes: no pool of the layout accepts this size (the largest pool "
          "takes {} bytes); use a layout with a larger pool",
          size, limit);
    case errc::pool_capacity_exceeded:
      return fmt::format(
          "pool capacity exceeded: failed to reserve {} bytes, the pool is capped at {} bytes with {} "
          "bytes in use{}; free memory and retry, or raise the cap (a sliced pool's cap, an arena's space)",
          size, limit, in_use, detail[0] != '\0' ? fmt::format(" [{}]", detail) : std::string());
    case errc::out_of_memory:
      if (text == "memory limit") {
        return fmt::format(
                   "out of memory under devrt's memory limit: {} bytes cannot be served without taking the "
                   "memory the device holds for devrt ({} bytes) past the limit of {} bytes (memory comes in "
                   "whole pages or mappings of the layout); free memory or raise the limit",
                   size, in_use, limit) +
               fmt::format("{}{}", context.empty() ? "" : "\n",
                           std::string_view(context).substr(0, context.size() - (context.ends_with('\n') ? 1 : 0)));
      }
      return fmt::format(
                 "out of device memory: the device refused {} bytes{} ({} bytes held by devrt, device "
                 "capacity {}); free memory, run an explicit cleanup and retry",
                 size,
                 detail[0] != '\0'
                     ? fmt::format(" [{}{}]", detail, text.empty() || text == detail ? std::string() : ": " + text)
                     : std::string(),
                 in_use, limit) +
             fmt::format("{}{}", context.empty() ? "" : "\n",
                         std::string_view(context).substr(0, context.size() - (context.ends_with('\n') ? 1 : 0)));
    case errc::empty_pool_list: return "invalid layout: the pool list is empty";
    case errc::zero_size: return fmt::format("invalid layout{}: `{}` must be non-zero", where, detail);
    case errc::slice_larger_than_page:
      if (std::string_view(detail) == "max_alloc_size") {
        return fmt::format("invalid layout{}: max ({} bytes) is larger than the arena's address space ({} bytes)",
                           where, size, limit);
      }
      if (std::string_view(detail) == "page_size") {
        return fmt::format(
            "invalid layout{}: page_size ({} bytes) is larger than the device ({} bytes), and a page is "
            "allocated whole",
            where, size, limit);
      }
      return fmt::format("invalid layout{}: max_slice_size ({} bytes) is larger than page_size ({} bytes)", where, size,
                         limit);
    case errc::cap_smaller_than_page:
      return fmt::format(
          "invalid layout{}: max_pool_size ({} bytes) is smaller than page_size ({} bytes); a capped "
          "pool holds whole pages",
          where, size, limit);
    case errc::too_many_pages:
      return fmt::format(
          "invalid layout{}: max_pool_size allows {} pages, more than the {} one pool can hold; use "
          "larger pages",
          where, size, limit);
    case errc::too_many_pools:
      return fmt::format("invalid layout: {} pools given, at most {} are supported", size, limit);
    case errc::malformed_size:
      return fmt::format("malformed size '{}': {}; write a number of bytes such as 4096, 64MiB or 1.5GiB", text,
                         detail);
    case errc::malformed_layout: return fmt::format("malformed layout '{}': {}", text, detail);
    case errc::malformed_config: return fmt::format("malformed configuration '{}': {}", text, detail);
    case errc::mapping_unsupported:
      return fmt::format(
          "invalid layout{}: an arena pool maps memory into a reserved address range, and this device cannot; use "
          "sliced or exclusive pools (or the sub-slices preset) on it",
          where);
    case errc::capture_active: return fmt::format("not allowed during a capture: {}", detail);
    case errc::no_capture: return fmt::format("no capture window is open: {}", detail);
    case errc::shutdown: return fmt::format("the runtime is shut down: {}", detail);
    case errc::asleep:
      return fmt::format("cannot allocate {} bytes with tag '{}': the tag is asleep on this device; wake it first",
                         size, text);
    case errc::device_error: return fmt::format("device error: {}{}", detail, where);
    case errc::task_failed: return fmt::format("a submitted task failed: {}{}", detail, where);
    case errc::unsupported: return fmt::format("not supported by this device: {}{}", detail, where);
    case errc::would_deadlock:
      return fmt::format(
          "would deadlock: {}; a function given to submit runs on the device's thread, which serves the "
          "request only after the function returns: chain the request with a callback or wait outside submit",
          detail);
  }
  return "unknown devrt error";
}

}  // namespace devrt
