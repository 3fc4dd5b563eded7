// The mapping capability of the storage contract (memory/storage.hpp, `mapping_backend`): address
// ranges reserved without memory, memory mapped into them and unmapped in whole units, and the
// range released at a flush. One typed suite runs against host_storage and sim_storage; the
// simulated device's fault injection and misuse counting are checked apart.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "devrt/devices/host_storage.hpp"
#include "devrt/devices/sim_storage.hpp"
#include "devrt/memory/storage.hpp"

namespace {

using devrt::errc;
using devrt::result;
using devrt::devices::host_options;
using devrt::devices::host_storage;
using devrt::devices::sim_options;
using devrt::devices::sim_storage;
using devrt::memory::device_properties;
using devrt::memory::mapping_backend;
using devrt::memory::resource;
using devrt::memory::storage;
using devrt::memory::storage_backend;
using devrt::memory::storage_handle;
using devrt::memory::storage_id;

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = 1024 * KiB;
constexpr std::uint64_t GiB = 1024 * MiB;
constexpr std::uint64_t kGranule = 2 * MiB;

static_assert(mapping_backend<host_storage>);
static_assert(mapping_backend<sim_storage>);

struct host_traits {
  using backend = host_storage;
  static constexpr bool has_memory = true;
  static std::unique_ptr<backend> make(std::uint64_t capacity = 0, std::uint64_t granularity = kGranule) {
    host_options o;
    o.alignment = 64;
    o.max_page_size = GiB;
    o.capacity = capacity;
    o.map_granularity = granularity;
    return std::make_unique<backend>(o);
  }
  static const char* name() { return "host"; }
};

struct sim_traits {
  using backend = sim_storage;
  static constexpr bool has_memory = false;
  static std::unique_ptr<backend> make(std::uint64_t capacity = 0, std::uint64_t granularity = kGranule) {
    sim_options o;
    o.props = device_properties{GiB, 512, capacity, granularity};
    return std::make_unique<backend>(o);
  }
  static const char* name() { return "sim"; }
};

template <class Traits>
class MappingConformance : public ::testing::Test {
 protected:
  using backend = typename Traits::backend;
  static_assert(storage_backend<backend>);

  std::unique_ptr<backend> s_ = Traits::make();

  storage_id range_ok(std::uint64_t size, std::uint64_t unit = kGranule) {
    auto r = s_->reserve_range(size, unit);
    EXPECT_TRUE(r) << "reserve_range(" << size << ", " << unit << "): " << (r ? "" : r.err().message());
    return r ? r->id : 0;
  }
  void map_ok(storage_id range, std::uint64_t offset, std::uint64_t size) {
    auto r = s_->map(range, offset, size);
    EXPECT_TRUE(r) << "map(" << offset << ", " << size << "): " << (r ? "" : r.err().message());
  }
  std::uint64_t allocated() const { return s_->allocated_bytes(); }
};

struct traits_names {
  template <class T>
  static std::string GetName(int) {
    return T::name();
  }
};

using backends = ::testing::Types<host_traits, sim_traits>;
TYPED_TEST_SUITE(MappingConformance, backends, traits_names);

TYPED_TEST(MappingConformance, PropertiesReportTheGranularity) {
  EXPECT_EQ(this->s_->properties().map_granularity, kGranule);
}

TYPED_TEST(MappingConformance, ReserveRangeChecksTheUnitAndTheSize) {
  const std::pair<std::uint64_t, std::uint64_t> bad[] = {
      {8 * MiB, 1 * MiB},   // unit below the granularity
      {9 * MiB, 3 * MiB},   // unit not a multiple of the granularity
      {8 * MiB, 0},         // no unit
      {5 * MiB, kGranule},  // size not a multiple of the unit
      {6 * MiB, 4 * MiB},   // size a multiple of the granularity but not of the unit
      {0, kGranule},        // no size
  };
  for (const auto& [size, unit] : bad) {
    SCOPED_TRACE(testing::Message() << "size " << size << ", unit " << unit);
    auto r = this->s_->reserve_range(size, unit);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), errc::invalid_argument);
  }
  auto r = this->s_->reserve_range(8 * MiB, 4 * MiB);
  ASSERT_TRUE(r) << r.err().message();
  EXPECT_NE(r->id, 0u);
  EXPECT_EQ(r->offset, 0u);
  EXPECT_EQ(r->size, 8 * MiB);
  auto other = this->s_->reserve_range(64 * MiB, kGranule);
  ASSERT_TRUE(other);
  EXPECT_NE(other->id, r->id);
  auto page = this->s_->alloc(4096);
  ASSERT_TRUE(page);
  EXPECT_NE(page->id, r->id);
  EXPECT_NE(page->id, other->id);
  EXPECT_EQ(this->allocated(), 4096u) << "a reserved range holds no memory";
}

TYPED_TEST(MappingConformance, MapAndUnmapAreCounted) {
  const storage_id range = this->range_ok(64 * MiB);
  EXPECT_EQ(this->allocated(), 0u);
  this->map_ok(range, 2 * MiB, 4 * MiB);
  EXPECT_EQ(this->allocated(), 4 * MiB);
  this->map_ok(range, 8 * MiB, 2 * MiB);
  this->map_ok(range, 62 * MiB, 2 * MiB);  // the last granule
  EXPECT_EQ(this->allocated(), 8 * MiB);
  this->s_->unmap(range, 2 * MiB, 4 * MiB);
  EXPECT_EQ(this->allocated(), 4 * MiB);
  // Unmapped bytes may be mapped again at once.
  this->map_ok(range, 2 * MiB, 4 * MiB);
  EXPECT_EQ(this->allocated(), 8 * MiB);
  this->s_->unmap(range, 2 * MiB, 4 * MiB);
  this->s_->unmap(range, 8 * MiB, 2 * MiB);
  this->s_->unmap(range, 62 * MiB, 2 * MiB);
  EXPECT_EQ(this->allocated(), 0u);
  if constexpr (std::is_same_v<typename TypeParam::backend, sim_storage>) {
    EXPECT_EQ(this->s_->mapped_bytes(), 0u);
    EXPECT_EQ(this->s_->misuses(), 0u);
  }
}

TYPED_TEST(MappingConformance, MapRejectsWhatIsNotWholeGranulesInsideTheRange) {
  const storage_id range = this->range_ok(64 * MiB);
  struct bad_map {
    std::uint64_t offset;
    std::uint64_t size;
  };
  const bad_map cases[] = {
      {1 * MiB, kGranule},                    // offset inside a granule
      {0, 1 * MiB},                           // part of a granule
      {0, 3 * MiB},                           // a granule and a half
      {0, 0},                                 // nothing
      {62 * MiB, 4 * MiB},                    // past the end
      {64 * MiB, kGranule},                   // at the end
      {UINT64_MAX - kGranule + 1, kGranule},  // far past the end
  };
  for (const bad_map& c : cases) {
    SCOPED_TRACE(testing::Message() << "offset " << c.offset << ", size " << c.size);
    auto r = this->s_->map(range, c.offset, c.size);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.code(), errc::invalid_argument);
  }
  // A range that does not exist (or a page that is not a range).
  auto unknown = this->s_->map(range + 1000, 0, kGranule);
  ASSERT_FALSE(unknown);
  EXPECT_TRUE(unknown.code() == errc::not_found || unknown.code() == errc::invalid_argument) << unknown.err().message();
  EXPECT_EQ(this->allocated(), 0u);
}

TYPED_TEST(MappingConformance, MapOfAMappedUnitIsRejected) {
  const storage_id range = this->range_ok(64 * MiB);
  this->map_ok(range, 0, kGranule);
  EXPECT_EQ(this->allocated(), kGranule);
  auto twice = this->s_->map(range, 0, kGranule);
  ASSERT_FALSE(twice);
  EXPECT_EQ(twice.code(), errc::invalid_argument);
  // Overlapping at the start of a larger request: nothing of it is mapped.
  auto overlapping = this->s_->map(range, 0, 4 * MiB);
  ASSERT_FALSE(overlapping);
  EXPECT_EQ(overlapping.code(), errc::invalid_argument);
  // Overlapping at the end: the granules before the mapped one are not left mapped.
  this->map_ok(range, 6 * MiB, kGranule);
  auto tail = this->s_->map(range, 2 * MiB, 6 * MiB);
  ASSERT_FALSE(tail);
  EXPECT_EQ(tail.code(), errc::invalid_argument);
  EXPECT_EQ(this->allocated(), 2 * kGranule);
  this->map_ok(range, 2 * MiB, 4 * MiB);
  EXPECT_EQ(this->allocated(), 4 * kGranule);
}

TYPED_TEST(MappingConformance, MapRejectsPartialUnitsOfTheRange) {
  const storage_id range = this->range_ok(16 * MiB, 4 * MiB);
  EXPECT_EQ(this->s_->map(range, 0, 2 * MiB).code(), errc::invalid_argument);
  EXPECT_EQ(this->s_->map(range, 2 * MiB, 4 * MiB).code(), errc::invalid_argument);
  this->map_ok(range, 4 * MiB, 8 * MiB);
  EXPECT_EQ(this->allocated(), 8 * MiB);
}

TYPED_TEST(MappingConformance, GetResolvesViewsOfMappedMemory) {
  const storage_id range = this->range_ok(64 * MiB);
  this->map_ok(range, 2 * MiB, 4 * MiB);
  const storage_handle view{range, 2 * MiB + 100, 1000};
  auto g = this->s_->get(view);
  ASSERT_TRUE(g) << g.err().message();
  EXPECT_EQ(g->size, 1000u);
  EXPECT_EQ(g->handle, view);
  // A view across the two mapped granules.
  const storage_handle across{range, 3 * MiB, 2 * MiB};
  auto a = this->s_->get(across);
  ASSERT_TRUE(a) << a.err().message();
  // A view past the end of the range.
  EXPECT_FALSE(this->s_->get(storage_handle{range, 63 * MiB, 2 * MiB}));
  if constexpr (TypeParam::has_memory) {
    auto base = this->s_->get(storage_handle{range, 2 * MiB, 1});
    ASSERT_TRUE(base);
    ASSERT_NE(base->ptr, nullptr);
    EXPECT_EQ(static_cast<std::byte*>(g->ptr) - static_cast<std::byte*>(base->ptr), 100);
    // Every mapped byte is writable; write() and read() go through the same memory.
    std::memset(a->ptr, 0x3C, 2 * MiB);
    const storage_handle edge{range, 3 * MiB - 500, 1000};
    std::vector<unsigned char> out(1000);
    ASSERT_TRUE(this->s_->read(edge, out.data()));
    for (std::size_t i = 0; i < out.size(); ++i) {
      EXPECT_EQ(out[i], i >= 500 ? 0x3C : 0x00) << "byte " << i;
    }
    const std::vector<unsigned char> in(1000, 0x77);
    ASSERT_TRUE(this->s_->write(view, in.data()));
    EXPECT_EQ(static_cast<unsigned char*>(g->ptr)[999], 0x77);
  } else {
    EXPECT_EQ(g->ptr, nullptr);
  }
}

TYPED_TEST(MappingConformance, ReleaseRangeThenFlushFreesEverything) {
  const storage_id range = this->range_ok(64 * MiB);
  const storage_id kept = this->range_ok(8 * MiB);
  this->map_ok(range, 0, 4 * MiB);
  this->map_ok(range, 10 * MiB, 2 * MiB);
  this->map_ok(kept, 0, 2 * MiB);
  EXPECT_EQ(this->allocated(), 8 * MiB);
  this->s_->release_range(range);
  EXPECT_EQ(this->s_->pending_deallocations(), 1u);
  EXPECT_EQ(this->allocated(), 8 * MiB) << "the release takes effect at the flush";
  ASSERT_TRUE(this->s_->flush());
  EXPECT_EQ(this->s_->pending_deallocations(), 0u);
  EXPECT_EQ(this->allocated(), 2 * MiB);
  EXPECT_FALSE(this->s_->get(storage_handle{range, 0, 1})) << "a released range no longer resolves";
  EXPECT_FALSE(this->s_->map(range, 0, kGranule));
  EXPECT_TRUE(this->s_->get(storage_handle{kept, 0, 1}));
  if constexpr (std::is_same_v<typename TypeParam::backend, sim_storage>) {
    EXPECT_EQ(this->s_->range_count(), 1u);
    EXPECT_EQ(this->s_->mapped_bytes(), 2 * MiB);
  }
  // Unmapping first, then releasing, frees the same.
  this->s_->unmap(kept, 0, 2 * MiB);
  this->s_->release_range(kept);
  ASSERT_TRUE(this->s_->flush());
  EXPECT_EQ(this->allocated(), 0u);
  if constexpr (std::is_same_v<typename TypeParam::backend, sim_storage>) {
    EXPECT_EQ(this->s_->range_count(), 0u);
    EXPECT_EQ(this->s_->mapped_bytes(), 0u);
    EXPECT_EQ(this->s_->misuses(), 0u);
  } else {
    EXPECT_EQ(this->s_->page_count(), 0u);
  }
}

TYPED_TEST(MappingConformance, CapacityCountsMappedBytes) {
  this->s_ = TypeParam::make(8 * MiB);
  const storage_id range = this->range_ok(64 * MiB);
  auto page = this->s_->alloc(2 * MiB);
  ASSERT_TRUE(page);
  this->map_ok(range, 0, kGranule);
  this->map_ok(range, kGranule, 2 * kGranule);
  EXPECT_EQ(this->allocated(), 8 * MiB);
  auto over = this->s_->map(range, 6 * MiB, kGranule);
  ASSERT_FALSE(over);
  EXPECT_EQ(over.code(), errc::out_of_memory);
  EXPECT_EQ(over.err().size, kGranule);
  EXPECT_EQ(this->s_->alloc(1).code(), errc::out_of_memory) << "mapped bytes count against pages too";
  EXPECT_EQ(this->allocated(), 8 * MiB);
  this->s_->unmap(range, 0, kGranule);
  this->map_ok(range, 6 * MiB, kGranule);
  EXPECT_EQ(this->allocated(), 8 * MiB);
}

TYPED_TEST(MappingConformance, WithoutGranularityRangesAreUnsupported) {
  storage st(TypeParam::make(0, 0));
  EXPECT_EQ(st.properties().map_granularity, 0u);
  auto r = st.reserve_range(8 * MiB, kGranule);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::unsupported);
  EXPECT_NE(r.err().message().find("not supported"), std::string::npos) << r.err().message();
  // Nothing can be mapped either, and pages still work.
  EXPECT_FALSE(st.map(1, 0, kGranule));
  auto page = st.alloc(4096);
  ASSERT_TRUE(page);
  EXPECT_FALSE(st.map(page->id, 0, kGranule)) << "a page is not a range";
  EXPECT_TRUE(st.get(*page));
}

TYPED_TEST(MappingConformance, ThroughTheTypeErasedStorage) {
  storage st(TypeParam::make());
  EXPECT_EQ(st.properties().map_granularity, kGranule);
  auto r = st.reserve_range(16 * MiB, kGranule);
  ASSERT_TRUE(r) << r.err().message();
  ASSERT_TRUE(st.map(r->id, 4 * MiB, 4 * MiB));
  auto* b = st.backend<typename TypeParam::backend>();
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->allocated_bytes(), 4 * MiB);
  EXPECT_TRUE(st.get(storage_handle{r->id, 5 * MiB, 1 * MiB}));
  st.unmap(r->id, 4 * MiB, 4 * MiB);
  EXPECT_EQ(b->allocated_bytes(), 0u);
  st.release_range(r->id);
  EXPECT_EQ(st.pending_deallocations(), 1u);
  ASSERT_TRUE(st.flush());
  EXPECT_EQ(st.pending_deallocations(), 0u);
}

// ---- Host specifics ----

TEST(HostMapping, RemappedGranuleReadsZeros) {
  auto s = host_traits::make();
  auto range = s->reserve_range(16 * MiB, kGranule);
  ASSERT_TRUE(range);
  ASSERT_TRUE(s->map(range->id, 2 * MiB, 2 * MiB));
  ASSERT_TRUE(s->map(range->id, 4 * MiB, 2 * MiB));
  auto g = s->get(storage_handle{range->id, 2 * MiB, 4 * MiB});
  ASSERT_TRUE(g);
  auto* p = static_cast<unsigned char*>(g->ptr);
  // Fresh memory is zero-filled.
  std::size_t nonzero = 0;
  for (std::uint64_t i = 0; i < 4 * MiB; i += 4096) nonzero += p[i] != 0 ? 1 : 0;
  EXPECT_EQ(nonzero, 0u);
  std::memset(p, 0xEE, 4 * MiB);
  s->unmap(range->id, 2 * MiB, 2 * MiB);
  EXPECT_EQ(s->allocated_bytes(), 2 * MiB);
  EXPECT_EQ(p[2 * MiB], 0xEE) << "the other granule keeps its bytes";
  ASSERT_TRUE(s->map(range->id, 2 * MiB, 2 * MiB));
  nonzero = 0;
  for (std::uint64_t i = 0; i < 2 * MiB; ++i) nonzero += p[i] != 0 ? 1 : 0;
  EXPECT_EQ(nonzero, 0u) << "a granule mapped again reads zeros";
  EXPECT_EQ(p[2 * MiB], 0xEE);
  EXPECT_EQ(p[4 * MiB - 1], 0xEE);
}

TEST(HostMapping, DestructorReleasesRangesStillHeld) {
  auto s = host_traits::make();
  auto range = s->reserve_range(64 * MiB, kGranule);
  ASSERT_TRUE(range);
  ASSERT_TRUE(s->map(range->id, 0, 8 * MiB));
  auto g = s->get(storage_handle{range->id, 0, 8 * MiB});
  ASSERT_TRUE(g);
  void* at = g->ptr;
  ASSERT_EQ(::msync(at, 64 * MiB, MS_ASYNC), 0) << "the range is mapped while the storage lives";
  s.reset();
  // The addresses went back to the kernel: msync of an unmapped range fails with ENOMEM.
  errno = 0;
  EXPECT_EQ(::msync(at, 64 * MiB, MS_ASYNC), -1);
  EXPECT_EQ(errno, ENOMEM);
}

// ---- Sim specifics ----

TEST(SimMapping, FailAllocationAppliesToMap) {
  auto s = sim_traits::make();
  auto range = s->reserve_range(64 * MiB, kGranule);
  ASSERT_TRUE(range);
  const std::uint64_t calls = s->alloc_calls();
  s->fail_allocation(2);
  ASSERT_TRUE(s->map(range->id, 0, kGranule));
  auto failed = s->map(range->id, 2 * MiB, 4 * MiB);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.code(), errc::out_of_memory);
  EXPECT_EQ(failed.err().size, 4 * MiB);
  EXPECT_NE(failed.err().message().find("injected"), std::string::npos) << failed.err().message();
  EXPECT_EQ(s->alloc_calls(), calls + 2);
  EXPECT_EQ(s->mapped_bytes(), kGranule);
  EXPECT_EQ(s->allocated_bytes(), kGranule);
  // The failure is spent, and nothing of the failed map was left behind.
  ASSERT_TRUE(s->map(range->id, 2 * MiB, 4 * MiB));
  EXPECT_EQ(s->mapped_bytes(), 3 * kGranule);
  EXPECT_EQ(s->allocations(), 2u);

  // Pages and maps share the count of allocations.
  s->fail_allocation(1);
  EXPECT_EQ(s->alloc(4096).code(), errc::out_of_memory);
  ASSERT_TRUE(s->map(range->id, 8 * MiB, kGranule));
  s->fail_allocation(2);
  ASSERT_TRUE(s->alloc(4096));
  EXPECT_EQ(s->map(range->id, 10 * MiB, kGranule).code(), errc::out_of_memory);
  EXPECT_EQ(s->misuses(), 0u);
}

TEST(SimMapping, CapacityAndPeakCountMappedBytes) {
  auto s = sim_traits::make();
  s->set_capacity(6 * MiB);
  auto range = s->reserve_range(64 * MiB, kGranule);
  ASSERT_TRUE(range);
  ASSERT_TRUE(s->map(range->id, 0, 4 * MiB));
  ASSERT_TRUE(s->map(range->id, 4 * MiB, 2 * MiB));
  EXPECT_EQ(s->peak_allocated_bytes(), 6 * MiB);
  auto over = s->map(range->id, 6 * MiB, kGranule);
  EXPECT_EQ(over.code(), errc::out_of_memory);
  EXPECT_NE(over.err().message().find("capacity"), std::string::npos) << over.err().message();
  s->unmap(range->id, 0, 4 * MiB);
  ASSERT_TRUE(s->map(range->id, 6 * MiB, kGranule));
  EXPECT_EQ(s->allocated_bytes(), 4 * MiB);
  EXPECT_EQ(s->peak_allocated_bytes(), 6 * MiB);
}

TEST(SimMapping, GetOfAnUnmappedViewFails) {
  auto s = sim_traits::make();
  auto range = s->reserve_range(16 * MiB, kGranule);
  ASSERT_TRUE(range);
  EXPECT_EQ(s->get(storage_handle{range->id, 0, 1}).code(), errc::invalid_argument);
  ASSERT_TRUE(s->map(range->id, 2 * MiB, kGranule));
  EXPECT_TRUE(s->get(storage_handle{range->id, 2 * MiB, kGranule}));
  EXPECT_TRUE(s->get(storage_handle{range->id, 3 * MiB, 0}));
  // Partly mapped views fail, at either end.
  EXPECT_EQ(s->get(storage_handle{range->id, 1 * MiB, 2 * MiB}).code(), errc::invalid_argument);
  EXPECT_EQ(s->get(storage_handle{range->id, 3 * MiB, 2 * MiB}).code(), errc::invalid_argument);
  EXPECT_EQ(s->get(storage_handle{range->id, 15 * MiB, 2 * MiB}).code(), errc::invalid_argument);
}

TEST(SimMapping, MisusesCountsBadUnmapsAndReleases) {
  auto s = sim_traits::make();
  auto range = s->reserve_range(16 * MiB, kGranule);
  ASSERT_TRUE(range);
  ASSERT_TRUE(s->map(range->id, 0, kGranule));
  EXPECT_EQ(s->misuses(), 0u);

  s->unmap(range->id, 4 * MiB, kGranule);  // not mapped
  EXPECT_EQ(s->misuses(), 1u);
  s->unmap(range->id + 1000, 0, kGranule);  // no such range
  EXPECT_EQ(s->misuses(), 2u);
  s->unmap(range->id, 0, 1 * MiB);  // part of a granule
  EXPECT_EQ(s->misuses(), 3u);
  s->unmap(range->id, 16 * MiB, kGranule);  // outside the range
  EXPECT_EQ(s->misuses(), 4u);
  s->release_range(range->id + 1000);  // no such range
  EXPECT_EQ(s->misuses(), 5u);
  EXPECT_EQ(s->mapped_bytes(), kGranule) << "bad calls change nothing";
  EXPECT_EQ(s->pending_deallocations(), 0u);

  // More than one mapping: a misuse, and nothing is unmapped; then the mapping itself.
  s->unmap(range->id, 0, 4 * MiB);
  EXPECT_EQ(s->misuses(), 6u);
  EXPECT_EQ(s->mapped_bytes(), kGranule);
  s->unmap(range->id, 0, kGranule);
  EXPECT_EQ(s->misuses(), 6u);
  EXPECT_EQ(s->mapped_bytes(), 0u);
  EXPECT_EQ(s->allocated_bytes(), 0u);

  // A range released twice: the second one names a range that is gone after the flush.
  s->release_range(range->id);
  ASSERT_TRUE(s->flush());
  s->release_range(range->id);
  EXPECT_EQ(s->misuses(), 7u);
}

// unmap_idle: memory the caller knows no queued work reaches goes back at once, even behind a busy
// stream, its physical memory kept for the next map of its size (as after a settle); bad bounds are
// misuses, as for unmap.
TEST(SimMapping, AnIdleUnmapIsDoneAtOnceBehindABusyStream) {
  sim_options o;
  o.props = device_properties{GiB, 512, 0, kGranule};
  o.streams = true;
  o.deferred_unmaps = true;
  sim_storage s(o);
  auto range = s.reserve_range(16 * MiB, kGranule);
  ASSERT_TRUE(range);
  ASSERT_TRUE(s.map(range->id, 0, 2 * kGranule));
  ASSERT_TRUE(s.map(range->id, 4 * MiB, kGranule));
  (void)s.record_event(devrt::memory::streams::device).value();  // work still queued

  s.unmap(range->id, 4 * MiB, kGranule);
  EXPECT_EQ(s.returning_bytes(), kGranule) << "a plain unmap waits behind the queue";
  s.unmap_idle(range->id, 0, 2 * kGranule);
  EXPECT_EQ(s.kept_allocations(), 1u);
  EXPECT_EQ(s.kept_bytes(), 2 * kGranule);
  EXPECT_EQ(s.mapped_bytes(), kGranule) << "the idle unmap was not done at once";

  ASSERT_TRUE(s.map(range->id, 8 * MiB, 2 * kGranule));  // takes the kept memory
  EXPECT_EQ(s.reused_allocations(), 1u);
  EXPECT_EQ(s.kept_allocations(), 0u);

  s.unmap_idle(range->id, 2 * MiB, kGranule);   // inside a mapping, not one
  s.unmap_idle(range->id + 1000, 0, kGranule);  // no such range
  EXPECT_EQ(s.misuses(), 2u);
  EXPECT_EQ(s.mapped_bytes(), 3 * kGranule) << "bad calls change nothing";
  s.progress();
  ASSERT_TRUE(s.flush());
  EXPECT_EQ(s.returning_bytes(), 0u);
  EXPECT_EQ(s.mapped_bytes(), 2 * kGranule);
  EXPECT_EQ(s.waits(), 0u);
}

TEST(SimMapping, AFailedMapOnAMappedGranuleLeavesNothingBehind) {
  auto s = sim_traits::make();
  auto range = s->reserve_range(16 * MiB, kGranule);
  ASSERT_TRUE(range);
  ASSERT_TRUE(s->map(range->id, 4 * MiB, kGranule));
  EXPECT_EQ(s->map(range->id, 0, 6 * MiB).code(), errc::invalid_argument);
  EXPECT_EQ(s->mapped_bytes(), kGranule);
  // Granules 0 and 1 were not left mapped.
  EXPECT_EQ(s->get(storage_handle{range->id, 0, 1}).code(), errc::invalid_argument);
  ASSERT_TRUE(s->map(range->id, 0, 4 * MiB));
  EXPECT_EQ(s->mapped_bytes(), 3 * kGranule);
  EXPECT_EQ(s->misuses(), 0u);
}

TEST(SimMapping, FlushOfAReleasedRangeCountsItsGranulesAsFreed) {
  auto s = sim_traits::make();
  auto range = s->reserve_range(16 * MiB, kGranule);
  ASSERT_TRUE(range);
  ASSERT_TRUE(s->map(range->id, 0, 6 * MiB));
  const std::uint64_t frees = s->frees();
  s->release_range(range->id);
  EXPECT_EQ(s->range_count(), 1u);
  EXPECT_EQ(s->mapped_bytes(), 6 * MiB);
  s->fail_next_flush();
  EXPECT_EQ(s->flush().code(), errc::device_error);
  EXPECT_EQ(s->range_count(), 1u) << "a failed flush keeps the queue";
  ASSERT_TRUE(s->flush());
  EXPECT_EQ(s->range_count(), 0u);
  EXPECT_EQ(s->mapped_bytes(), 0u);
  EXPECT_EQ(s->allocated_bytes(), 0u);
  EXPECT_GT(s->frees(), frees);
}

// ---- A backend without the capability ----

// The smallest storage backend: pages only, no address ranges.
class pages_only {
 public:
  [[nodiscard]] std::uint64_t alignment() const { return 1; }
  [[nodiscard]] device_properties properties() const { return device_properties{MiB, 1, 0, 0}; }
  result<storage_handle> alloc(std::uint64_t size) { return storage_handle{next_++, 0, size}; }
  void dealloc(storage_id /*id*/) {}
  result<void> flush() { return {}; }
  result<resource> get(const storage_handle& h) { return resource{nullptr, h.size, h}; }
  result<void> write(const storage_handle& /*h*/, const void* /*src*/) { return {}; }
  result<void> read(const storage_handle& /*h*/, void* /*dst*/) { return {}; }
  [[nodiscard]] std::size_t pending_deallocations() const { return 0; }
  [[nodiscard]] std::string name() const { return "pages-only"; }

 private:
  storage_id next_ = 1;
};
static_assert(storage_backend<pages_only>);
static_assert(!mapping_backend<pages_only>);

TEST(MappingWrapper, ABackendWithoutTheCapabilityIsUnsupported) {
  storage st = storage::make<pages_only>();
  auto r = st.reserve_range(8 * MiB, kGranule);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::unsupported);
  auto m = st.map(1, 0, kGranule);
  ASSERT_FALSE(m);
  EXPECT_EQ(m.code(), errc::unsupported);
  // unmap and release_range do nothing.
  st.unmap(1, 0, kGranule);
  st.release_range(1);
  EXPECT_EQ(st.pending_deallocations(), 0u);
}

TEST(MappingWrapper, DefaultSimAndHostWithoutGranularity) {
  storage sim = storage::make<sim_storage>(sim_options{});
  EXPECT_EQ(sim.properties().map_granularity, 0u);
  EXPECT_EQ(sim.reserve_range(8 * MiB, kGranule).code(), errc::unsupported);
  host_options ho;
  ho.map_granularity = 0;
  storage host = storage::make<host_storage>(ho);
  EXPECT_EQ(host.properties().map_granularity, 0u);
  EXPECT_EQ(host.reserve_range(8 * MiB, kGranule).code(), errc::unsupported);
}

}  // namespace
