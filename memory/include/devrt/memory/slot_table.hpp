// The nodes of a pool (slices, mappings) in stable storage, addressed by a 32-bit index, with the
// indices of released nodes reused first.
//
// By default a deque keeps every node at its address while the table grows, so references held
// across an acquire stay valid (the pools link nodes into intrusive trees); nodes that nothing
// refers to across an acquire can live in a vector, which indexes faster. Owner thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

namespace devrt::memory {

template <class Node, class Storage = std::deque<Node>>
class slot_table {
 public:
  /// A default-constructed node in a released slot, or in a new one; its index.
  std::uint32_t acquire() {
    if (!free_.empty()) {
      const std::uint32_t i = free_.back();
      free_.pop_back();
      nodes_[i] = Node{};
      return i;
    }
    nodes_.emplace_back();
    return static_cast<std::uint32_t>(nodes_.size() - 1);
  }
  /// Gives slot `i` back; its node stays readable until the slot is acquired again.
  void release(std::uint32_t i) { free_.push_back(i); }

  Node& operator[](std::uint32_t i) noexcept { return nodes_[i]; }
  const Node& operator[](std::uint32_t i) const noexcept { return nodes_[i]; }
  /// Slots ever made (an index below it names a node, live or released).
  [[nodiscard]] std::size_t size() const noexcept { return nodes_.size(); }
  [[nodiscard]] bool empty() const noexcept { return nodes_.empty(); }
  /// Slots acquired and not released.
  [[nodiscard]] std::size_t live() const noexcept { return nodes_.size() - free_.size(); }

  auto begin() noexcept { return nodes_.begin(); }
  auto end() noexcept { return nodes_.end(); }
  auto begin() const noexcept { return nodes_.begin(); }
  auto end() const noexcept { return nodes_.end(); }

  void clear() noexcept {
    nodes_.clear();
    free_.clear();
  }

 private:
  Storage nodes_;
  std::vector<std::uint32_t> free_;
};

}  // namespace devrt::memory
