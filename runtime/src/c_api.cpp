// The C interface (devrt/c_api.h): a runtime owned by the library, and a table from pointers to
// the handles that keep their memory.
//
// The table is sharded by pointer hash, each shard with its own mutex, so that threads allocating
// and freeing different pointers rarely meet on a lock. Each shard also remembers the pointers
// freed lately (and not allocated again since), which tells a double free from a pointer devrt
// never gave out. A shard is one flat open-addressing table and a ring of its latest frees: once
// warm, devrt_malloc and devrt_free allocate nothing on the heap (tests/c_api/heap_test.cpp).
//
// Lifetime: the running state is reached through one atomic pointer, read on every call without a
// lock. devrt_init and devrt_shutdown take the lifecycle mutex and must not overlap other calls
// (the header says so). The table itself is never destroyed: frameworks free their last tensors
// during process exit, after static destructors may have run, and those frees must find it.
// This file defines devrt_get_stats itself, so the header's macro for it stays off.
#define DEVRT_NO_STATS_MACRO
#include "devrt/c_api.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <boost/system/system_error.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "devrt/memory/config.hpp"
#include "devrt/memory/handle.hpp"
#include "devrt/memory/snapshot.hpp"
#include "devrt/memory/stream.hpp"
#include "devrt/memory/usage.hpp"
#include "devrt/runtime/compute_client.hpp"
#include "devrt/runtime/config.hpp"
#include "devrt/runtime/error.hpp"
#include "devrt/runtime/runtime.hpp"
#include "devrt/runtime/spin.hpp"
#include "devrt/runtime/tag.hpp"

namespace {

namespace rt = devrt::runtime;
namespace mem = devrt::memory;
using devrt::errc;

thread_local std::string last_error;

int fail(devrt_status s, std::string message) {
  last_error = std::move(message);
  return s;
}

/// The C status of a devrt error kind.
devrt_status status_of(errc c) noexcept {
  switch (c) {
    case errc::ok: return DEVRT_SUCCESS;
    case errc::out_of_memory:
    case errc::pool_capacity_exceeded: return DEVRT_ERROR_OUT_OF_MEMORY;
    case errc::buffer_too_big: return DEVRT_ERROR_NO_POOL;
    case errc::invalid_argument: return DEVRT_ERROR_INVALID_VALUE;
    case errc::shutdown: return DEVRT_ERROR_NOT_INITIALIZED;
    case errc::capture_active: return DEVRT_ERROR_BUSY;
    case errc::device_error: return DEVRT_ERROR_DEVICE;
    case errc::unsupported: return DEVRT_ERROR_UNSUPPORTED;
    case errc::asleep: return DEVRT_ERROR_ASLEEP;
    // A bad value of a DEVRT_* variable or of the config file: not a layout.
    case errc::malformed_config: return DEVRT_ERROR_INVALID_VALUE;
    default: return devrt::is_config_error(c) ? DEVRT_ERROR_INVALID_LAYOUT : DEVRT_ERROR_INTERNAL;
  }
}

/// The stream a C caller names: a cudaStream_t, where NULL (and 1) is CUDA's legacy default
/// stream and 2 the per-thread default stream, as in CUDA and PyTorch; DEVRT_STREAM_DEVICE (3)
/// is the device's own stream (devrt's).
mem::stream c_stream(void* s) noexcept { return mem::stream::native(s); }

/// What the table keeps per live pointer.
struct entry {
  mem::memory_handle handle;
  int device = 0;
  mem::stream_id stream = mem::streams::device;  ///< the stream the memory was allocated for
};

/// One shard of the pointer table: an open-addressing table (linear probing, removal by backward
/// shift) of the pointers given out, and of those freed lately and not allocated again since; a
/// ring lists the latter in the order of their frees. Nothing is allocated per call once the
/// table and the ring have grown to the shard's working set. Invariants: a pointer has at most
/// one record; a record is live (`freed_no` 0, the handle set) or freed (`freed_no` the number of
/// its free, no handle); a freed record is in the ring under its number, or gone.
struct alignas(64) shard {
  static constexpr std::size_t max_freed = 1024;  ///< freed pointers remembered per shard (65,536 in all)

  struct record {
    void* ptr = nullptr;  ///< nullptr: an empty slot
    entry e;
    std::uint64_t freed_no = 0;
  };
  struct freed_at {
    void* ptr = nullptr;
    std::uint64_t freed_no = 0;
  };

  /// Held for a probe and an update, a few dozen instructions (growing the table is the rare
  /// exception): a spin lock, whose release is a plain store.
  rt::spin_lock lock;

  /// The live record of `p`, or nullptr; valid until the shard changes.
  record* live(const void* p) noexcept {
    const std::size_t i = find(p);
    return i != npos && slots_[i].freed_no == 0 ? &slots_[i] : nullptr;
  }
  /// Whether `p` was freed lately (and not allocated again since).
  [[nodiscard]] bool freed_lately(const void* p) const noexcept {
    const std::size_t i = find(p);
    return i != npos && slots_[i].freed_no != 0;
  }
  /// Records `p` as live; nullptr, or the live record that `p` already has.
  entry* add(void* p, entry e) {
    if (std::size_t i = find(p); i != npos) {
      record& r = slots_[i];
      if (r.freed_no == 0) return &r.e;
      r.e = std::move(e);  // allocated again: a later free is no double free
      r.freed_no = 0;
      return nullptr;
    }
    if (2 * (used_ + 1) > slots_.size()) grow();
    std::size_t i = home(p);
    while (slots_[i].ptr != nullptr) i = (i + 1) & mask();
    slots_[i] = record{p, std::move(e), 0};
    ++used_;
    return nullptr;
  }
  /// Turns the live record `r` (from live()) into a freed one and returns its entry.
  entry take(record& r) {
    void* const p = r.ptr;
    entry out = std::move(r.e);
    r.e = entry{};
    r.freed_no = ++frees_;
    if (ring_.size() < max_freed) {
      if (ring_.capacity() < max_freed) ring_.reserve(max_freed);  // once: 16 KiB
      ring_.push_back({p, frees_});
    } else {
      freed_at& oldest = ring_[(frees_ - 1) % max_freed];  // the free max_freed before this one
      if (const std::size_t j = find(oldest.ptr); j != npos && slots_[j].freed_no == oldest.freed_no) erase(j);
      oldest = {p, frees_};
    }
    return out;
  }
  /// Empties the shard; the live entries are moved to `out` (to be released outside the lock).
  void clear(std::vector<record>& out) {
    out.swap(slots_);
    slots_.clear();
    ring_.clear();
    used_ = 0;
  }

 private:
  static constexpr std::size_t npos = ~std::size_t{0};

  [[nodiscard]] std::size_t mask() const noexcept { return slots_.size() - 1; }
  [[nodiscard]] std::size_t home(const void* p) const noexcept {
    auto v = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
    v ^= v >> 31;
    v *= 0xBF58476D1CE4E5B9ULL;
    v ^= v >> 29;
    return static_cast<std::size_t>(v) & mask();
  }
  [[nodiscard]] std::size_t find(const void* p) const noexcept {
    if (slots_.empty() || p == nullptr) return npos;
    for (std::size_t i = home(p);; i = (i + 1) & mask()) {
      if (slots_[i].ptr == p) return i;
      if (slots_[i].ptr == nullptr) return npos;
    }
  }
  /// Removes slot `i`, moving later records of its probe run back (no tombstones).
  void erase(std::size_t i) noexcept {
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask(); slots_[j].ptr != nullptr; j = (j + 1) & mask()) {
      const std::size_t h = home(slots_[j].ptr);
      // slot j may fill the hole when its home is not in (hole, j], cyclically
      if (((j - h) & mask()) >= ((j - hole) & mask())) {
        slots_[hole] = std::move(slots_[j]);
        hole = j;
      }
    }
    slots_[hole] = record{};
    --used_;
  }
  void grow() {
    std::vector<record> old(std::max<std::size_t>(64, 2 * slots_.size()));
    old.swap(slots_);
    for (record& r : old) {
      if (r.ptr == nullptr) continue;
      std::size_t i = home(r.ptr);
      while (slots_[i].ptr != nullptr) i = (i + 1) & mask();
      slots_[i] = std::move(r);
    }
  }

  std::vector<record> slots_;  // a power of two in size, at most half full
  std::size_t used_ = 0;
  std::vector<freed_at> ring_;  // up to max_freed, then the oldest is replaced
  std::uint64_t frees_ = 0;
};

constexpr std::size_t shard_count = 64;  // a power of two

class pointer_table {
 public:
  shard& of(const void* p) noexcept {
    auto v = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p));
    v ^= v >> 29;  // allocations are aligned: mix the high bits in before the multiply
    v *= 0x9E3779B97F4A7C15ULL;
    return shards_[v >> 58];  // the top 6 bits: 64 shards
  }
  /// Drops every entry (at shutdown); the handles are released outside the locks.
  void clear() {
    for (auto& s : shards_) {
      std::vector<shard::record> gone;
      {
        const std::lock_guard<rt::spin_lock> g(s.lock);
        s.clear(gone);
      }
    }
  }

 private:
  std::array<shard, shard_count> shards_;
};
static_assert(std::has_single_bit(shard_count));

pointer_table& table() {
  static auto* const t = new pointer_table();  // never destroyed: see the top of the file
  return *t;
}

struct device_ctx {
  rt::compute_client client;
  std::string name;
  std::atomic<std::uint64_t> oom_errors{0};
};

/// A CUDA device of the C interface, by CUDA index: its client is made on the first call that
/// names it (so a process that uses one GPU opens a context on that one only).
struct cuda_slot {
  std::once_flag once;
  std::unique_ptr<device_ctx> ctx;
  std::string failure;                        // why it could not be started (then every call says so)
  std::atomic<device_ctx*> started{nullptr};  // ctx once it is made (read without the once_flag)
};

constexpr int max_cuda_devices = 64;

struct state {
  std::unique_ptr<rt::runtime> runtime;
  std::unique_ptr<device_ctx> host;
  int visible = 0;          // CUDA devices the CUDA runtime shows (indices 0..visible-1)
  std::vector<int> chosen;  // those devrt may use (DEVRT_CUDA_DEVICES, use_cuda)
  std::array<cuda_slot, max_cuda_devices> cuda;

  /// The device of a C index (CUDA's numbering), or nullptr with the error set.
  device_ctx* device(int index, const char* what) {
    if (index == DEVRT_HOST_DEVICE) return host.get();
    const bool listed = std::find(chosen.begin(), chosen.end(), index) != chosen.end();
    if (index < 0 || index >= max_cuda_devices || !listed) {
      std::string which;
      for (const int c : chosen) which += (which.empty() ? "" : ",") + std::to_string(c);
      if (chosen.empty()) {
        (void)fail(DEVRT_ERROR_INVALID_DEVICE,
                   fmt::format("{}: device {} does not exist: devrt uses no CUDA device (built without CUDA, "
                               "use_cuda off, DEVRT_CUDA_DEVICES=none, or no GPU found), so -1 (the host) is the only "
                               "device",
                               what, index));
      } else if (index >= 0 && index < visible) {
        (void)fail(DEVRT_ERROR_INVALID_DEVICE,
                   fmt::format("{}: CUDA device {} is not among the devices devrt uses ({}; DEVRT_CUDA_DEVICES or the "
                               "cuda_devices setting chooses them)",
                               what, index, which));
      } else {
        (void)fail(DEVRT_ERROR_INVALID_DEVICE,
                   fmt::format("{}: device {} does not exist: use -1 for the host or a CUDA index devrt uses ({})",
                               what, index, which));
      }
      return nullptr;
    }
    cuda_slot& slot = cuda[static_cast<std::size_t>(index)];
    std::call_once(slot.once, [&] {
      try {
        auto d = std::make_unique<device_ctx>();
        d->client = runtime->cuda(index);
        d->name = d->client.device().name;
        slot.ctx = std::move(d);
        slot.started.store(slot.ctx.get(), std::memory_order_release);
      } catch (const std::exception& e) {
        slot.failure = e.what();
      }
    });
    if (slot.ctx == nullptr) {
      (void)fail(DEVRT_ERROR_DEVICE, fmt::format("{}: CUDA device {} could not be started: {}", what, index,
                                                 slot.failure.empty() ? "unknown reason" : slot.failure));
      return nullptr;
    }
    return slot.ctx.get();
  }
};

std::mutex lifecycle;
std::atomic<state*> current{nullptr};
bool ever_started = false;  // under `lifecycle`

int start(const devrt_options& o, state** out) {
  if (o.version != DEVRT_C_API_VERSION) {
    return fail(DEVRT_ERROR_INVALID_VALUE,
                fmt::format("devrt_init: options of version {}, this library reads version {}; fill them "
                            "with devrt_options_default",
                            o.version, DEVRT_C_API_VERSION));
  }
  rt::runtime_options ro;
  ro.use_cuda = o.use_cuda != 0;
  ro.use_environment = o.use_environment != 0;
  ro.host.capacity = o.host_capacity;
  const auto layout = [](const char* text, const char* which, mem::memory_layout& to) -> int {
    if (text == nullptr) return DEVRT_SUCCESS;
    auto l = mem::parse_layout(text);
    if (!l) {
      return fail(DEVRT_ERROR_INVALID_LAYOUT, fmt::format("devrt_init: {} \"{}\": {}", which, text, l.err().message()));
    }
    to = std::move(l).value();
    return DEVRT_SUCCESS;
  };
  if (int r = layout(o.host_layout, "host_layout", ro.host_layout); r != DEVRT_SUCCESS) return r;
  if (int r = layout(o.cuda_layout, "cuda_layout", ro.cuda_layout); r != DEVRT_SUCCESS) return r;
  if (o.log_level != nullptr) {
    auto level = rt::parse_log_level(o.log_level);
    if (!level) {
      return fail(DEVRT_ERROR_INVALID_VALUE,
                  fmt::format("devrt_init: log_level \"{}\": {}", o.log_level, level.err().message()));
    }
    ro.log = *level;
  }
  auto made = rt::runtime::create(std::move(ro));
  if (!made) return fail(status_of(made.code()), fmt::format("devrt_init: {}", made.err().message()));

  auto s = std::make_unique<state>();
  s->runtime = std::move(made).value();
  s->host = std::make_unique<device_ctx>();
  s->host->client = s->runtime->host();
  s->host->name = "host";
  for (const auto& info : s->runtime->devices()) {
    if (info.kind == rt::device_kind::cuda) s->chosen.push_back(info.index);
  }
  s->visible = s->runtime->cuda_visible();
  ever_started = true;
  *out = s.release();
  current.store(*out, std::memory_order_release);
  return DEVRT_SUCCESS;
}

/// The running state: started with the defaults on first use, unless devrt was shut down.
int acquire(state** out) {
  *out = current.load(std::memory_order_acquire);
  if (*out != nullptr) return DEVRT_SUCCESS;
  const std::lock_guard<std::mutex> g(lifecycle);
  *out = current.load(std::memory_order_acquire);
  if (*out != nullptr) return DEVRT_SUCCESS;
  if (ever_started) {
    return fail(DEVRT_ERROR_NOT_INITIALIZED, "devrt was shut down (devrt_shutdown); call devrt_init to start it again");
  }
  devrt_options o;
  devrt_options_default(&o);
  return start(o, out);
}

int internal_error(const char* what, const char* why) {
  return fail(DEVRT_ERROR_INTERNAL,
              fmt::format("{}: unexpected failure inside devrt ({}); please report it", what, why));
}

// The bodies below may throw (allocation of table nodes or messages); `guarded` turns any
// exception into DEVRT_ERROR_INTERNAL so that none crosses the C boundary.
template <class F>
int guarded(const char* what, F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return fail(DEVRT_ERROR_OUT_OF_MEMORY, fmt::format("{}: out of host memory for devrt's bookkeeping", what));
  } catch (const std::exception& e) {
    try {
      return internal_error(what, e.what());
    } catch (...) {
      return DEVRT_ERROR_INTERNAL;
    }
  } catch (...) {
    return DEVRT_ERROR_INTERNAL;
  }
}

int do_malloc(void** ptr, std::size_t size, int device, mem::stream stream, const char* what) {
  if (ptr == nullptr) {
    return fail(DEVRT_ERROR_INVALID_VALUE,
                fmt::format("{}: the out-pointer is NULL; pass the address of a void* to receive the memory", what));
  }
  *ptr = nullptr;
  if (size > DEVRT_MAX_ALLOCATION_SIZE) {
    return fail(DEVRT_ERROR_SIZE_TOO_LARGE,
                fmt::format("{}: size {} is larger than devrt allocates ({} bytes, 2^62); a negative size "
                            "converted to size_t looks like this",
                            what, size, DEVRT_MAX_ALLOCATION_SIZE));
  }
  state* s = nullptr;
  if (int r = acquire(&s); r != DEVRT_SUCCESS) return r;
  device_ctx* d = s->device(device, what);
  if (d == nullptr) return DEVRT_ERROR_INVALID_DEVICE;

  mem::memory_handle h;
  try {
    h = d->client.reserve(size, stream).get();
  } catch (const boost::system::system_error& e) {
    const devrt_status st = status_of(rt::to_errc(e.code()));
    if (st == DEVRT_ERROR_OUT_OF_MEMORY) d->oom_errors.fetch_add(1, std::memory_order_relaxed);
    return fail(st, fmt::format("{}: {} bytes on {}: {}", what, size, d->name, e.what()));
  }
  void* p = h.ptr();
  if (p == nullptr) return internal_error(what, "the device gave no address");
  {
    shard& sh = table().of(p);
    const std::lock_guard<rt::spin_lock> g(sh.lock);
    // The handle moves into the table: no count to raise and drop on the slice's descriptor.
    if (const entry* twice = sh.add(p, entry{std::move(h), device, stream.id()})) {
      return fail(DEVRT_ERROR_INTERNAL, fmt::format("{}: devrt gave out {} twice (live on device {}); please report it",
                                                    what, p, twice->device));
    }
  }
  *ptr = p;
  return DEVRT_SUCCESS;
}

int do_free(void* ptr, int device, mem::stream stream, const char* what) {
  if (ptr == nullptr) return DEVRT_SUCCESS;
  state* s = nullptr;
  if (int r = acquire(&s); r != DEVRT_SUCCESS) return r;
  entry e;
  mem::memory_handle held;
  {
    shard& sh = table().of(ptr);
    const std::lock_guard<rt::spin_lock> g(sh.lock);
    shard::record* r = sh.live(ptr);
    if (r == nullptr) {
      if (sh.freed_lately(ptr)) {
        return fail(DEVRT_ERROR_DOUBLE_FREE,
                    fmt::format("{}: {} was freed already (device {}); free each pointer once", what, ptr, device));
      }
      return fail(DEVRT_ERROR_UNKNOWN_POINTER,
                  fmt::format("{}: {} was not allocated by devrt_malloc (device {}); free it with the allocator "
                              "that gave it out",
                              what, ptr, device));
    }
    if (r->e.device != device) {
      return fail(DEVRT_ERROR_INVALID_DEVICE,
                  fmt::format("{}: {} belongs to device {}, not to device {}; free it on its own device", what, ptr,
                              r->e.device, device));
    }
    // The common case, freed on the stream it was allocated for: taken out in this one visit.
    if (stream.id() == r->e.stream) {
      e = sh.take(*r);
    } else {
      held = r->e.handle;
    }
  }
  if (held) {
    // Freed on another stream than the one it was allocated for: that stream's work must pass
    // before anyone else gets the memory. Marked (and checked) before anything changes, so a
    // failure leaves the pointer allocated.
    device_ctx* d = s->device(device, what);
    if (d == nullptr) return DEVRT_ERROR_INVALID_DEVICE;
    try {
      d->client.record_stream(held, stream).get();
    } catch (const boost::system::system_error& err) {
      return fail(status_of(rt::to_errc(err.code())),
                  fmt::format("{}: {} on {}: the stream it is freed on cannot be tracked: {}; the pointer stays "
                              "allocated",
                              what, ptr, d->name, err.what()));
    }
    held.reset();
    shard& sh = table().of(ptr);
    const std::lock_guard<rt::spin_lock> g(sh.lock);
    shard::record* r = sh.live(ptr);
    if (r == nullptr) {
      return fail(DEVRT_ERROR_DOUBLE_FREE,
                  fmt::format("{}: {} was freed by another thread meanwhile (device {}); free each pointer once", what,
                              ptr, device));
    }
    e = sh.take(*r);
  }
  e.handle.reset();  // the free: in stream order on its stream (and the one recorded above)
  return DEVRT_SUCCESS;
}

int do_record_stream(void* ptr, mem::stream stream, const char* what) {
  state* s = nullptr;
  if (int r = acquire(&s); r != DEVRT_SUCCESS) return r;
  mem::memory_handle h;
  int device = 0;
  {
    shard& sh = table().of(ptr);
    const std::lock_guard<rt::spin_lock> g(sh.lock);
    const shard::record* r = sh.live(ptr);
    if (r == nullptr) {
      return fail(DEVRT_ERROR_UNKNOWN_POINTER,
                  fmt::format("{}: {} is not memory devrt_malloc gave out and that is still live", what, ptr));
    }
    h = r->e.handle;
    device = r->e.device;
  }
  device_ctx* d = s->device(device, what);
  if (d == nullptr) return DEVRT_ERROR_INVALID_DEVICE;
  try {
    d->client.record_stream(h, stream).get();
  } catch (const boost::system::system_error& e) {
    return fail(status_of(rt::to_errc(e.code())), fmt::format("{}: {} on {}: {}", what, ptr, d->name, e.what()));
  }
  return DEVRT_SUCCESS;
}

/// Runs `op(client)` (an operation whose future's get() throws system_error) for a device.
template <class Op>
int on_device(int device, const char* what, Op&& op) {
  state* s = nullptr;
  if (int r = acquire(&s); r != DEVRT_SUCCESS) return r;
  device_ctx* d = s->device(device, what);
  if (d == nullptr) return DEVRT_ERROR_INVALID_DEVICE;
  try {
    return op(*d);
  } catch (const boost::system::system_error& e) {
    return fail(status_of(rt::to_errc(e.code())), fmt::format("{} on {}: {}", what, d->name, e.what()));
  }
}

/// The exception devrt_torch_malloc throws: PyTorch does not check the pointer its allocator
/// returns, but it turns an exception into a Python error with this message.
class torch_out_of_memory : public std::bad_alloc {
 public:
  explicit torch_out_of_memory(std::string m) : message_(std::move(m)) {}
  [[nodiscard]] const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

/// The tag a sleep or wake names: not NULL, not empty, well formed.
int sleep_tag_of(const char* tag, const char* what, std::string_view& out) {
  if (tag == nullptr || *tag == '\0') {
    return fail(DEVRT_ERROR_INVALID_VALUE, fmt::format("{}: the tag is NULL or empty; name the tag to {}", what,
                                                       std::string_view(what) == "devrt_sleep" ? "sleep" : "wake"));
  }
  out = tag;
  if (auto n = mem::tag_name::make(out); !n) {
    return fail(DEVRT_ERROR_INVALID_VALUE, fmt::format("{}: {}", what, n.err().message()));
  }
  return DEVRT_SUCCESS;
}

int tag_call(int device, const char* tag, const char* what, bool sleep, bool keep) {
  std::string_view name;
  if (int r = sleep_tag_of(tag, what, name); r != DEVRT_SUCCESS) return r;
  return on_device(device, what, [&](device_ctx& d) {
    try {
      if (sleep) {
        d.client.sleep(name, keep).get();
      } else {
        d.client.wake(name).get();
      }
    } catch (const boost::system::system_error& e) {
      const devrt_status st = status_of(rt::to_errc(e.code()));
      if (st == DEVRT_ERROR_OUT_OF_MEMORY) d.oom_errors.fetch_add(1, std::memory_order_relaxed);
      return fail(st, fmt::format("{}: tag '{}' on {}: {}", what, name, d.name, e.what()));
    }
    return static_cast<int>(DEVRT_SUCCESS);
  });
}

}  // namespace

extern "C" {

void devrt_options_default(devrt_options* options) {
  if (options == nullptr) return;
  *options = devrt_options{};
  options->version = DEVRT_C_API_VERSION;
  options->use_cuda = 1;
  options->use_environment = 1;
}

int devrt_init(const devrt_options* options) {
  return guarded("devrt_init", [&] {
    const std::lock_guard<std::mutex> g(lifecycle);
    if (current.load(std::memory_order_acquire) != nullptr) {
      return fail(DEVRT_ERROR_ALREADY_INITIALIZED,
                  "devrt_init: devrt runs already (started by devrt_init or by the first call of another "
                  "function); call devrt_init first, or devrt_shutdown before it");
    }
    devrt_options o;
    devrt_options_default(&o);
    if (options != nullptr) o = *options;
    state* s = nullptr;
    return start(o, &s);
  });
}

int devrt_shutdown(void) {
  return guarded("devrt_shutdown", [&] {
    const std::lock_guard<std::mutex> g(lifecycle);
    state* s = current.exchange(nullptr, std::memory_order_acq_rel);
    if (s == nullptr) return static_cast<int>(DEVRT_SUCCESS);
    const std::unique_ptr<state> gone(s);
    table().clear();  // frees every allocation still live, then the runtime stops
    s->runtime->shutdown();
    return static_cast<int>(DEVRT_SUCCESS);
  });
}

int devrt_is_initialized(void) { return current.load(std::memory_order_acquire) != nullptr ? 1 : 0; }

const char* devrt_last_error(void) { return last_error.c_str(); }

const char* devrt_status_name(int status) {
  switch (status) {
    case DEVRT_SUCCESS: return "DEVRT_SUCCESS";
    case DEVRT_ERROR_OUT_OF_MEMORY: return "DEVRT_ERROR_OUT_OF_MEMORY";
    case DEVRT_ERROR_INVALID_VALUE: return "DEVRT_ERROR_INVALID_VALUE";
    case DEVRT_ERROR_UNKNOWN_POINTER: return "DEVRT_ERROR_UNKNOWN_POINTER";
    case DEVRT_ERROR_INVALID_DEVICE: return "DEVRT_ERROR_INVALID_DEVICE";
    case DEVRT_ERROR_DOUBLE_FREE: return "DEVRT_ERROR_DOUBLE_FREE";
    case DEVRT_ERROR_SIZE_TOO_LARGE: return "DEVRT_ERROR_SIZE_TOO_LARGE";
    case DEVRT_ERROR_NO_POOL: return "DEVRT_ERROR_NO_POOL";
    case DEVRT_ERROR_INVALID_LAYOUT: return "DEVRT_ERROR_INVALID_LAYOUT";
    case DEVRT_ERROR_BUSY: return "DEVRT_ERROR_BUSY";
    case DEVRT_ERROR_NOT_INITIALIZED: return "DEVRT_ERROR_NOT_INITIALIZED";
    case DEVRT_ERROR_ALREADY_INITIALIZED: return "DEVRT_ERROR_ALREADY_INITIALIZED";
    case DEVRT_ERROR_DEVICE: return "DEVRT_ERROR_DEVICE";
    case DEVRT_ERROR_INTERNAL: return "DEVRT_ERROR_INTERNAL";
    case DEVRT_ERROR_ASLEEP: return "DEVRT_ERROR_ASLEEP";
    case DEVRT_ERROR_UNSUPPORTED: return "DEVRT_ERROR_UNSUPPORTED";
    default: return "DEVRT_ERROR_UNKNOWN_STATUS";
  }
}

int devrt_device_count(int* count) {
  return guarded("devrt_device_count", [&] {
    if (count == nullptr) return fail(DEVRT_ERROR_INVALID_VALUE, "devrt_device_count: the out-pointer is NULL");
    state* s = nullptr;
    if (int r = acquire(&s); r != DEVRT_SUCCESS) return r;
    *count = s->chosen.empty() ? 0 : s->visible;
    return static_cast<int>(DEVRT_SUCCESS);
  });
}

int devrt_malloc(void** ptr, size_t size, int device, void* stream) {
  return guarded("devrt_malloc", [&] { return do_malloc(ptr, size, device, c_stream(stream), "devrt_malloc"); });
}

int devrt_free(void* ptr, int device, void* stream) {
  return guarded("devrt_free", [&] { return do_free(ptr, device, c_stream(stream), "devrt_free"); });
}

int devrt_record_stream(void* ptr, void* stream) {
  return guarded("devrt_record_stream", [&] { return do_record_stream(ptr, c_stream(stream), "devrt_record_stream"); });
}

int devrt_retire_stream(int device, void* stream) {
  return guarded("devrt_retire_stream", [&] {
    return on_device(device, "devrt_retire_stream", [&](device_ctx& d) {
      d.client.retire_stream(c_stream(stream)).get();
      return static_cast<int>(DEVRT_SUCCESS);
    });
  });
}

int devrt_allocation_size(void* ptr, size_t* size) {
  return guarded("devrt_allocation_size", [&] {
    if (size == nullptr) return fail(DEVRT_ERROR_INVALID_VALUE, "devrt_allocation_size: the out-pointer is NULL");
    // After a shutdown no pointer is live: say so, as every other call does.
    state* s = nullptr;
    if (int r = acquire(&s); r != DEVRT_SUCCESS) return r;
    shard& sh = table().of(ptr);
    const std::lock_guard<rt::spin_lock> g(sh.lock);
    const shard::record* r = sh.live(ptr);
    if (r == nullptr) {
      return fail(
          DEVRT_ERROR_UNKNOWN_POINTER,
          fmt::format("devrt_allocation_size: {} is not memory devrt_malloc gave out and that is still live", ptr));
    }
    *size = static_cast<size_t>(r->e.handle.size());
    return static_cast<int>(DEVRT_SUCCESS);
  });
}

int devrt_get_stats(int device, devrt_stats* stats) { return devrt_get_stats_v(device, stats, 1); }

int devrt_get_stats_v(int device, devrt_stats* stats, int version) {
  return guarded("devrt_get_stats", [&] {
    if (stats == nullptr) return fail(DEVRT_ERROR_INVALID_VALUE, "devrt_get_stats: the out-pointer is NULL");
    if (version < 1 || version > DEVRT_STATS_VERSION) {
      return fail(DEVRT_ERROR_INVALID_VALUE, fmt::format("devrt_get_stats_v: version {} of devrt_stats is unknown "
                                                         "(this library has versions 1 to {})",
                                                         version, DEVRT_STATS_VERSION));
    }
    return on_device(device, "devrt_get_stats", [&](device_ctx& d) {
      using both = std::pair<mem::memory_statistics, mem::memory_usage>;
      // One message: the statistics and the live count seen at the same point of the strand.
      const both b = d.client
                         .async_run<both>(
                             [](rt::actor_core& c) {
                               const mem::memory_statistics st = c.manager().statistics();
                               return devrt::result<both>(both{st, c.manager().usage()});
                             },
                             rt::use_future_t{})
                         .get();
      const auto& st = b.first;
      devrt_stats out{};
      out.reserved_bytes = st.bytes_reserved;
      out.peak_reserved_bytes = st.peak_bytes_reserved;
      out.in_use_bytes = st.bytes_in_use;
      out.peak_in_use_bytes = st.peak_bytes_in_use;
      out.live_allocations = b.second.number_allocs;
      out.allocations = st.reserves;
      out.frees = st.reserves >= b.second.number_allocs ? st.reserves - b.second.number_allocs : 0;
      out.failed_allocations = st.failed_reserves;
      out.out_of_memory_errors = d.oom_errors.load(std::memory_order_relaxed);
      out.driver_allocs = st.driver_allocs;
      out.driver_frees = st.driver_frees;
      out.maps = st.maps;
      out.unmaps = st.unmaps;
      out.device_refusals = st.out_of_memory;
      out.cleanups = st.cleanups;
      out.reclaims = st.reclaims;
      out.stream_waits = st.stream_waits;
      out.fences = st.fences;
      out.streams = st.streams;
      out.sleeping_bytes = st.bytes_sleeping;
      out.offloaded_bytes = st.bytes_offloaded;
      out.sleeps = st.sleeps;
      out.wakes = st.wakes;
      out.host_cached_bytes = st.bytes_host_cached;
      out.peak_busy_bytes = st.peak_bytes_busy;
      // A caller of an older version has room for its fields only.
      const std::size_t room = version == 1   ? offsetof(devrt_stats, sleeping_bytes)
                               : version == 2 ? offsetof(devrt_stats, host_cached_bytes)
                               : version == 3 ? offsetof(devrt_stats, peak_busy_bytes)
                                              : sizeof(devrt_stats);
      std::memcpy(stats, &out, room);
      return static_cast<int>(DEVRT_SUCCESS);
    });
  });
}

int devrt_set_tag(const char* tag) {
  return guarded("devrt_set_tag", [&] {
    const std::string_view text = tag == nullptr ? std::string_view() : std::string_view(tag);
    auto name = mem::tag_name::make(text);
    if (!name) return fail(DEVRT_ERROR_INVALID_VALUE, fmt::format("devrt_set_tag: {}", name.err().message()));
    if (auto r = rt::set_current_tag(*name); !r) {
      return fail(DEVRT_ERROR_INVALID_VALUE, fmt::format("devrt_set_tag: {}", r.err().message()));
    }
    return static_cast<int>(DEVRT_SUCCESS);
  });
}

const char* devrt_get_tag(void) {
  const mem::tag_name& t = rt::current_tag();
  return t.empty() ? nullptr : t.c_str();
}

int devrt_sleep(int device, const char* tag, int keep_contents) {
  return guarded("devrt_sleep", [&] { return tag_call(device, tag, "devrt_sleep", true, keep_contents != 0); });
}

int devrt_wake(int device, const char* tag) {
  return guarded("devrt_wake", [&] { return tag_call(device, tag, "devrt_wake", false, false); });
}

int devrt_set_memory_limit(int device, uint64_t bytes) {
  return guarded("devrt_set_memory_limit", [&] {
    return on_device(device, "devrt_set_memory_limit", [&](device_ctx& d) {
      d.client.set_memory_limit(bytes).get();
      return static_cast<int>(DEVRT_SUCCESS);
    });
  });
}

int devrt_get_memory_limit(int device, uint64_t* bytes) {
  return guarded("devrt_get_memory_limit", [&] {
    if (bytes == nullptr) return fail(DEVRT_ERROR_INVALID_VALUE, "devrt_get_memory_limit: the out-pointer is NULL");
    return on_device(device, "devrt_get_memory_limit", [&](device_ctx& d) {
      *bytes = d.client.memory_limit().get();
      return static_cast<int>(DEVRT_SUCCESS);
    });
  });
}

int devrt_release_host_copies(int device, uint64_t* released) {
  return guarded("devrt_release_host_copies", [&] {
    return on_device(device, "devrt_release_host_copies", [&](device_ctx& d) {
      const std::uint64_t n = d.client.release_host_copies().get();
      if (released != nullptr) *released = n;
      return static_cast<int>(DEVRT_SUCCESS);
    });
  });
}

int devrt_reset_peak_stats(int device) {
  return guarded("devrt_reset_peak_stats", [&] {
    return on_device(device, "devrt_reset_peak_stats", [](device_ctx& d) {
      d.client.reset_peak_statistics().get();
      return static_cast<int>(DEVRT_SUCCESS);
    });
  });
}

int devrt_empty_cache(int device) {
  return guarded("devrt_empty_cache", [&] {
    return on_device(device, "devrt_empty_cache", [](device_ctx& d) {
      d.client.cleanup().get();
      return static_cast<int>(DEVRT_SUCCESS);
    });
  });
}

int devrt_record_memory_history(int enabled, size_t max_entries) {
  return guarded("devrt_record_memory_history", [&] {
    if (enabled != 0 && enabled != 1) {
      return fail(DEVRT_ERROR_INVALID_VALUE,
                  fmt::format("devrt_record_memory_history: enabled is {}; pass 1 to record, 0 to stop", enabled));
    }
    state* s = nullptr;
    if (int r = acquire(&s); r != DEVRT_SUCCESS) return r;
    try {
      s->runtime->record_memory_history(enabled == 1,
                                        max_entries == 0 ? mem::memory_manager::default_history_entries : max_entries);
    } catch (const boost::system::system_error& e) {
      return fail(status_of(rt::to_errc(e.code())), fmt::format("devrt_record_memory_history: {}", e.what()));
    }
    return static_cast<int>(DEVRT_SUCCESS);
  });
}

}  // extern "C"

namespace {

/// Hands `text` back through a caller's buffer (see c_api.h).
int give_text(const char* what, const std::string& text, void* buffer, size_t size, size_t* length) {
  *length = text.size();
  if (buffer == nullptr || size == 0) return DEVRT_SUCCESS;
  if (size < text.size() + 1) {
    return fail(DEVRT_ERROR_INVALID_VALUE,
                fmt::format("{}: the buffer holds {} bytes, the answer needs {} (with its NUL); ask again with a "
                            "larger one",
                            what, size, text.size() + 1));
  }
  std::memcpy(buffer, text.data(), text.size());
  static_cast<char*>(buffer)[text.size()] = '\0';
  return DEVRT_SUCCESS;
}

}  // namespace

extern "C" {

int devrt_memory_snapshot(int device, int format, void* buffer, size_t size, size_t* length) {
  return guarded("devrt_memory_snapshot", [&] {
    if (length == nullptr) return fail(DEVRT_ERROR_INVALID_VALUE, "devrt_memory_snapshot: the length pointer is NULL");
    if (format != DEVRT_SNAPSHOT_PICKLE && format != DEVRT_SNAPSHOT_JSON) {
      return fail(DEVRT_ERROR_INVALID_VALUE,
                  fmt::format("devrt_memory_snapshot: format {} is unknown; use DEVRT_SNAPSHOT_PICKLE (0) or "
                              "DEVRT_SNAPSHOT_JSON (1)",
                              format));
    }
    return on_device(device, "devrt_memory_snapshot", [&](device_ctx& d) {
      mem::memory_snapshot snap = d.client.snapshot().get();
      snap.device = d.name;
      snap.device_index = device;
      const std::string text = format == DEVRT_SNAPSHOT_JSON ? mem::to_json(snap) : mem::to_pickle({snap});
      return give_text("devrt_memory_snapshot", text, buffer, size, length);
    });
  });
}

int devrt_metrics_text(char* buffer, size_t size, size_t* length) {
  return guarded("devrt_metrics_text", [&] {
    if (length == nullptr) return fail(DEVRT_ERROR_INVALID_VALUE, "devrt_metrics_text: the length pointer is NULL");
    state* s = nullptr;
    if (int r = acquire(&s); r != DEVRT_SUCCESS) return r;
    return give_text("devrt_metrics_text", s->runtime->metrics_text(), buffer, size, length);
  });
}

int devrt_configure(int device, const char* layout) {
  return guarded("devrt_configure", [&] {
    if (layout == nullptr) {
      return fail(DEVRT_ERROR_INVALID_VALUE, "devrt_configure: the layout string is NULL (\"auto\" is the default)");
    }
    return on_device(device, "devrt_configure", [&](device_ctx& d) {
      auto parsed = mem::parse_layout(layout);
      if (!parsed) {
        return fail(DEVRT_ERROR_INVALID_LAYOUT,
                    fmt::format("devrt_configure(\"{}\") on {}: {}; the current layout stays in force", layout, d.name,
                                parsed.err().message()));
      }
      try {
        const mem::configure_outcome out = d.client.configure(*parsed).get();
        if (!out.applied) {
          return fail(DEVRT_ERROR_BUSY,
                      fmt::format("devrt_configure(\"{}\") on {}: {} allocations ({} bytes) of the current layout "
                                  "are live; free them and configure again (the current layout stays in force)",
                                  layout, d.name, out.live_allocations, out.live_bytes));
        }
      } catch (const boost::system::system_error& e) {
        return fail(status_of(rt::to_errc(e.code())),
                    fmt::format("devrt_configure(\"{}\") on {}: {}; the current layout stays in force", layout, d.name,
                                e.what()));
      }
      return static_cast<int>(DEVRT_SUCCESS);
    });
  });
}

void* devrt_torch_malloc(ssize_t size, int device, devrt_cuda_stream stream) {
  void* p = nullptr;
  int r = DEVRT_SUCCESS;
  if (size < 0) {
    r = fail(DEVRT_ERROR_SIZE_TOO_LARGE, fmt::format("devrt_torch_malloc: negative size {}", size));
  } else {
    // PyTorch names CUDA streams: 0 is the legacy default stream, not devrt's own.
    r = guarded("devrt_torch_malloc", [&] {
      return do_malloc(&p, static_cast<std::size_t>(size), device, mem::stream::native(stream), "devrt_torch_malloc");
    });
  }
  if (r != DEVRT_SUCCESS) throw torch_out_of_memory(last_error);
  return p;
}

void devrt_torch_free(void* ptr, ssize_t /*size*/, int device, devrt_cuda_stream stream) {
  const int r = guarded("devrt_torch_free",
                        [&] { return do_free(ptr, device, mem::stream::native(stream), "devrt_torch_free"); });
  // PyTorch ignores what its free function says; a failed free is a bug worth seeing.
  if (r != DEVRT_SUCCESS) (void)std::fprintf(stderr, "devrt: %s\n", last_error.c_str());
}

void devrt_torch_record_stream(void* ptr, devrt_cuda_stream stream) {
  const int r = guarded("devrt_torch_record_stream", [&] {
    return do_record_stream(ptr, mem::stream::native(stream), "devrt_torch_record_stream");
  });
  // PyTorch's record-stream hook returns nothing; an exception reaches Tensor.record_stream's
  // caller as a RuntimeError with devrt's message (as devrt_torch_malloc's do).
  if (r != DEVRT_SUCCESS) throw std::runtime_error(last_error);
}

void devrt_torch_empty_cache(void) {
  (void)guarded("devrt_torch_empty_cache", [&] {
    state* s = nullptr;
    if (int r = acquire(&s); r != DEVRT_SUCCESS) return r;
    // The devices started so far: one never used holds no memory.
    for (auto& slot : s->cuda) {
      if (device_ctx* d = slot.started.load(std::memory_order_acquire)) d->client.cleanup().get();
    }
    return static_cast<int>(DEVRT_SUCCESS);
  });
}

}  // extern "C"
