// Layout presets, layout validation, the text forms of sizes, layouts and policies, and the error
// type (cubecl-behaviour.md §2.3, §5; the resolve_* tests of memory_manage.rs).
#include "devrt/memory/config.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "devrt/memory/error.hpp"
#include "devrt/memory/pool_context.hpp"

namespace {

using namespace devrt;
using namespace devrt::memory;

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t MiB = 1024 * KiB;
constexpr std::uint64_t GiB = 1024 * MiB;
constexpr std::uint64_t TiB = 1024 * GiB;

constexpr device_properties kProps{128 * MiB, 32, 0};
constexpr device_properties kCuda24G{6 * GiB, 512, 24 * GiB};

using opt = std::optional<std::uint64_t>;

sliced_pool_config sliced(std::uint64_t page, opt slice = std::nullopt, opt cap = std::nullopt,
                          opt period = std::nullopt) {
  sliced_pool_config c;
  c.page_size = page;
  c.max_slice_size = slice;
  c.max_pool_size = cap;
  c.dealloc_period = period;
  return c;
}

exclusive_pool_config exclusive(std::uint64_t max_alloc, opt period = std::nullopt) {
  exclusive_pool_config c;
  c.max_alloc_size = max_alloc;
  c.dealloc_period = period;
  return c;
}

pool_options excl(std::uint64_t max_alloc, opt period = std::nullopt) {
  return pool_options{pool_kind::exclusive, 0, max_alloc, std::nullopt, period};
}
pool_options slc(std::uint64_t page, std::uint64_t slice, opt cap = std::nullopt, opt period = std::nullopt) {
  return pool_options{pool_kind::sliced, page, slice, cap, period};
}

result<std::vector<pool_options>> resolve_one(const pool_config& c, device_properties props = kProps) {
  return resolve_layout(memory_layout(std::vector<pool_config>{c}), props);
}

bool mentions(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

// ------------------------------------------------------------------------------------------------
// Presets (§2.3)
// ------------------------------------------------------------------------------------------------

TEST(RefConfigPresets, SubSlicesTestDevice) {
  // 128 MiB / align 32 -> [Excl(0); 8 MiB page, 2 MiB slice; 32 MiB / 16 MiB; 128 MiB / 128 MiB].
  const std::vector<pool_options> expected{
      excl(0),
      slc(8 * MiB, 2 * MiB),
      slc(32 * MiB, 16 * MiB),
      slc(128 * MiB, 128 * MiB),
  };
  EXPECT_EQ(preset_pools(preset::sub_slices, kProps), expected);
  auto r = resolve_layout(preset::sub_slices, kProps);
  ASSERT_TRUE(r) << r.err().message();
  EXPECT_EQ(*r, expected);
  // The default layout is the sub-slices preset.
  auto def = resolve_layout(memory_layout{}, kProps);
  ASSERT_TRUE(def);
  EXPECT_EQ(*def, expected);
}

TEST(RefConfigPresets, SubSlicesCuda24GiB) {
  // max_page = 6 GiB, align 512 ->
  // [Excl(0); 24 MiB/1.5 MiB; 96 MiB/12 MiB; 384 MiB/96 MiB; 1.5 GiB/768 MiB; 6 GiB/6 GiB].
  const std::vector<pool_options> expected{
      excl(0),
      slc(24 * MiB, 3 * MiB / 2),
      slc(96 * MiB, 12 * MiB),
      slc(384 * MiB, 96 * MiB),
      slc(3 * GiB / 2, 768 * MiB),
      slc(6 * GiB, 6 * GiB),
  };
  EXPECT_EQ(preset_pools(preset::sub_slices, kCuda24G), expected);
}

TEST(RefConfigPresets, SubSlicesSmallDeviceHasNoLadder) {
  // Below 32 MiB there is no ladder: the zero-size pool and one page of the whole maximum.
  const device_properties small{16 * MiB, 512, 0};
  const std::vector<pool_options> expected{excl(0), slc(16 * MiB, 16 * MiB)};
  EXPECT_EQ(preset_pools(preset::sub_slices, small), expected);
  // An unaligned maximum page is rounded down to the alignment.
  const device_properties odd{16 * MiB + 100, 512, 0};
  EXPECT_EQ(preset_pools(preset::sub_slices, odd).back().page_size, 16 * MiB);
}

TEST(RefConfigPresets, SubSlicesWithALargeAlignmentEndsTheLadder) {
  // Pages cannot shrink below the alignment: the ladder stops where a quarter page would not be
  // smaller than the page (it once looped for ever from 32 MiB up).
  for (const std::uint64_t align : {32 * MiB, 64 * MiB, GiB}) {
    const device_properties props{4 * GiB, align, 0};
    const std::vector<pool_options> pools = preset_pools(preset::sub_slices, props);
    ASSERT_LE(pools.size(), 8u) << align;
    for (std::size_t i = 1; i < pools.size(); ++i) {
      EXPECT_EQ(pools[i].page_size % align, 0u) << align;
      if (i + 1 < pools.size()) {
        EXPECT_LT(pools[i].page_size, pools[i + 1].page_size) << align;
      }
    }
    EXPECT_EQ(pools.back().page_size, 4 * GiB) << align;
  }
}

// The bucket sizes of the exclusive-pages preset: exp(ln(32 KiB) + (ln(max) - ln(32 KiB)) * i / 23),
// truncated, aligned up, consecutive duplicates removed.
std::vector<std::uint64_t> expected_buckets(const device_properties& props) {
  std::vector<std::uint64_t> out;
  const double lo = std::log(32.0 * 1024.0);
  const double hi = std::log(static_cast<double>(props.max_page_size));
  for (int i = 0; i < 24; ++i) {
    const double p = static_cast<double>(i) / 23.0;
    const auto raw = static_cast<std::uint64_t>(std::exp(lo + (hi - lo) * p));
    const std::uint64_t size = align_up(raw, props.alignment);
    if (!out.empty() && out.back() == size) continue;
    out.push_back(size);
  }
  return out;
}

TEST(RefConfigPresets, ExclusivePagesTestDevice) {
  const auto pools = preset_pools(preset::exclusive_pages, kProps);
  ASSERT_EQ(pools.size(), 24u);
  EXPECT_EQ(pools.front().max_alloc_size, 32 * KiB);
  EXPECT_EQ(pools.back().max_alloc_size, 128 * MiB);
  const auto sizes = expected_buckets(kProps);
  ASSERT_EQ(sizes.size(), 24u);
  for (std::size_t i = 0; i < pools.size(); ++i) {
    EXPECT_EQ(pools[i].kind, pool_kind::exclusive) << i;
    EXPECT_EQ(pools[i].max_alloc_size, sizes[i]) << i;
    EXPECT_EQ(pools[i].max_alloc_size % 32, 0u) << i;
    EXPECT_EQ(pools[i].dealloc_period, opt(5000)) << "every bucket is under 0.5 GiB: " << i;
    EXPECT_FALSE(pools[i].max_pool_size.has_value());
    if (i > 0) {
      // Log-spaced: a constant ratio of 4096^(1/23), about 1.436.
      const double ratio =
          static_cast<double>(pools[i].max_alloc_size) / static_cast<double>(pools[i - 1].max_alloc_size);
      EXPECT_NEAR(ratio, std::pow(4096.0, 1.0 / 23.0), 0.01) << i;
    }
  }
}

TEST(RefConfigPresets, ExclusivePagesCuda24GiB) {
  const auto pools = preset_pools(preset::exclusive_pages, kCuda24G);
  ASSERT_EQ(pools.size(), 24u);
  const auto sizes = expected_buckets(kCuda24G);
  ASSERT_EQ(sizes.size(), pools.size());
  EXPECT_EQ(pools.front().max_alloc_size, 32 * KiB);
  EXPECT_EQ(pools.back().max_alloc_size, 6 * GiB);
  EXPECT_EQ(pools.back().dealloc_period, opt(35000));
  for (std::size_t i = 0; i < pools.size(); ++i) {
    EXPECT_EQ(pools[i].max_alloc_size, sizes[i]) << i;
    EXPECT_EQ(pools[i].max_alloc_size % 512, 0u) << i;
    const std::uint64_t size = pools[i].max_alloc_size;
    // period = 5000 * round(1 + size / 1 GiB)
    const auto expected_period =
        static_cast<std::uint64_t>(5000.0 * std::round(1.0 + static_cast<double>(size) / static_cast<double>(GiB)));
    EXPECT_EQ(pools[i].dealloc_period, opt(expected_period)) << i;
    if (size < GiB / 2) {
      EXPECT_EQ(pools[i].dealloc_period, opt(5000)) << i;
    }
    if (i > 0) {
      EXPECT_GT(size, pools[i - 1].max_alloc_size);
    }
  }
}

TEST(RefConfigPresets, ExclusivePagesDeduplicatesBuckets) {
  // With a 32 KiB alignment and a 64 KiB maximum every bucket is 32 KiB or 64 KiB.
  const auto pools = preset_pools(preset::exclusive_pages, device_properties{64 * KiB, 32 * KiB, 0});
  ASSERT_EQ(pools.size(), 2u);
  EXPECT_EQ(pools[0].max_alloc_size, 32 * KiB);
  EXPECT_EQ(pools[1].max_alloc_size, 64 * KiB);
}

TEST(RefConfigPresets, ResolvePresetsMatchPresetPools) {
  for (auto p : {preset::sub_slices, preset::exclusive_pages}) {
    auto r = resolve_layout(p, kCuda24G);
    ASSERT_TRUE(r);
    EXPECT_EQ(*r, preset_pools(p, kCuda24G)) << to_string(p);
  }
}

// ------------------------------------------------------------------------------------------------
// resolve_layout of explicit pools (§5.2)
// ------------------------------------------------------------------------------------------------

TEST(RefResolveLayout, ExplicitListAlignsAndDefaults) {
  auto r = resolve_layout(memory_layout(std::vector<pool_config>{
                              exclusive(8 * KiB, 10000), sliced(1000, std::nullopt, 4096),  // page rounded up to 1024
                              exclusive(1000),                                              // rounded up to 1024
                              exclusive(0),                // zero stays zero (zero-size allocations)
                              sliced(1024, 100, 4000, 7),  // slice aligned, cap kept as given
                          }),
                          kProps);
  ASSERT_TRUE(r) << r.err().message();
  const std::vector<pool_options> expected{
      excl(8192, 10000), slc(1024, 1024, 4096), excl(1024), excl(0), slc(1024, 128, 4000, 7),
  };
  EXPECT_EQ(*r, expected);
}

TEST(RefResolveLayout, EmptyPoolList) {
  auto r = resolve_layout(memory_layout(std::vector<pool_config>{}), kProps);
  ASSERT_EQ(r.code(), errc::empty_pool_list);
  EXPECT_TRUE(is_config_error(r.code()));
  EXPECT_TRUE(mentions(r.err().message(), "empty")) << r.err().message();
}

TEST(RefResolveLayout, ZeroSizeNamesTheField) {
  struct zero_case {
    pool_config pool;
    const char* field;
  };
  const std::vector<zero_case> cases{
      {sliced(0), "page_size"},
      {sliced(1024, 0), "max_slice_size"},
      {sliced(1024, std::nullopt, 0), "max_pool_size"},
      {sliced(1024, std::nullopt, std::nullopt, 0), "dealloc_period"},
      {exclusive(1024, 0), "dealloc_period"},
  };
  for (const auto& c : cases) {
    auto r = resolve_one(c.pool);
    ASSERT_EQ(r.code(), errc::zero_size) << c.field;
    EXPECT_EQ(std::string(r.err().detail), c.field);
    const std::string msg = r.err().message();
    EXPECT_TRUE(mentions(msg, c.field)) << msg;
    EXPECT_TRUE(mentions(msg, "non-zero")) << msg;
  }
  // The message names the pool that is wrong.
  auto second = resolve_layout(memory_layout(std::vector<pool_config>{sliced(1024), sliced(0)}), kProps);
  ASSERT_EQ(second.code(), errc::zero_size);
  EXPECT_TRUE(mentions(second.err().message(), "pool 1")) << second.err().message();
}

TEST(RefResolveLayout, SliceLargerThanPage) {
  auto r = resolve_one(sliced(1024, 2048));
  ASSERT_EQ(r.code(), errc::slice_larger_than_page);
  EXPECT_EQ(r.err().size, 2048u);
  EXPECT_EQ(r.err().limit, 1024u);
  const std::string msg = r.err().message();
  EXPECT_TRUE(mentions(msg, "2048")) << msg;
  EXPECT_TRUE(mentions(msg, "1024")) << msg;
  // Compared after alignment: a 1000-byte slice is 1024 bytes, larger than a 992-byte page.
  auto aligned = resolve_one(sliced(992, 1000));
  ASSERT_EQ(aligned.code(), errc::slice_larger_than_page);
  EXPECT_EQ(aligned.err().size, 1024u);
  EXPECT_EQ(aligned.err().limit, 992u);
  // Equal is fine.
  EXPECT_TRUE(resolve_one(sliced(1024, 1024)));
}

TEST(RefResolveLayout, CapSmallerThanPage) {
  auto r = resolve_one(sliced(2048, std::nullopt, 1024));
  ASSERT_EQ(r.code(), errc::cap_smaller_than_page);
  EXPECT_EQ(r.err().size, 1024u);
  EXPECT_EQ(r.err().limit, 2048u);
  const std::string msg = r.err().message();
  EXPECT_TRUE(mentions(msg, "1024")) << msg;
  EXPECT_TRUE(mentions(msg, "2048")) << msg;
  // The cap is not aligned; it is compared with the aligned page.
  auto unaligned = resolve_one(sliced(1000, std::nullopt, 1000));
  ASSERT_EQ(unaligned.code(), errc::cap_smaller_than_page);
  EXPECT_EQ(unaligned.err().size, 1000u);
  EXPECT_EQ(unaligned.err().limit, 1024u);
  EXPECT_TRUE(resolve_one(sliced(2048, std::nullopt, 2048)));
}

TEST(RefResolveLayout, TooManyPages) {
  // 2^26 pages of 1 KiB.
  auto r = resolve_one(sliced(1024, std::nullopt, 64 * GiB));
  ASSERT_EQ(r.code(), errc::too_many_pages);
  EXPECT_EQ(r.err().size, 64u * 1024 * 1024);
  EXPECT_EQ(r.err().limit, max_pages_per_pool);
  const std::string msg = r.err().message();
  EXPECT_TRUE(mentions(msg, "67108864")) << msg;
  EXPECT_TRUE(mentions(msg, "65535")) << msg;
  // The boundary: 65535 pages are allowed, 65536 are not.
  EXPECT_TRUE(resolve_one(sliced(1024, std::nullopt, 65535 * 1024)));
  auto over = resolve_one(sliced(1024, std::nullopt, 65536 * 1024));
  ASSERT_EQ(over.code(), errc::too_many_pages);
  EXPECT_EQ(over.err().size, 65536u);
}

TEST(RefResolveLayout, TooManyPools) {
  auto r = resolve_layout(memory_layout(std::vector<pool_config>(255, exclusive(1024))), kProps);
  ASSERT_EQ(r.code(), errc::too_many_pools);
  EXPECT_EQ(r.err().size, 255u);
  EXPECT_EQ(r.err().limit, max_dynamic_pools);
  const std::string msg = r.err().message();
  EXPECT_TRUE(mentions(msg, "255")) << msg;
  EXPECT_TRUE(mentions(msg, "254")) << msg;
  // 254 dynamic pools are the most (index 255 is the persistent pool).
  auto most = resolve_layout(memory_layout(std::vector<pool_config>(254, exclusive(1024))), kProps);
  ASSERT_TRUE(most);
  EXPECT_EQ(most->size(), 254u);
}

// ------------------------------------------------------------------------------------------------
// parse_size / format_bytes
// ------------------------------------------------------------------------------------------------

std::uint64_t size_of(std::string_view text) {
  auto r = parse_size(text);
  if (!r) {
    ADD_FAILURE() << "parse_size(\"" << text << "\"): " << r.err().message();
    return 0;
  }
  return *r;
}

TEST(RefParseSize, Valid) {
  EXPECT_EQ(size_of("4096"), 4096u);
  EXPECT_EQ(size_of("0"), 0u);
  EXPECT_EQ(size_of("64MiB"), 64 * MiB);
  EXPECT_EQ(size_of("1.5GiB"), 3 * GiB / 2);
  EXPECT_EQ(size_of("1_000"), 1000u);
  EXPECT_EQ(size_of(" 2 KiB "), 2 * KiB);
  EXPECT_EQ(size_of("512B"), 512u);
  EXPECT_EQ(size_of("512 b"), 512u);
  EXPECT_EQ(size_of("2K"), 2 * KiB);
  EXPECT_EQ(size_of("2kb"), 2 * KiB);
  EXPECT_EQ(size_of("3M"), 3 * MiB);
  EXPECT_EQ(size_of("3 MB"), 3 * MiB);
  EXPECT_EQ(size_of("1g"), GiB);
  EXPECT_EQ(size_of("1T"), TiB);
  EXPECT_EQ(size_of("2TiB"), 2 * TiB);
  EXPECT_EQ(size_of("0.5KiB"), 512u);
  EXPECT_EQ(size_of("2.75MiB"), 2 * MiB + 3 * MiB / 4);
  EXPECT_EQ(size_of("1_024 KiB"), MiB);
  // Fractions round down to whole bytes.
  EXPECT_EQ(size_of("1.0001KiB"), 1024u);
  EXPECT_EQ(size_of("1.9999K"), 2047u);
  // Largest representable with a unit.
  EXPECT_EQ(size_of("16777215TiB"), 16777215 * TiB);
}

TEST(RefParseSize, CaseInsensitive) {
  EXPECT_EQ(size_of("64mib"), 64 * MiB);
  EXPECT_EQ(size_of("64MIB"), 64 * MiB);
  EXPECT_EQ(size_of("64mIb"), 64 * MiB);
  EXPECT_EQ(size_of("1GB"), GiB);
  EXPECT_EQ(size_of("1gib"), GiB);
  EXPECT_EQ(size_of("7 kIB"), 7 * KiB);
}

TEST(RefParseSize, Errors) {
  for (const char* bad : {"", "   ", "abc", "-1", "1.5", "12XB", "99999999999TiB", "1.", "KiB", "1.5.5MiB",
                          "16777216TiB", "99999999999999999999999", "1 2"}) {
    auto r = parse_size(bad);
    ASSERT_FALSE(r) << "accepted \"" << bad << "\" as " << *r;
    EXPECT_EQ(r.code(), errc::malformed_size) << bad;
    EXPECT_TRUE(is_config_error(r.code()));
    EXPECT_EQ(r.err().text, bad) << "the input is echoed back";
    EXPECT_TRUE(mentions(r.err().message(), std::string("'") + bad + "'")) << r.err().message();
  }
  EXPECT_TRUE(mentions(parse_size("-1").err().message(), "negative")) << parse_size("-1").err().message();
  EXPECT_TRUE(mentions(parse_size("12XB").err().message(), "unit")) << parse_size("12XB").err().message();
}

// Every value that fits in 64 bits parses, up to the largest.
TEST(RefParseSize, LargestByteCount) {
  EXPECT_EQ(size_of("18446744073709551615"), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(size_of("18446744073709551610"), std::numeric_limits<std::uint64_t>::max() - 5);
  EXPECT_EQ(parse_size("18446744073709551616").code(), errc::malformed_size);
}

TEST(RefFormatBytes, BinaryUnits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.00 KiB");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(64 * MiB), "64.00 MiB");
  EXPECT_EQ(format_bytes(3 * GiB / 2), "1.50 GiB");
  EXPECT_EQ(format_bytes(2 * TiB), "2.00 TiB");
  EXPECT_EQ(format_bytes(1024 * TiB), "1.00 PiB");
  EXPECT_EQ(format_bytes(std::numeric_limits<std::uint64_t>::max()), "16.00 EiB");
}

// ------------------------------------------------------------------------------------------------
// parse_layout / to_string
// ------------------------------------------------------------------------------------------------

TEST(RefParseLayout, Presets) {
  for (const char* text : {"sub-slices", "SUB-SLICES", " sub_slices "}) {
    auto r = parse_layout(text);
    ASSERT_TRUE(r) << text << ": " << r.err().message();
    ASSERT_TRUE(std::holds_alternative<preset>(r->value)) << text;
    EXPECT_EQ(std::get<preset>(r->value), preset::sub_slices) << text;
  }
  for (const char* text : {"exclusive-pages", "Exclusive-Pages", "exclusive_pages"}) {
    auto r = parse_layout(text);
    ASSERT_TRUE(r) << text;
    ASSERT_TRUE(std::holds_alternative<preset>(r->value));
    EXPECT_EQ(std::get<preset>(r->value), preset::exclusive_pages) << text;
  }
  EXPECT_EQ(to_string(memory_layout(preset::sub_slices)), "sub-slices");
  EXPECT_EQ(to_string(memory_layout(preset::exclusive_pages)), "exclusive-pages");
  EXPECT_STREQ(to_string(preset::sub_slices), "sub-slices");
  EXPECT_STREQ(to_string(preset::exclusive_pages), "exclusive-pages");
}

TEST(RefParseLayout, ExplicitPools) {
  const std::string text = "sliced:page=64MiB,slice=8MiB,cap=1GiB,period=1000;exclusive:max=1MiB,period=5000";
  auto r = parse_layout(text);
  ASSERT_TRUE(r) << r.err().message();
  ASSERT_TRUE(std::holds_alternative<std::vector<pool_config>>(r->value));
  const auto& pools = std::get<std::vector<pool_config>>(r->value);
  const std::vector<pool_config> expected{sliced(64 * MiB, 8 * MiB, GiB, 1000), exclusive(MiB, 5000)};
  EXPECT_EQ(pools, expected);

  // to_string writes the same form, and parsing it again gives the same layout.
  EXPECT_EQ(to_string(*r), text);
  auto again = parse_layout(to_string(*r));
  ASSERT_TRUE(again);
  EXPECT_EQ(again->value, r->value);

  // Spaces, case and optional keys.
  auto loose = parse_layout(" Sliced : page = 1000 ; exclusive:max=1.5KiB ");
  ASSERT_TRUE(loose) << loose.err().message();
  const std::vector<pool_config> loose_expected{sliced(1000), exclusive(1536)};
  EXPECT_EQ(std::get<std::vector<pool_config>>(loose->value), loose_expected);
  EXPECT_EQ(to_string(*loose), "sliced:page=1000;exclusive:max=1536");
  auto loose_again = parse_layout(to_string(*loose));
  ASSERT_TRUE(loose_again);
  EXPECT_EQ(loose_again->value, loose->value);
}

TEST(RefParseLayout, RoundTripOfBuiltLayouts) {
  const memory_layout layout(std::vector<pool_config>{exclusive(0), sliced(3 * GiB / 2, 768 * MiB),
                                                      sliced(1000, 500, 4096, 3), exclusive(TiB, 35000)});
  const std::string text = to_string(layout);
  EXPECT_EQ(text,
            "exclusive:max=0;sliced:page=1536MiB,slice=768MiB;sliced:page=1000,slice=500,cap=4KiB,period=3;"
            "exclusive:max=1TiB,period=35000");
  auto parsed = parse_layout(text);
  ASSERT_TRUE(parsed) << parsed.err().message();
  EXPECT_EQ(parsed->value, layout.value);
}

TEST(RefParseLayout, ResultIsValidatedByResolve) {
  auto ok = parse_layout("sliced:page=1000");
  ASSERT_TRUE(ok);
  auto resolved = resolve_layout(*ok, kProps);
  ASSERT_TRUE(resolved);
  EXPECT_EQ(*resolved, (std::vector<pool_options>{slc(1024, 1024)}));
  // Parsing does not validate: a zero page parses, and resolve rejects it.
  auto zero = parse_layout("sliced:page=0");
  ASSERT_TRUE(zero);
  EXPECT_EQ(resolve_layout(*zero, kProps).code(), errc::zero_size);
}

// A sliced page is allocated whole: on a device of known capacity one larger than it is refused
// when the layout is resolved, not by every reserve later as out of memory.
TEST(RefParseLayout, APageLargerThanTheDeviceIsRefused) {
  const device_properties small{1 * GiB, 512, 512 * MiB};
  auto big = parse_layout("sliced:page=2GiB");
  ASSERT_TRUE(big);
  auto r = resolve_layout(*big, small);
  ASSERT_EQ(r.code(), errc::slice_larger_than_page);
  EXPECT_EQ(r.err().size, 2 * GiB);
  EXPECT_EQ(r.err().limit, 512 * MiB);
  EXPECT_EQ(r.err().text, "pool 0");
  const std::string msg = r.err().message();
  EXPECT_NE(msg.find("page_size (2147483648 bytes) is larger than the device (536870912 bytes)"), std::string::npos)
      << msg;
  // The presets never ask for such a page: their largest is the device's, written out it resolves.
  for (const preset p : {preset::sub_slices, preset::exclusive_pages}) {
    const auto pools = preset_pools(p, small);
    for (const pool_options& o : pools) EXPECT_LE(o.page_size, small.capacity);
  }
  std::vector<pool_config> written;
  for (const pool_options& o : preset_pools(preset::sub_slices, small)) {
    if (o.kind == pool_kind::sliced) written.push_back(sliced_pool_config{o.page_size, o.max_alloc_size});
  }
  EXPECT_TRUE(resolve_layout(memory_layout(written), small)) << "the preset's pools, written out, are valid";
  // As large as the device is allowed, and so is any page where the capacity is unknown.
  EXPECT_TRUE(resolve_layout(*parse_layout("sliced:page=512MiB"), small));
  EXPECT_TRUE(resolve_layout(*big, device_properties{1 * GiB, 512, 0}));
}

TEST(RefParseLayout, Malformed) {
  struct bad_case {
    const char* text;
    errc code;
    const char* mention;
  };
  const std::vector<bad_case> cases{
      {"bogus:page=1MiB", errc::malformed_layout, "kind"},
      {"sliced:page=1MiB,foo=2", errc::malformed_layout, "foo"},
      {"exclusive:page=1MiB", errc::malformed_layout, "unknown key"},
      {"sliced:slice=1MiB", errc::malformed_layout, "page="},
      {"exclusive:period=5", errc::malformed_layout, "max="},
      {"sliced:page=12XB", errc::malformed_size, "12XB"},
      {"exclusive:max=abc", errc::malformed_size, "abc"},
      {"", errc::malformed_layout, "empty"},
      {"   ", errc::malformed_layout, "empty"},
      {";", errc::malformed_layout, "no pool"},
      {"sliced", errc::malformed_layout, "sliced"},
      {"sliced:page", errc::malformed_layout, "key=value"},
      {"sliced:page=1MiB,period=abc", errc::malformed_layout, "period"},
      {"sliced:page=1MiB;bogus", errc::malformed_layout, "bogus"},
  };
  for (const auto& c : cases) {
    auto r = parse_layout(c.text);
    ASSERT_FALSE(r) << "accepted \"" << c.text << "\"";
    EXPECT_EQ(r.code(), c.code) << c.text << ": " << r.err().message();
    EXPECT_TRUE(is_config_error(r.code()));
    EXPECT_TRUE(mentions(r.err().message(), c.mention)) << c.text << ": " << r.err().message();
  }
}

// ------------------------------------------------------------------------------------------------
// parse_persistent_policy
// ------------------------------------------------------------------------------------------------

TEST(RefPersistentPolicy, ParseValidNames) {
  struct named {
    const char* text;
    persistent_policy policy;
  };
  for (const auto& n :
       {named{"enabled", persistent_policy::enabled}, named{"size-match", persistent_policy::size_match},
        named{"size_match", persistent_policy::size_match}, named{"disabled", persistent_policy::disabled},
        named{"enforced", persistent_policy::enforced}, named{" Enforced ", persistent_policy::enforced},
        named{"SIZE-MATCH", persistent_policy::size_match}}) {
    auto r = parse_persistent_policy(n.text);
    ASSERT_TRUE(r) << n.text << ": " << r.err().message();
    EXPECT_EQ(*r, n.policy) << n.text;
  }
  for (auto p : {persistent_policy::enabled, persistent_policy::size_match, persistent_policy::disabled,
                 persistent_policy::enforced}) {
    auto r = parse_persistent_policy(to_string(p));
    ASSERT_TRUE(r) << to_string(p);
    EXPECT_EQ(*r, p);
  }
  EXPECT_STREQ(to_string(persistent_policy::size_match), "size-match");
}

TEST(RefPersistentPolicy, ParseErrors) {
  for (const char* bad : {"", "always", "enable", "size match"}) {
    auto r = parse_persistent_policy(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.code(), errc::malformed_config) << bad;
    EXPECT_EQ(r.err().text, bad);
    EXPECT_TRUE(mentions(r.err().message(), "enforced")) << "the message lists the valid names";
  }
  EXPECT_TRUE(mentions(parse_persistent_policy("always").err().message(), "'always'"));
}

// ------------------------------------------------------------------------------------------------
// Errors
// ------------------------------------------------------------------------------------------------

TEST(RefErrors, ErrcToString) {
  struct named {
    errc code;
    const char* name;
  };
  const std::vector<named> all{
      {errc::ok, "ok"},
      {errc::not_found, "not_found"},
      {errc::already_bound, "already_bound"},
      {errc::invalid_argument, "invalid_argument"},
      {errc::buffer_too_big, "buffer_too_big"},
      {errc::pool_capacity_exceeded, "pool_capacity_exceeded"},
      {errc::out_of_memory, "out_of_memory"},
      {errc::empty_pool_list, "empty_pool_list"},
      {errc::zero_size, "zero_size"},
      {errc::slice_larger_than_page, "slice_larger_than_page"},
      {errc::cap_smaller_than_page, "cap_smaller_than_page"},
      {errc::too_many_pages, "too_many_pages"},
      {errc::too_many_pools, "too_many_pools"},
      {errc::malformed_size, "malformed_size"},
      {errc::malformed_layout, "malformed_layout"},
      {errc::malformed_config, "malformed_config"},
      {errc::capture_active, "capture_active"},
      {errc::no_capture, "no_capture"},
      {errc::shutdown, "shutdown"},
      {errc::device_error, "device_error"},
      {errc::task_failed, "task_failed"},
  };
  for (const auto& n : all) {
    EXPECT_STREQ(to_string(n.code), n.name);
    EXPECT_FALSE(error::make(n.code).message().empty()) << n.name;
  }
  EXPECT_STREQ(to_string(static_cast<errc>(999)), "unknown");
}

TEST(RefErrors, Classification) {
  for (auto c : {errc::empty_pool_list, errc::zero_size, errc::slice_larger_than_page, errc::cap_smaller_than_page,
                 errc::too_many_pages, errc::too_many_pools, errc::malformed_size, errc::malformed_layout,
                 errc::malformed_config}) {
    EXPECT_TRUE(is_config_error(c)) << to_string(c);
    EXPECT_FALSE(is_transient(c)) << to_string(c);
  }
  for (auto c : {errc::ok, errc::not_found, errc::buffer_too_big, errc::pool_capacity_exceeded, errc::out_of_memory,
                 errc::capture_active, errc::no_capture, errc::device_error}) {
    EXPECT_FALSE(is_config_error(c)) << to_string(c);
  }
  EXPECT_TRUE(is_transient(errc::pool_capacity_exceeded));
  EXPECT_TRUE(is_transient(errc::out_of_memory));
  EXPECT_FALSE(is_transient(errc::buffer_too_big));
  EXPECT_FALSE(is_transient(errc::not_found));
}

TEST(RefErrors, MessagesCarryTheValues) {
  error cap = error::make(errc::pool_capacity_exceeded);
  cap.size = 4096;
  cap.limit = 8192;
  cap.in_use = 6144;
  const std::string m = cap.message();
  EXPECT_TRUE(mentions(m, "4096")) << m;
  EXPECT_TRUE(mentions(m, "8192")) << m;
  EXPECT_TRUE(mentions(m, "6144")) << m;

  error big = error::make(errc::buffer_too_big);
  big.size = 12345;
  big.limit = 999;
  EXPECT_TRUE(mentions(big.message(), "12345")) << big.message();
  EXPECT_TRUE(mentions(big.message(), "999")) << big.message();

  error nf = error::make(errc::not_found, "the memory page does not exist");
  EXPECT_TRUE(mentions(nf.message(), "the memory page does not exist")) << nf.message();
}

// The error_code integration (category "devrt") lives in the runtime layer now
// (devrt/runtime/error.hpp, boost::system); tests/memory does not link it, so it is not tested here.

TEST(RefErrors, ResultValueThrowsWithTheMessage) {
  error e = error::make(errc::pool_capacity_exceeded);
  e.size = 100;
  e.limit = 2048;
  e.in_use = 2000;
  const std::string expected = e.message();

  result<int> r = e;
  EXPECT_FALSE(r.has_value());
  EXPECT_EQ(r.code(), errc::pool_capacity_exceeded);
  try {
    (void)r.value();
    ADD_FAILURE() << "value() of an error did not throw";
  } catch (const devrt::exception& ex) {
    EXPECT_EQ(std::string(ex.what()), expected);
    EXPECT_EQ(ex.code(), errc::pool_capacity_exceeded);
    EXPECT_EQ(ex.err().size, 100u);
    EXPECT_EQ(ex.err().limit, 2048u);
  }
  EXPECT_THROW((void)std::move(r).value(), devrt::exception);
  const result<int>& cr = r;
  EXPECT_THROW((void)cr.value(), std::runtime_error);

  result<void> v = error::make(errc::no_capture, "capture_end without capture_begin");
  EXPECT_EQ(v.code(), errc::no_capture);
  try {
    v.value();
    ADD_FAILURE() << "value() of an error did not throw";
  } catch (const devrt::exception& ex) {
    EXPECT_EQ(std::string(ex.what()), v.err().message());
    EXPECT_TRUE(mentions(ex.what(), "capture_end without capture_begin"));
  }

  // Values come back unchanged and do not throw.
  result<int> ok = 42;
  EXPECT_TRUE(ok.has_value());
  EXPECT_EQ(ok.code(), errc::ok);
  EXPECT_EQ(ok.value(), 42);
  result<void> vok;
  EXPECT_NO_THROW(vok.value());
  EXPECT_EQ(vok.code(), errc::ok);
}

}  // namespace
