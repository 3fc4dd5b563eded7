#include "devrt/devices/host_storage.hpp"

#include "devrt/devices/host_memory.hpp"

#include <sys/mman.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <string>

namespace devrt::devices {

namespace {
// Pages at least this large come from mmap: zero-filled by the kernel and committed lazily.
constexpr std::uint64_t mmap_threshold = 1ULL << 21;

}  // namespace

host_storage::host_storage(host_options opts) : opts_(opts) {
  if (opts_.capacity != 0) {
    limit_ = opts_.capacity;
  } else {
    host_memory m = host_memory_available();
    limit_ = m.bytes;
    bound_ = std::move(m.bound);
  }
  if (opts_.alignment == 0 || (opts_.alignment & (opts_.alignment - 1)) != 0 || opts_.alignment > 4096) {
    error e = error::make(errc::invalid_argument, "the host alignment must be a power of two no larger than 4096");
    e.size = opts_.alignment;
    throw exception(e);
  }
}

error host_storage::limit_reached(std::uint64_t size) const {
  error e = error::make(errc::out_of_memory,
                        opts_.capacity != 0 ? "host capacity reached" : "the host has no more memory for devrt");
  if (opts_.capacity == 0) e.text = "its bound, set when devrt started, is " + bound_;
  e.size = size;
  e.in_use = allocated_;
  e.limit = limit_;
  return e;
}

host_storage::~host_storage() {
  for (auto& [id, p] : pages_) release(p);
}

void host_storage::release(const page& p) noexcept {
  if (p.mapped) {
    ::munmap(p.ptr, p.size);
  } else {
    ::operator delete(p.ptr, std::align_val_t(opts_.alignment));
  }
}

result<memory::storage_handle> host_storage::alloc(std::uint64_t size) {
  auto refuse = [&](const char* why) {
    error e = error::make(errc::out_of_memory, why);
    e.size = size;
    e.in_use = allocated_;
    e.limit = limit_;
    return e;
  };
  if (!fits(size)) return limit_reached(size);
  page p{nullptr, size, false};
  if (size >= mmap_threshold) {
    void* m = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return refuse("mmap failed");
    p.ptr = m;
    p.mapped = true;
  } else {
    p.ptr = ::operator new(size == 0 ? 1 : size, std::align_val_t(opts_.alignment), std::nothrow);
    if (p.ptr == nullptr) return refuse("the system allocator refused");
    std::memset(p.ptr, 0, size);
  }
  const memory::storage_id id = next_id_++;
  pages_.emplace(id, p);
  allocated_ += size;
  return memory::storage_handle{id, 0, size};
}

void host_storage::dealloc(memory::storage_id id) { pending_.push_back(id); }

std::uint64_t host_storage::returning_bytes() const noexcept {
  std::uint64_t n = 0;
  for (const memory::storage_id id : pending_) {
    if (auto it = pages_.find(id); it != pages_.end())
      n += it->second.range ? it->second.range_mapped : it->second.size;
  }
  return n;
}

result<void> host_storage::flush() {
  for (const memory::storage_id id : pending_) {
    auto it = pages_.find(id);
    if (it == pages_.end()) continue;
    allocated_ -= it->second.range ? it->second.range_mapped : it->second.size;
    release(it->second);
    pages_.erase(it);
  }
  pending_.clear();
  return {};
}

result<memory::resource> host_storage::get(const memory::storage_handle& h) {
  auto it = pages_.find(h.id);
  if (it == pages_.end()) return error::make(errc::not_found, "the host page does not exist");
  if (h.offset > it->second.size || h.size > it->second.size - h.offset) {
    error e = error::make(errc::invalid_argument, "the view ends past its host page");
    e.size = h.offset + h.size;
    e.limit = it->second.size;
    return e;
  }
  return memory::resource{static_cast<std::byte*>(it->second.ptr) + h.offset, h.size, h};
}

result<void> host_storage::write(const memory::storage_handle& h, const void* src) {
  auto r = get(h);
  if (!r) return std::move(r).err();
  if (h.size != 0) std::memcpy(r->ptr, src, h.size);
  return {};
}

result<void> host_storage::read(const memory::storage_handle& h, void* dst) {
  auto r = get(h);
  if (!r) return std::move(r).err();
  if (h.size != 0) std::memcpy(dst, r->ptr, h.size);
  return {};
}

result<memory::storage_handle> host_storage::reserve_range(std::uint64_t size, std::uint64_t unit) {
  const std::uint64_t g = opts_.map_granularity;
  if (g == 0) return error::make(errc::unsupported, "this host device was created without a map granularity");
  if (unit == 0 || unit % g != 0 || size == 0 || size % unit != 0) {
    error e = error::make(errc::invalid_argument,
                          "an address range is a positive multiple of its unit, and the unit of the granularity");
    e.size = size;
    e.limit = unit;
    return e;
  }
  void* m = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    // No memory was asked for, only address space: the process's address space (a sanitizer's
    // layout, `ulimit -v`) has no free run this long. A smaller arena space may fit.
    const int err = errno;
    error e = error::make(errc::out_of_memory, "the system refused the address range");
    e.size = size;
    e.in_use = allocated_;
    e.limit = limit_;
    e.text = fmt::format("mmap of {} bytes of address space: {}; a smaller arena space (`arena:space=`) may fit", size,
                         std::strerror(err));
    return e;
  }
  const memory::storage_id id = next_id_++;
  pages_.emplace(id, page{m, size, true, true, 0, unit, std::vector<std::uint64_t>(size / unit, 0),
                          std::vector<std::uint8_t>(size / unit, 0)});
  return memory::storage_handle{id, 0, size};
}

host_storage::page* host_storage::find_range(memory::storage_id id, std::uint64_t offset, std::uint64_t size) {
  auto it = pages_.find(id);
  if (it == pages_.end() || !it->second.range) return nullptr;
  page& p = it->second;
  const std::uint64_t u = p.unit;
  if (size == 0 || offset % u != 0 || size % u != 0 || offset > p.size || size > p.size - offset) return nullptr;
  return &p;
}

result<void> host_storage::map(memory::storage_id range, std::uint64_t offset, std::uint64_t size) {
  if (auto it = pages_.find(range); it == pages_.end() || !it->second.range) {
    return error::make(errc::not_found, "the host address range does not exist");
  }
  page* p = find_range(range, offset, size);
  if (p == nullptr) {
    error e = error::make(errc::invalid_argument, "not whole units inside a reserved host address range");
    e.size = offset + size;
    return e;
  }
  for (std::uint64_t k = offset / p->unit; k < (offset + size) / p->unit; ++k) {
    if (p->unit_mapped[k] != 0) {
      error e = error::make(errc::invalid_argument, "the memory is mapped already");
      e.size = k * p->unit;
      return e;
    }
  }
  auto refuse = [&](const char* why) {
    error e = error::make(errc::out_of_memory, why);
    e.size = size;
    e.in_use = allocated_;
    e.limit = limit_;
    return e;
  };
  if (!fits(size)) return limit_reached(size);
  // A fixed mapping without MAP_NORESERVE over the granules (not mprotect, which would leave them
  // unaccounted): the kernel charges them to the commit limit, so under strict overcommit it
  // refuses here rather than killing the process when the pages are touched.
  void* at = static_cast<std::byte*>(p->ptr) + offset;
  if (::mmap(at, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
    return refuse("the system refused to commit the memory");
  }
  for (std::uint64_t k = offset / p->unit; k < (offset + size) / p->unit; ++k) p->unit_mapped[k] = 1;
  p->length[offset / p->unit] = size / p->unit;
  p->range_mapped += size;
  allocated_ += size;
  return {};
}

void host_storage::unmap(memory::storage_id range, std::uint64_t offset, std::uint64_t size) {
  page* p = find_range(range, offset, size);
  if (p == nullptr || p->length[offset / p->unit] * p->unit != size) return;  // not one earlier mapping
  p->length[offset / p->unit] = 0;
  for (std::uint64_t k = offset / p->unit; k < (offset + size) / p->unit; ++k) p->unit_mapped[k] = 0;
  void* at = static_cast<std::byte*>(p->ptr) + offset;
  // A fresh reservation over the granules: the pages and their commit charge go back to the
  // kernel at once; mapping them again gives zero-filled memory.
  ::mmap(at, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  p->range_mapped -= size;
  allocated_ -= size;
}

void host_storage::release_range(memory::storage_id range) { pending_.push_back(range); }

}  // namespace devrt::devices
