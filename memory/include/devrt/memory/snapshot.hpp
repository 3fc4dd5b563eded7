// Memory snapshots: what a device's pools hold, block by block, and the history of what happened
// to them, in the shape of PyTorch's `torch.cuda.memory._snapshot()` so that PyTorch's memory
// viewer (`torch.cuda._memory_viz`, and the web viewer it writes HTML for) reads them.
//
// Words: a *segment* is memory held from the device with contiguous addresses (a sliced pool's
// page, an exclusive or persistent allocation, a run of an arena's mapped granules); a *block* is
// one slice of a segment, live or free. The blocks of a segment cover it exactly, in address
// order. Its history is a ring of trace entries, recorded only while `memory_history::enabled`.
//
// On devices that give no addresses (the simulated one), addresses are made up from the storage's
// ids: (id << 40) + offset. They are unique and ordered within a snapshot, and the same in the
// trace and the segments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "devrt/memory/storage.hpp"
#include "devrt/memory/stream.hpp"
#include "devrt/memory/usage.hpp"

namespace devrt::memory {

/// The state of a block, named as PyTorch names it (`to_string`).
enum class block_state : std::uint8_t {
  allocated,     ///< live: "active_allocated"
  pending_free,  ///< freed by the user, kept until the fences of the streams that used it pass: "active_pending_free"
  free,          ///< free memory of the segment: "inactive"
};
const char* to_string(block_state s) noexcept;

struct snapshot_block {
  std::uint64_t address = 0;
  std::uint64_t size = 0;            ///< bytes of the segment it covers (aligned)
  std::uint64_t requested_size = 0;  ///< bytes asked for (0 when free)
  block_state state = block_state::free;
  stream_id stream = streams::none;  ///< the stream it was reserved for (live and pending blocks)
  std::uint64_t sequence = 0;        ///< its reserve's number on the device, from 1 (0: free)
};

struct snapshot_segment {
  std::uint64_t address = 0;
  std::uint64_t total_size = 0;
  std::string pool;         ///< "arena 0", "sliced 1", "exclusive 2", "persistent"
  bool expandable = false;  ///< an arena's mapped run: it grows and shrinks with its mappings
  std::vector<snapshot_block> blocks;
};

/// What a trace entry records, named as PyTorch names it (`to_string`).
enum class trace_action : std::uint8_t {
  alloc,           ///< a reserve succeeded
  free_requested,  ///< the last handle was dropped
  free_completed,  ///< the memory is free in its pool (at once, or once its streams' fences passed)
  segment_alloc,   ///< memory taken from the device (a page allocated, granules mapped)
  segment_free,    ///< memory given back to the device (a page freed, granules unmapped)
  oom,             ///< a reserve failed: the device refused memory
};
const char* to_string(trace_action a) noexcept;

struct trace_entry {
  trace_action action = trace_action::alloc;
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  stream_id stream = streams::none;
  std::uint64_t time_us = 0;      ///< microseconds since the Unix epoch
  std::uint64_t device_free = 0;  ///< oom: the device's free bytes
};

/// A ring of the most recent trace entries. Owner thread only (the manager's).
class memory_history {
 public:
  /// Starts (or stops) recording; at most `max_entries` (> 0) are kept, the oldest dropped first.
  /// Stopping keeps the entries, starting anew clears them.
  void enable(bool on, std::size_t max_entries);
  [[nodiscard]] bool enabled() const noexcept { return on_; }
  void add(trace_action action, std::uint64_t address, std::uint64_t size, stream_id stream,
           std::uint64_t device_free = 0);
  /// Oldest first.
  [[nodiscard]] std::vector<trace_entry> entries() const;
  /// Entries dropped because the ring was full.
  [[nodiscard]] std::uint64_t dropped() const noexcept { return dropped_; }

 private:
  std::vector<trace_entry> ring_;
  std::size_t next_ = 0;  // where the next entry goes once the ring is full
  std::size_t max_ = 0;
  std::uint64_t dropped_ = 0;
  bool on_ = false;
};

/// One device's snapshot.
struct memory_snapshot {
  std::string device;     ///< "host", "sim", "cuda:0"
  int device_index = -1;  ///< the CUDA index; -1 for the host and the sim device
  std::vector<snapshot_segment> segments;
  std::vector<trace_entry> trace;  ///< oldest first; empty unless history was recorded
  std::uint64_t trace_dropped = 0;
  memory_statistics statistics;  ///< taken at the same point as the segments

  /// Empty when the snapshot is consistent, else the first violation found: every segment's
  /// blocks add up to its total size in address order, the segments add up to the bytes
  /// reserved, the requested sizes of the live blocks to the bytes in use, and (unless the ring
  /// dropped entries) every free_completed follows an alloc at its address.
  [[nodiscard]] std::string check() const;
  /// Sums over the segments: bytes reserved and bytes requested by live blocks.
  [[nodiscard]] std::uint64_t total_reserved() const noexcept;
  [[nodiscard]] std::uint64_t total_allocated() const noexcept;
};

/// The snapshot as JSON: {"device", "device_index", "segments": [...], "device_traces": [[...]],
/// "trace_dropped", "statistics": {...}}, with PyTorch's field names.
std::string to_json(const memory_snapshot& s);
/// The snapshots as the pickle that `torch.cuda.memory._snapshot()` would give, for
/// `python -m torch.cuda._memory_viz` (protocol 2: dicts, lists, ints, strings, booleans).
/// device_traces is indexed by CUDA device; the host and the sim device come after them.
std::string to_pickle(const std::vector<memory_snapshot>& snapshots);

namespace detail {
struct descriptor;
}
/// The block of a live slice: allocated, or pending_free while its streams' fences are awaited.
snapshot_block live_block(std::uint64_t address, std::uint64_t size, std::uint64_t requested,
                          const detail::descriptor* d) noexcept;

/// The address a snapshot gives to byte `offset` of storage allocation (or range) `id`.
std::uint64_t snapshot_address(storage& store, storage_id id, std::uint64_t offset);

}  // namespace devrt::memory
