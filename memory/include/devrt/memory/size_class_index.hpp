// Free blocks by size class, TLSF-style: the classes split every power of two into 32 (sizes
// below 32 bytes have a class each), each class is an intrusive list of slot indices, and a
// two-level bitmap finds the first non-empty class at or above a size in constant time.
//
// A lookup scans the class that holds the size (its blocks may be smaller than the size) and, if
// none there fits, the first non-empty class above it (where every block fits); in each it takes
// the smallest block, the lowest offset among equals, among the first `scan_limit` blocks. So the
// fit is exactly best fit while classes hold at most `scan_limit` blocks (the common case: a pool
// holds tens of free blocks), and within 1/32 of it otherwise, at a bounded cost.
//
// The nodes live in the caller's table, indexed by 32-bit slots; each has `offset`, `extent`,
// `bin_prev` and `bin_next`. A node's extent must not change while it is in the index. Owner
// thread only, like the pool that holds it.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <vector>

namespace devrt::memory {

class size_class_index {
 public:
  static constexpr std::uint32_t npos = 0xffffffffU;
  static constexpr unsigned sub_bits = 5;  // 32 classes per power of two
  static constexpr unsigned sub_count = 1U << sub_bits;
  static constexpr unsigned class_count = sub_count + (64 - sub_bits) * sub_count;
  static constexpr unsigned word_count = (class_count + 63) / 64;
  static constexpr unsigned scan_limit = 16;

  size_class_index() : heads_(class_count, npos) {}

  static unsigned class_of(std::uint64_t extent) noexcept {
    if (extent < sub_count) return static_cast<unsigned>(extent);
    const auto top = static_cast<unsigned>(63 - std::countl_zero(extent));  // >= sub_bits
    const auto sub = static_cast<unsigned>(extent >> (top - sub_bits)) & (sub_count - 1);
    return sub_count + (top - sub_bits) * sub_count + sub;
  }

  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

  template <class Nodes>
  void insert(Nodes& nodes, std::uint32_t slot) {
    auto& n = nodes[slot];
    const unsigned c = class_of(n.extent);
    n.bin_prev = npos;
    n.bin_next = heads_[c];
    if (heads_[c] != npos) {
      nodes[heads_[c]].bin_prev = slot;
    } else {
      words_[c / 64] |= std::uint64_t{1} << (c % 64);
      summary_ |= std::uint64_t{1} << (c / 64);
    }
    heads_[c] = slot;
    ++size_;
  }

  template <class Nodes>
  void erase(Nodes& nodes, std::uint32_t slot) {
    auto& n = nodes[slot];
    if (n.bin_prev != npos) {
      nodes[n.bin_prev].bin_next = n.bin_next;
    } else {
      const unsigned c = class_of(n.extent);
      heads_[c] = n.bin_next;
      if (n.bin_next == npos) {
        words_[c / 64] &= ~(std::uint64_t{1} << (c % 64));
        if (words_[c / 64] == 0) summary_ &= ~(std::uint64_t{1} << (c / 64));
      }
    }
    if (n.bin_next != npos) nodes[n.bin_next].bin_prev = n.bin_prev;
    n.bin_prev = n.bin_next = npos;
    --size_;
  }

  /// The slot of the best fitting block of at least `extent` bytes, or npos.
  template <class Nodes>
  [[nodiscard]] std::uint32_t best_fit(const Nodes& nodes, std::uint64_t extent) const noexcept {
    const unsigned c = class_of(extent);
    if (const std::uint32_t s = smallest(nodes, heads_[c], extent); s != npos) return s;
    const unsigned above = first_at_or_above(c + 1);
    return above == npos ? npos : smallest(nodes, heads_[above], 0);
  }

  /// The slot of the largest block, or npos (a scan of the highest non-empty class).
  template <class Nodes>
  [[nodiscard]] std::uint32_t largest(const Nodes& nodes) const noexcept {
    if (summary_ == 0) return npos;
    const auto w = static_cast<unsigned>(63 - std::countl_zero(summary_));
    const auto c = w * 64 + static_cast<unsigned>(63 - std::countl_zero(words_[w]));
    std::uint32_t best = npos;
    for (std::uint32_t s = heads_[c]; s != npos; s = nodes[s].bin_next) {
      if (best == npos || nodes[s].extent > nodes[best].extent) best = s;
    }
    return best;
  }

  /// Calls `f(slot)` for every block of at least `extent` bytes (and for the smaller ones of the
  /// class that holds `extent`: the caller compares), class by class upwards: a walk over the
  /// blocks that may fit only, for a search that best_fit's order does not serve.
  template <class Nodes, class F>
  void for_each_from(const Nodes& nodes, std::uint64_t extent, F&& f) const {
    for (unsigned c = first_at_or_above(class_of(extent)); c != npos; c = first_at_or_above(c + 1)) {
      for (std::uint32_t s = heads_[c]; s != npos; s = nodes[s].bin_next) f(s);
    }
  }

  /// The first slot of class `c` (npos when empty), for walks that check the index.
  [[nodiscard]] std::uint32_t head(unsigned c) const noexcept { return heads_[c]; }
  [[nodiscard]] bool marked(unsigned c) const noexcept { return (words_[c / 64] >> (c % 64) & 1U) != 0; }

  void clear() noexcept {
    std::fill(heads_.begin(), heads_.end(), npos);
    words_.fill(0);
    summary_ = 0;
    size_ = 0;
  }

 private:
  // The smallest block of at least `extent` among the first scan_limit of a class, lowest offset
  // among equals.
  template <class Nodes>
  std::uint32_t smallest(const Nodes& nodes, std::uint32_t s, std::uint64_t extent) const noexcept {
    std::uint32_t best = npos;
    for (unsigned k = 0; s != npos && k < scan_limit; ++k, s = nodes[s].bin_next) {
      const auto& n = nodes[s];
      if (n.extent < extent) continue;
      if (best == npos || n.extent < nodes[best].extent ||
          (n.extent == nodes[best].extent && n.offset < nodes[best].offset)) {
        best = s;
      }
    }
    return best;
  }

  unsigned first_at_or_above(unsigned c) const noexcept {
    if (c >= class_count) return npos;
    unsigned w = c / 64;
    if (const std::uint64_t m = words_[w] & (~std::uint64_t{0} << (c % 64)); m != 0) {
      return w * 64 + static_cast<unsigned>(std::countr_zero(m));
    }
    if (w + 1 >= word_count) return npos;
    const std::uint64_t rest = summary_ & (~std::uint64_t{0} << (w + 1));
    if (rest == 0) return npos;
    w = static_cast<unsigned>(std::countr_zero(rest));
    return w * 64 + static_cast<unsigned>(std::countr_zero(words_[w]));
  }

  std::vector<std::uint32_t> heads_;               // per class: the first slot of its list (npos: empty)
  std::array<std::uint64_t, word_count> words_{};  // bit c: class c is not empty
  std::uint64_t summary_ = 0;                      // bit w: words_[w] is not zero
  std::size_t size_ = 0;
};

}  // namespace devrt::memory
