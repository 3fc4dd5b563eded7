#include "devrt/memory/snapshot.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "devrt/memory/handle.hpp"

namespace devrt::memory {

const char* to_string(block_state s) noexcept {
  switch (s) {
    case block_state::allocated: return "active_allocated";
    case block_state::pending_free: return "active_pending_free";
    case block_state::free: return "inactive";
  }
  return "inactive";
}

const char* to_string(trace_action a) noexcept {
  switch (a) {
    case trace_action::alloc: return "alloc";
    case trace_action::free_requested: return "free_requested";
    case trace_action::free_completed: return "free_completed";
    case trace_action::segment_alloc: return "segment_alloc";
    case trace_action::segment_free: return "segment_free";
    case trace_action::oom: return "oom";
  }
  return "alloc";
}

void memory_history::enable(bool on, std::size_t max_entries) {
  if (on && !on_) {
    ring_.clear();
    next_ = 0;
    dropped_ = 0;
  }
  if (on) {
    max_ = std::max<std::size_t>(max_entries, 1);
    if (ring_.size() > max_) {
      // A smaller ring keeps the newest entries.
      std::vector<trace_entry> kept = entries();
      ring_.assign(kept.end() - static_cast<std::ptrdiff_t>(max_), kept.end());
      dropped_ += kept.size() - max_;
      next_ = 0;
    } else if (next_ != 0) {
      ring_ = entries();  // a larger ring grows from its oldest entry
      next_ = 0;
    }
    ring_.reserve(std::min<std::size_t>(max_, 1U << 16));
  }
  on_ = on;
}

void memory_history::add(trace_action action, std::uint64_t address, std::uint64_t size, stream_id stream,
                         std::uint64_t device_free) {
  if (!on_) return;
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  const trace_entry e{action,
                      address,
                      size,
                      stream,
                      static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(now).count()),
                      device_free};
  if (ring_.size() < max_) {
    ring_.push_back(e);
    return;
  }
  ring_[next_] = e;
  next_ = (next_ + 1) % max_;
  ++dropped_;
}

std::vector<trace_entry> memory_history::entries() const {
  std::vector<trace_entry> out;
  out.reserve(ring_.size());
  out.insert(out.end(), ring_.begin() + static_cast<std::ptrdiff_t>(next_), ring_.end());
  out.insert(out.end(), ring_.begin(), ring_.begin() + static_cast<std::ptrdiff_t>(next_));
  return out;
}

snapshot_block live_block(std::uint64_t address, std::uint64_t size, std::uint64_t requested,
                          const detail::descriptor* d) noexcept {
  snapshot_block b;
  b.address = address;
  b.size = size;
  b.requested_size = requested;
  b.state = block_state::allocated;
  if (d != nullptr) {
    b.state = d->held ? block_state::pending_free : block_state::allocated;
    b.stream = d->stream;
    b.sequence = d->sequence;
  }
  return b;
}

std::uint64_t snapshot_address(storage& store, storage_id id, std::uint64_t offset) {
  if (auto r = store.get(storage_handle{id, offset, 0}); r && r->ptr != nullptr) {
    return reinterpret_cast<std::uintptr_t>(r->ptr);  // NOLINT(cppcoreguidelines-pro-type-reinterpret-cast)
  }
  return (id << 40) + offset;
}

std::uint64_t memory_snapshot::total_reserved() const noexcept {
  std::uint64_t n = 0;
  for (const auto& s : segments) n += s.total_size;
  return n;
}

std::uint64_t memory_snapshot::total_allocated() const noexcept {
  std::uint64_t n = 0;
  for (const auto& s : segments) {
    for (const auto& b : s.blocks) {
      if (b.state == block_state::allocated) n += b.requested_size;
    }
  }
  return n;
}

std::string memory_snapshot::check() const {
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const auto& s = segments[i];
    std::uint64_t at = s.address;
    for (const auto& b : s.blocks) {
      if (b.address != at) {
        return fmt::format("segment {} ({}, address {:#x}): a block starts at {:#x}, expected {:#x}", i, s.pool,
                           s.address, b.address, at);
      }
      if (b.size == 0) return fmt::format("segment {} ({}): an empty block at {:#x}", i, s.pool, b.address);
      if (b.requested_size > b.size) {
        return fmt::format("segment {} ({}): the block at {:#x} asked for {} bytes but covers {}", i, s.pool, b.address,
                           b.requested_size, b.size);
      }
      at += b.size;
    }
    if (at - s.address != s.total_size) {
      return fmt::format("segment {} ({}, address {:#x}): its blocks add up to {} bytes, its total size is {}", i,
                         s.pool, s.address, at - s.address, s.total_size);
    }
  }
  if (total_reserved() != statistics.bytes_reserved) {
    return fmt::format("the segments add up to {} bytes, the statistics say {} reserved", total_reserved(),
                       statistics.bytes_reserved);
  }
  if (total_allocated() != statistics.bytes_in_use) {
    return fmt::format("the live blocks add up to {} bytes, the statistics say {} in use", total_allocated(),
                       statistics.bytes_in_use);
  }
  if (trace_dropped == 0) {
    std::unordered_map<std::uint64_t, bool> live;  // address -> an alloc not yet completed as free
    for (std::size_t i = 0; i < trace.size(); ++i) {
      const auto& e = trace[i];
      if (e.action == trace_action::alloc) {
        live[e.address] = true;
      } else if (e.action == trace_action::free_completed) {
        auto it = live.find(e.address);
        if (it == live.end() || !it->second) {
          return fmt::format("trace entry {}: free_completed at {:#x} follows no alloc there", i, e.address);
        }
        it->second = false;
      }
    }
  }
  return {};
}

namespace {

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += c;
    }
  }
  return out + '"';
}

// Pickle, protocol 2: only what snapshots hold.
class pickler {
 public:
  pickler() { out_ += "\x80\x02"; }
  void dict() { out_ += '}'; }
  void list() { out_ += ']'; }
  void mark() { out_ += '('; }
  void set_items() { out_ += 'u'; }
  void appends() { out_ += 'e'; }
  void tuple2() { out_ += '\x86'; }
  void boolean(bool b) { out_ += b ? '\x88' : '\x89'; }
  void str(std::string_view s) {
    out_ += 'X';
    le(s.size(), 4);
    out_ += s;
  }
  void integer(std::uint64_t v) {
    if (v < 0x80000000ULL) {
      out_ += 'J';
      le(v, 4);
      return;
    }
    // LONG1: little-endian two's complement; a value with its top bit set needs a zero byte more.
    unsigned n = 0;
    for (std::uint64_t x = v; x != 0; x >>= 8) ++n;
    const bool pad = ((v >> (8 * (n - 1))) & 0x80U) != 0;
    out_ += '\x8a';
    out_ += static_cast<char>(n + (pad ? 1 : 0));
    le(v, n);
    if (pad) out_ += '\0';
  }
  void signed_integer(std::int64_t v) {
    if (v >= 0) return integer(static_cast<std::uint64_t>(v));
    out_ += 'J';
    le(static_cast<std::uint64_t>(static_cast<std::uint32_t>(static_cast<std::int32_t>(v))), 4);
  }
  // key: value pairs inside a mark ... set_items.
  void key(std::string_view k) { str(k); }
  std::string finish() {
    out_ += '.';
    return std::move(out_);
  }

 private:
  void le(std::uint64_t v, unsigned bytes) {
    for (unsigned i = 0; i < bytes; ++i) out_ += static_cast<char>((v >> (8 * i)) & 0xffU);
  }
  std::string out_;
};

std::uint64_t active_bytes(const snapshot_segment& s, bool requested) {
  std::uint64_t n = 0;
  for (const auto& b : s.blocks) {
    if (b.state != block_state::free) n += requested ? b.requested_size : b.size;
  }
  return n;
}

void pickle_segment(pickler& p, const snapshot_segment& s, int device) {
  p.dict();
  p.mark();
  p.key("device");
  p.signed_integer(device);
  p.key("address");
  p.integer(s.address);
  p.key("total_size");
  p.integer(s.total_size);
  p.key("allocated_size");
  std::uint64_t allocated = 0;
  for (const auto& b : s.blocks) {
    if (b.state == block_state::allocated) allocated += b.size;
  }
  p.integer(allocated);
  p.key("active_size");
  p.integer(active_bytes(s, false));
  p.key("requested_size");
  p.integer(active_bytes(s, true));
  p.key("stream");
  p.integer(0);  // an arena or a page serves every stream; each block names its own
  p.key("segment_type");
  p.str(s.total_size <= (1ULL << 20) ? "small" : "large");
  p.key("segment_pool_id");
  p.integer(0);
  p.integer(0);
  p.tuple2();
  p.key("is_expandable");
  p.boolean(s.expandable);
  p.key("pool");
  p.str(s.pool);
  p.key("frames");
  p.list();
  p.key("blocks");
  p.list();
  if (!s.blocks.empty()) {
    p.mark();
    for (const auto& b : s.blocks) {
      p.dict();
      p.mark();
      p.key("address");
      p.integer(b.address);
      p.key("size");
      p.integer(b.size);
      p.key("requested_size");
      p.integer(b.requested_size);
      p.key("state");
      p.str(to_string(b.state));
      p.key("stream");
      p.integer(b.stream);
      p.key("sequence");
      p.integer(b.sequence);
      p.key("frames");
      p.list();
      p.set_items();
    }
    p.appends();
  }
  p.set_items();
}

void pickle_trace(pickler& p, const std::vector<trace_entry>& trace) {
  p.list();
  if (trace.empty()) return;
  p.mark();
  for (const auto& e : trace) {
    p.dict();
    p.mark();
    p.key("action");
    p.str(to_string(e.action));
    p.key("addr");
    p.integer(e.address);
    p.key("size");
    p.integer(e.size);
    p.key("stream");
    p.integer(e.stream);
    p.key("time_us");
    p.integer(e.time_us);
    if (e.action == trace_action::oom) {
      p.key("device_free");
      p.integer(e.device_free);
    }
    p.key("frames");
    p.list();
    p.set_items();
  }
  p.appends();
}

}  // namespace

std::string to_json(const memory_snapshot& s) {
  std::string out =
      fmt::format("{{\"device\": {}, \"device_index\": {}, \"segments\": [", json_string(s.device), s.device_index);
  for (std::size_t i = 0; i < s.segments.size(); ++i) {
    const auto& g = s.segments[i];
    out += fmt::format(
        "{}{{\"address\": {}, \"total_size\": {}, \"pool\": {}, \"is_expandable\": {}, \"stream\": 0, \"blocks\": [",
        i == 0 ? "" : ", ", g.address, g.total_size, json_string(g.pool), g.expandable ? "true" : "false");
    for (std::size_t j = 0; j < g.blocks.size(); ++j) {
      const auto& b = g.blocks[j];
      out += fmt::format(
          "{}{{\"address\": {}, \"size\": {}, \"requested_size\": {}, \"state\": \"{}\", \"stream\": {}, "
          "\"sequence\": {}}}",
          j == 0 ? "" : ", ", b.address, b.size, b.requested_size, to_string(b.state), b.stream, b.sequence);
    }
    out += "]}";
  }
  out += "], \"device_traces\": [[";
  for (std::size_t i = 0; i < s.trace.size(); ++i) {
    const auto& e = s.trace[i];
    out += fmt::format("{}{{\"action\": \"{}\", \"addr\": {}, \"size\": {}, \"stream\": {}, \"time_us\": {}",
                       i == 0 ? "" : ", ", to_string(e.action), e.address, e.size, e.stream, e.time_us);
    if (e.action == trace_action::oom) out += fmt::format(", \"device_free\": {}", e.device_free);
    out += '}';
  }
  const auto& st = s.statistics;
  out += fmt::format(
      "]], \"trace_dropped\": {}, \"statistics\": {{\"reserved_bytes\": {}, \"returning_bytes\": {}, "
      "\"peak_reserved_bytes\": {}, \"in_use_bytes\": {}, \"peak_in_use_bytes\": {}, \"reserves\": {}, "
      "\"maps\": {}, \"unmaps\": {}, \"driver_allocs\": {}, \"driver_frees\": {}, \"out_of_memory\": {}}}}}",
      s.trace_dropped, st.bytes_reserved, st.bytes_returning, st.peak_bytes_reserved, st.bytes_in_use,
      st.peak_bytes_in_use, st.reserves, st.maps, st.unmaps, st.driver_allocs, st.driver_frees, st.out_of_memory);
  return out;
}

std::string to_pickle(const std::vector<memory_snapshot>& snapshots) {
  // CUDA devices at their indices, the others after them.
  int cuda_slots = 0;
  for (const auto& s : snapshots) cuda_slots = std::max(cuda_slots, s.device_index + 1);
  std::vector<const memory_snapshot*> slots(static_cast<std::size_t>(cuda_slots), nullptr);
  for (const auto& s : snapshots) {
    if (s.device_index >= 0) slots[static_cast<std::size_t>(s.device_index)] = &s;
  }
  for (const auto& s : snapshots) {
    if (s.device_index < 0) slots.push_back(&s);
  }
  pickler p;
  p.dict();
  p.mark();
  p.key("segments");
  p.list();
  bool any = false;
  for (std::size_t d = 0; d < slots.size(); ++d) {
    if (slots[d] == nullptr || slots[d]->segments.empty()) continue;
    if (!any) p.mark();
    any = true;
    for (const auto& g : slots[d]->segments) pickle_segment(p, g, static_cast<int>(d));
  }
  if (any) p.appends();
  p.key("device_traces");
  p.list();
  if (!slots.empty()) {
    p.mark();
    for (const auto* s : slots) {
      if (s == nullptr) {
        p.list();
      } else {
        pickle_trace(p, s->trace);
      }
    }
    p.appends();
  }
  p.key("allocator_settings");
  p.dict();
  p.mark();
  p.key("allocator");
  p.str("devrt");
  p.set_items();
  p.key("devrt_devices");
  p.list();
  if (!slots.empty()) {
    p.mark();
    for (const auto* s : slots) p.str(s == nullptr ? "" : s->device);
    p.appends();
  }
  p.set_items();
  return p.finish();
}

}  // namespace devrt::memory
