// The storage contract (memory/storage.hpp), checked against every backend with one typed suite.
//
// Per-backend construction and capabilities live in a small traits struct; every test of the
// suite runs once for host_storage and once for sim_storage.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <vector>

#include "devrt/devices/host_storage.hpp"
#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/storage.hpp"

namespace {

using devrt::errc;
using devrt::memory::device_properties;
using devrt::memory::resource;
using devrt::memory::storage;
using devrt::memory::storage_backend;
using devrt::memory::storage_handle;
using devrt::memory::storage_id;

constexpr std::uint64_t kib = 1024;
constexpr std::uint64_t mib = 1024 * kib;

struct host_traits {
  using backend = devrt::devices::host_storage;
  static constexpr bool has_memory = true;  // resources point at real, readable host memory
  static constexpr std::uint64_t alignment = 64;
  static constexpr std::uint64_t max_page = 1ULL << 30;

  static std::unique_ptr<backend> make(std::uint64_t capacity = 0) {
    devrt::devices::host_options o;
    o.alignment = alignment;
    o.max_page_size = max_page;
    o.capacity = capacity;
    return std::make_unique<backend>(o);
  }
  static const char* name() { return "host"; }
};

struct sim_traits {
  using backend = devrt::devices::sim_storage;
  static constexpr bool has_memory = false;  // ids and sizes only
  static constexpr std::uint64_t alignment = 32;
  static constexpr std::uint64_t max_page = 128ULL << 20;

  static std::unique_ptr<backend> make(std::uint64_t capacity = 0) {
    devrt::devices::sim_options o;
    o.props = {max_page, alignment, capacity};
    return std::make_unique<backend>(o);
  }
  static const char* name() { return "sim"; }
};

template <class Traits>
class StorageConformance : public ::testing::Test {
 protected:
  using backend = typename Traits::backend;
  static_assert(storage_backend<backend>);

  std::unique_ptr<backend> s_ = Traits::make();

  storage_handle alloc_ok(std::uint64_t size) {
    auto r = s_->alloc(size);
    EXPECT_TRUE(r) << "alloc(" << size << ") failed: " << (r ? "" : r.err().message());
    return r ? *r : storage_handle{};
  }
};

struct traits_names {
  template <class T>
  static std::string GetName(int) {
    return T::name();
  }
};

using backends = ::testing::Types<host_traits, sim_traits>;
TYPED_TEST_SUITE(StorageConformance, backends, traits_names);

bool is_power_of_two(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

TYPED_TEST(StorageConformance, AllocGivesDistinctIdsAndTheRequestedSize) {
  std::set<storage_id> ids;
  for (const std::uint64_t size :
       {std::uint64_t{1}, std::uint64_t{7}, std::uint64_t{64}, 4 * kib, 100 * kib, 3 * mib}) {
    const storage_handle h = this->alloc_ok(size);
    EXPECT_NE(h.id, 0u) << "0 is never a valid id";
    EXPECT_EQ(h.offset, 0u);
    EXPECT_EQ(h.size, size);
    EXPECT_TRUE(ids.insert(h.id).second) << "id " << h.id << " handed out twice";
    auto g = this->s_->get(h);
    ASSERT_TRUE(g) << g.err().message();
    EXPECT_EQ(g->size, size);
    EXPECT_EQ(g->handle, h);
  }
  EXPECT_EQ(ids.size(), 6u);
  EXPECT_EQ(this->s_->pending_deallocations(), 0u);
}

TYPED_TEST(StorageConformance, AlignmentIsAPowerOfTwoAndMatchesProperties) {
  const std::uint64_t a = this->s_->alignment();
  EXPECT_TRUE(is_power_of_two(a)) << a;
  EXPECT_EQ(a, TypeParam::alignment);
  const device_properties p = this->s_->properties();
  EXPECT_EQ(p.alignment, a);
  EXPECT_EQ(p.max_page_size, TypeParam::max_page);
  EXPECT_EQ(p.capacity, 0u);
  EXPECT_EQ(this->s_->name(), TypeParam::name());
  if constexpr (TypeParam::has_memory) {
    // Every page starts at an address aligned to the device alignment, for small (heap) and
    // large (mmap) pages alike.
    for (const std::uint64_t size : {std::uint64_t{1}, std::uint64_t{100}, 3 * mib}) {
      const storage_handle h = this->alloc_ok(size);
      auto g = this->s_->get(h);
      ASSERT_TRUE(g);
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(g->ptr) % a, 0u) << "page of " << size << " bytes";
    }
  }
}

TYPED_TEST(StorageConformance, GetOnAViewReturnsThatView) {
  const storage_handle page = this->alloc_ok(64);
  const storage_handle view{page.id, 24, 8};
  auto g = this->s_->get(view);
  ASSERT_TRUE(g) << g.err().message();
  EXPECT_EQ(g->size, 8u);
  EXPECT_EQ(g->handle, view);
  auto whole = this->s_->get(page);
  ASSERT_TRUE(whole);
  if constexpr (TypeParam::has_memory) {
    auto* base = static_cast<unsigned char*>(whole->ptr);
    ASSERT_NE(base, nullptr);
    EXPECT_EQ(g->ptr, base + 24);
    // Writes through the view land at base + 24 .. base + 32, and nowhere else.
    std::memset(g->ptr, 0xAB, 8);
    for (std::size_t i = 0; i < 64; ++i) {
      EXPECT_EQ(base[i], (i >= 24 && i < 32) ? 0xAB : 0x00) << "byte " << i;
    }
    // And reads through the view see what was written through the page.
    base[30] = 0x5C;
    EXPECT_EQ(static_cast<unsigned char*>(g->ptr)[6], 0x5C);
  } else {
    EXPECT_EQ(g->ptr, nullptr);
    EXPECT_EQ(whole->ptr, nullptr);
  }
}

TYPED_TEST(StorageConformance, ReadAfterAllocWithoutWrite) {
  // Host memory is zero-filled: small heap pages, large mmap pages, and a page allocated right
  // after a dirty one was returned (the heap may hand back the same bytes).
  for (const std::uint64_t size : {std::uint64_t{200}, 64 * kib, 3 * mib}) {
    const storage_handle dirty = this->alloc_ok(size);
    if constexpr (TypeParam::has_memory) {
      auto g = this->s_->get(dirty);
      ASSERT_TRUE(g);
      std::memset(g->ptr, 0xFF, size);
    }
    this->s_->dealloc(dirty.id);
    ASSERT_TRUE(this->s_->flush());

    const storage_handle fresh = this->alloc_ok(size);
    auto g = this->s_->get(fresh);
    ASSERT_TRUE(g) << g.err().message();
    EXPECT_EQ(g->size, size);
    if constexpr (TypeParam::has_memory) {
      const auto* p = static_cast<const unsigned char*>(g->ptr);
      std::size_t nonzero = 0;
      for (std::uint64_t i = 0; i < size; ++i) nonzero += p[i] != 0 ? 1 : 0;
      EXPECT_EQ(nonzero, 0u) << "a fresh page of " << size << " bytes is not zero-filled";
    } else {
      EXPECT_EQ(g->ptr, nullptr) << "the sim device has no memory behind its pages";
    }
  }
}

TYPED_TEST(StorageConformance, WriteAndReadAView) {
  const storage_handle page = this->alloc_ok(256);
  const storage_handle view{page.id, 24, 8};
  const unsigned char in[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  unsigned char out[8] = {};
  auto w = this->s_->write(view, in);
  auto r = this->s_->read(view, out);
  if constexpr (TypeParam::has_memory) {
    ASSERT_TRUE(w) << w.err().message();
    ASSERT_TRUE(r) << r.err().message();
    EXPECT_EQ(std::memcmp(in, out, 8), 0);
    // The bytes landed at offset 24 of the page and nowhere else.
    auto g = this->s_->get(page);
    ASSERT_TRUE(g);
    const auto* base = static_cast<const unsigned char*>(g->ptr);
    for (std::size_t i = 0; i < 256; ++i) {
      EXPECT_EQ(base[i], (i >= 24 && i < 32) ? in[i - 24] : 0) << "byte " << i;
    }
    // A zero-size view reads and writes nothing.
    EXPECT_TRUE(this->s_->write(storage_handle{page.id, 256, 0}, nullptr));
    EXPECT_TRUE(this->s_->read(storage_handle{page.id, 256, 0}, nullptr));
  } else {
    // No memory behind the pages: refused, and nothing written to the destination.
    EXPECT_EQ(w.code(), errc::invalid_argument);
    EXPECT_EQ(r.code(), errc::invalid_argument);
    EXPECT_EQ(out[0], 0);
  }
  // Bad views are refused the same way as by get(), before any byte moves.
  unsigned char big[512] = {};
  EXPECT_EQ(this->s_->write(storage_handle{page.id, 200, 57}, big).code(), errc::invalid_argument);
  EXPECT_EQ(this->s_->read(storage_handle{page.id, 257, 0}, big).code(), errc::invalid_argument);
  EXPECT_EQ(this->s_->write(storage_handle{page.id + 1000, 0, 8}, in).code(), errc::not_found);
  EXPECT_EQ(this->s_->read(storage_handle{page.id + 1000, 0, 8}, out).code(), errc::not_found);
  this->s_->dealloc(page.id);
  ASSERT_TRUE(this->s_->flush());
  EXPECT_EQ(this->s_->read(view, out).code(), errc::not_found) << "read of a flushed page";
}

TYPED_TEST(StorageConformance, ZeroSizeAllocAndDealloc) {
  const storage_handle a = this->alloc_ok(0);
  const storage_handle b = this->alloc_ok(0);
  EXPECT_NE(a.id, 0u);
  EXPECT_NE(a.id, b.id);
  EXPECT_EQ(a.size, 0u);
  auto g = this->s_->get(a);
  ASSERT_TRUE(g) << g.err().message();
  EXPECT_EQ(g->size, 0u);
  // Nothing fits in a zero-size page.
  EXPECT_EQ(this->s_->get(storage_handle{a.id, 0, 1}).code(), errc::invalid_argument);
  EXPECT_EQ(this->s_->get(storage_handle{a.id, 1, 0}).code(), errc::invalid_argument);
  this->s_->dealloc(a.id);
  EXPECT_EQ(this->s_->pending_deallocations(), 1u);
  ASSERT_TRUE(this->s_->flush());
  EXPECT_EQ(this->s_->get(a).code(), errc::not_found);
  EXPECT_TRUE(this->s_->get(b)) << "freeing one zero-size page freed another";
}

TYPED_TEST(StorageConformance, AllocDeallocRealloc) {
  for (int round = 0; round < 3; ++round) {
    std::vector<storage_handle> pages;
    for (std::uint64_t i = 1; i <= 8; ++i) pages.push_back(this->alloc_ok(i * 1000));
    for (const auto& h : pages) {
      auto g = this->s_->get(h);
      ASSERT_TRUE(g) << "round " << round;
      EXPECT_EQ(g->size, h.size);
    }
    for (const auto& h : pages) this->s_->dealloc(h.id);
    EXPECT_EQ(this->s_->pending_deallocations(), pages.size());
    ASSERT_TRUE(this->s_->flush());
    EXPECT_EQ(this->s_->pending_deallocations(), 0u);
    for (const auto& h : pages) EXPECT_EQ(this->s_->get(h).code(), errc::not_found) << "round " << round;
  }
  // An empty flush is fine.
  EXPECT_TRUE(this->s_->flush());
}

TYPED_TEST(StorageConformance, DeallocIsQueuedUntilFlush) {
  const storage_handle a = this->alloc_ok(4 * kib);
  const storage_handle b = this->alloc_ok(8 * kib);
  const storage_handle c = this->alloc_ok(16 * kib);
  EXPECT_EQ(this->s_->pending_deallocations(), 0u);

  this->s_->dealloc(a.id);
  EXPECT_EQ(this->s_->pending_deallocations(), 1u);
  this->s_->dealloc(b.id);
  EXPECT_EQ(this->s_->pending_deallocations(), 2u);

  // Queued pages still resolve until the flush: work already issued may still be using them.
  auto ga = this->s_->get(a);
  ASSERT_TRUE(ga) << "a queued page must stay resolvable until flush(): " << ga.err().message();
  EXPECT_EQ(ga->size, a.size);
  if constexpr (TypeParam::has_memory) std::memset(ga->ptr, 1, a.size);  // and usable
  EXPECT_TRUE(this->s_->get(b));

  ASSERT_TRUE(this->s_->flush());
  EXPECT_EQ(this->s_->pending_deallocations(), 0u);
  EXPECT_EQ(this->s_->get(a).code(), errc::not_found);
  EXPECT_EQ(this->s_->get(b).code(), errc::not_found);
  EXPECT_EQ(this->s_->get(storage_handle{a.id, 8, 8}).code(), errc::not_found);
  auto gc = this->s_->get(c);
  ASSERT_TRUE(gc) << "flush freed a page that was not queued";
  EXPECT_EQ(gc->size, c.size);
}

TYPED_TEST(StorageConformance, MultipleRegionsDoNotOverlap) {
  std::vector<storage_handle> pages;
  for (std::uint64_t i = 0; i < 16; ++i) pages.push_back(this->alloc_ok(64 + i * 4096 + (i % 3) * 8));
  std::set<storage_id> ids;
  for (const auto& h : pages) EXPECT_TRUE(ids.insert(h.id).second);
  if constexpr (TypeParam::has_memory) {
    std::vector<resource> rs;
    for (const auto& h : pages) {
      auto g = this->s_->get(h);
      ASSERT_TRUE(g);
      rs.push_back(*g);
    }
    // Address ranges are disjoint...
    for (std::size_t i = 0; i < rs.size(); ++i) {
      for (std::size_t j = i + 1; j < rs.size(); ++j) {
        const auto ai = reinterpret_cast<std::uintptr_t>(rs[i].ptr);
        const auto aj = reinterpret_cast<std::uintptr_t>(rs[j].ptr);
        EXPECT_TRUE(ai + rs[i].size <= aj || aj + rs[j].size <= ai) << "pages " << i << " and " << j << " overlap";
      }
    }
    // ...and a distinct pattern written into each survives writes to all the others.
    for (std::size_t i = 0; i < rs.size(); ++i) std::memset(rs[i].ptr, static_cast<int>(i + 1), rs[i].size);
    for (std::size_t i = 0; i < rs.size(); ++i) {
      const auto* p = static_cast<const unsigned char*>(rs[i].ptr);
      std::size_t bad = 0;
      for (std::uint64_t k = 0; k < rs[i].size; ++k) bad += p[k] != i + 1 ? 1 : 0;
      EXPECT_EQ(bad, 0u) << "page " << i << " was overwritten";
    }
  }
}

TYPED_TEST(StorageConformance, ViewPastThePageEndIsInvalid) {
  const std::uint64_t size = 256;
  const storage_handle h = this->alloc_ok(size);
  const std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
  for (const storage_handle bad :
       {storage_handle{h.id, 0, size + 1}, storage_handle{h.id, size, 1}, storage_handle{h.id, size + 1, 0},
        storage_handle{h.id, 8, size - 7}, storage_handle{h.id, 8, max}, storage_handle{h.id, max, 2}}) {
    auto g = this->s_->get(bad);
    EXPECT_EQ(g.code(), errc::invalid_argument)
        << "view offset " << bad.offset << " size " << bad.size << " of a " << size << " byte page";
  }
  // The views that end exactly at the page end are fine.
  EXPECT_TRUE(this->s_->get(storage_handle{h.id, size, 0}));
  EXPECT_TRUE(this->s_->get(storage_handle{h.id, 8, size - 8}));
  EXPECT_TRUE(this->s_->get(storage_handle{h.id, size - 1, 1}));
}

TYPED_TEST(StorageConformance, UnknownPageIsNotFound) {
  const storage_handle h = this->alloc_ok(64);
  EXPECT_EQ(this->s_->get(storage_handle{0, 0, 0}).code(), errc::not_found);
  EXPECT_EQ(this->s_->get(storage_handle{h.id + 1000, 0, 8}).code(), errc::not_found);
  // Deallocating an unknown id is harmless at flush.
  this->s_->dealloc(h.id + 1000);
  EXPECT_TRUE(this->s_->flush());
  EXPECT_TRUE(this->s_->get(h));
}

TYPED_TEST(StorageConformance, CapacityRefusesALargerAllocation) {
  const std::uint64_t cap = 64 * kib;
  auto s = TypeParam::make(cap);
  EXPECT_EQ(s->properties().capacity, cap);

  auto big = s->alloc(2 * cap);
  ASSERT_FALSE(big) << "an allocation twice the capacity succeeded";
  EXPECT_EQ(big.code(), errc::out_of_memory);
  EXPECT_EQ(big.err().size, 2 * cap) << "err().size is the request";
  EXPECT_EQ(big.err().limit, cap);

  auto a = s->alloc(48 * kib);
  ASSERT_TRUE(a) << a.err().message();
  auto over = s->alloc(32 * kib);  // 48 + 32 > 64
  ASSERT_FALSE(over);
  EXPECT_EQ(over.code(), errc::out_of_memory);
  EXPECT_EQ(over.err().size, 32 * kib);
  EXPECT_EQ(over.err().in_use, 48 * kib);
  auto exact = s->alloc(16 * kib);  // exactly full
  ASSERT_TRUE(exact) << exact.err().message();
  EXPECT_EQ(s->alloc(1).code(), errc::out_of_memory);

  // Freed (and flushed) bytes are available again.
  s->dealloc(a->id);
  ASSERT_TRUE(s->flush());
  auto again = s->alloc(48 * kib);
  ASSERT_TRUE(again) << again.err().message();
  // Through the type-erased wrapper too.
  storage st(std::move(s));
  EXPECT_EQ(st.alloc(1).code(), errc::out_of_memory);
  EXPECT_EQ(st.name(), TypeParam::name());
}

TYPED_TEST(StorageConformance, TypeErasedWrapperForwardsTheContract) {
  storage st(TypeParam::make());
  EXPECT_NE(st.template backend<typename TypeParam::backend>(), nullptr);
  EXPECT_EQ(st.alignment(), TypeParam::alignment);
  auto h = st.alloc(512);
  ASSERT_TRUE(h);
  auto g = st.get(storage_handle{h->id, 24, 8});
  ASSERT_TRUE(g);
  EXPECT_EQ(g->size, 8u);
  const std::uint64_t word = 0x0123456789abcdefULL;
  std::uint64_t back = 0;
  auto w = st.write(storage_handle{h->id, 64, 8}, &word);
  auto r = st.read(storage_handle{h->id, 64, 8}, &back);
  if constexpr (TypeParam::has_memory) {
    ASSERT_TRUE(w) << w.err().message();
    ASSERT_TRUE(r) << r.err().message();
    EXPECT_EQ(back, word);
  } else {
    EXPECT_EQ(w.code(), errc::invalid_argument);
    EXPECT_EQ(r.code(), errc::invalid_argument);
  }
  EXPECT_EQ(st.native_stream(), nullptr) << "host and sim have no work queue";
  EXPECT_TRUE(st.synchronize());
  st.dealloc(h->id);
  EXPECT_EQ(st.pending_deallocations(), 1u);
  EXPECT_TRUE(st.get(*h));
  ASSERT_TRUE(st.flush());
  EXPECT_EQ(st.pending_deallocations(), 0u);
  EXPECT_EQ(st.get(*h).code(), errc::not_found);
}

// ---- storage_handle arithmetic ----

TEST(StorageHandle, OffsetStartMovesTheStartForward) {
  constexpr storage_handle h{7, 100, 50};
  static_assert(h.offset_start(0) == h);
  static_assert(h.offset_start(10) == storage_handle{7, 110, 40});
  static_assert(h.offset_start(50) == storage_handle{7, 150, 0});
  const storage_handle r = h.offset_start(24);
  EXPECT_EQ(r.id, 7u);
  EXPECT_EQ(r.offset, 124u);
  EXPECT_EQ(r.size, 26u);
  // The end stays where it was.
  EXPECT_EQ(r.offset + r.size, h.offset + h.size);
}

TEST(StorageHandle, OffsetEndTrimsBytesOffTheEnd) {
  constexpr storage_handle h{7, 100, 50};
  static_assert(h.offset_end(0) == h);
  const storage_handle r = h.offset_end(10);
  // Trims 10 bytes off the end: the view is [100, 140). It does not set the end to 10, nor the
  // size to 10, nor move the start.
  EXPECT_EQ(r, (storage_handle{7, 100, 40}));
  EXPECT_EQ(r.offset, h.offset);
  EXPECT_EQ(r.offset + r.size, h.offset + h.size - 10);
  EXPECT_EQ(h.offset_end(50), (storage_handle{7, 100, 0}));
}

TEST(StorageHandle, TrimsCompose) {
  constexpr storage_handle h{3, 64, 1000};
  EXPECT_EQ(h.offset_start(5).offset_end(5), (storage_handle{3, 69, 990}));
  EXPECT_EQ(h.offset_end(5).offset_start(5), (storage_handle{3, 69, 990}));
  EXPECT_EQ(h.offset_start(100).offset_start(200), h.offset_start(300));
  EXPECT_EQ(h.offset_end(100).offset_end(200), h.offset_end(300));
  EXPECT_NE(h.offset_start(1), h);
  EXPECT_NE(h.offset_end(1), h);
}

TEST(StorageHandle, TrimmedViewResolvesOnHostStorage) {
  devrt::devices::host_storage s;
  auto page = s.alloc(256);
  ASSERT_TRUE(page);
  auto whole = s.get(*page);
  ASSERT_TRUE(whole);
  auto g = s.get(page->offset_start(24).offset_end(200));  // [24, 56)
  ASSERT_TRUE(g) << g.err().message();
  EXPECT_EQ(g->size, 32u);
  EXPECT_EQ(g->ptr, static_cast<std::byte*>(whole->ptr) + 24);
}

}  // namespace
