// What the host can back for devrt, read from copies of the kernel's files: /proc/meminfo, the
// process's cgroups and the cgroup file systems of v1 and v2, with and without limits.
#include "devrt/devices/host_memory.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "devrt/devices/host_storage.hpp"

namespace {

namespace fs = std::filesystem;
using devrt::devices::host_memory_available;
using devrt::devices::host_memory_sources;

constexpr std::uint64_t KiB = 1024;
constexpr std::uint64_t GiB = 1024 * 1024 * KiB;

bool contains(const std::string& s, const std::string& n) { return s.find(n) != std::string::npos; }

class HostMemory : public ::testing::Test {
 protected:
  void SetUp() override {
    // One folder per test and process: the sanitizer builds may run the same test at once.
    root_ = fs::temp_directory_path() /
            ("devrt_host_memory_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
             std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "proc");
    fs::create_directories(root_ / "cgroup");
    from_.meminfo = (root_ / "proc" / "meminfo").string();
    from_.self_cgroup = (root_ / "proc" / "cgroup").string();
    from_.cgroup_root = (root_ / "cgroup").string();
    // A machine of 64 GiB and 8 GiB of swap, 40 GiB available and 6 GiB of swap free.
    write("proc/meminfo",
          "MemTotal:       67108864 kB\nMemFree:        1000000 kB\nMemAvailable:   41943040 kB\n"
          "SwapTotal:      8388608 kB\nSwapFree:       6291456 kB\n");
  }
  void TearDown() override { fs::remove_all(root_); }

  void write(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  std::string cgroup(const std::string& rel) const { return (root_ / "cgroup" / rel).string(); }

  fs::path root_;
  host_memory_sources from_;
};

TEST_F(HostMemory, WithoutCgroupLimitsTheBoundIsTheMemoryAvailableAndFreeSwap) {
  write("proc/cgroup", "0::/user.slice\n");
  write("cgroup/cgroup.controllers", "cpu memory\n");
  write("cgroup/user.slice/memory.max", "max\n");
  write("cgroup/user.slice/memory.current", "1000\n");
  const auto m = host_memory_available(from_);
  EXPECT_EQ(m.bytes, 46 * GiB);
  EXPECT_EQ(m.bound, "the memory available and free swap");
}

TEST_F(HostMemory, ACgroupV2LimitBoundsItLessTheWorkingSet) {
  // 8 GiB limit; 3 GiB charged, of which 1 GiB is inactive file cache the kernel reclaims first.
  write("proc/cgroup", "0::/kubepods/pod1/container\n");
  write("cgroup/cgroup.controllers", "cpu memory\n");
  write("cgroup/kubepods/pod1/container/memory.max", std::to_string(8 * GiB) + "\n");
  write("cgroup/kubepods/pod1/container/memory.current", std::to_string(3 * GiB) + "\n");
  write("cgroup/kubepods/pod1/container/memory.stat",
        "anon 2147483648\nfile 1073741824\ninactive_file " + std::to_string(GiB) + "\n");
  const auto m = host_memory_available(from_);
  EXPECT_EQ(m.bytes, 6 * GiB);
  EXPECT_TRUE(contains(m.bound, cgroup("kubepods/pod1/container"))) << m.bound;
  EXPECT_TRUE(contains(m.bound, std::to_string(8 * GiB))) << m.bound;
  EXPECT_TRUE(contains(m.bound, std::to_string(2 * GiB))) << m.bound;
}

TEST_F(HostMemory, AnAncestorsLimitBoundsItToo) {
  // The container has no limit of its own; its pod has 4 GiB with 3 GiB used by its siblings.
  write("proc/cgroup", "0::/kubepods/pod1/container\n");
  write("cgroup/cgroup.controllers", "cpu memory\n");
  write("cgroup/kubepods/pod1/container/memory.max", "max\n");
  write("cgroup/kubepods/pod1/container/memory.current", "0\n");
  write("cgroup/kubepods/pod1/memory.max", std::to_string(4 * GiB) + "\n");
  write("cgroup/kubepods/pod1/memory.current", std::to_string(3 * GiB) + "\n");
  write("cgroup/kubepods/memory.max", std::to_string(32 * GiB) + "\n");
  write("cgroup/kubepods/memory.current", std::to_string(3 * GiB) + "\n");
  const auto m = host_memory_available(from_);
  EXPECT_EQ(m.bytes, GiB);
  EXPECT_TRUE(contains(m.bound, cgroup("kubepods/pod1") + " ")) << m.bound;
}

TEST_F(HostMemory, ACgroupV1LimitBoundsIt) {
  // v1 beside a unified hierarchy without memory limits; the memory controller's limit counts.
  write("proc/cgroup", "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/docker/abc\n");
  write("cgroup/unified/docker/abc/cgroup.procs", "1\n");
  write("cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  write("cgroup/memory/docker/abc/memory.limit_in_bytes", std::to_string(2 * GiB) + "\n");
  write("cgroup/memory/docker/abc/memory.usage_in_bytes", std::to_string(GiB / 2) + "\n");
  write("cgroup/memory/docker/abc/memory.stat", "cache 0\ntotal_inactive_file 0\n");
  const auto m = host_memory_available(from_);
  EXPECT_EQ(m.bytes, 2 * GiB - GiB / 2);
  EXPECT_TRUE(contains(m.bound, cgroup("memory/docker/abc"))) << m.bound;
}

TEST_F(HostMemory, InsideACgroupNamespaceTheMountedRootIsTheProcesssCgroup) {
  // /proc/self/cgroup names a path the namespace does not show: the root's files are the
  // container's own.
  write("proc/cgroup", "0::/\n");
  write("cgroup/cgroup.controllers", "memory\n");
  write("cgroup/memory.max", std::to_string(3 * GiB) + "\n");
  write("cgroup/memory.current", std::to_string(GiB) + "\n");
  EXPECT_EQ(host_memory_available(from_).bytes, 2 * GiB);

  write("proc/cgroup", "0::/system.slice/other.service\n");
  EXPECT_EQ(host_memory_available(from_).bytes, 2 * GiB);
}

TEST_F(HostMemory, AWorkingSetAboveTheLimitLeavesNoRoom) {
  write("proc/cgroup", "0::/\n");
  write("cgroup/cgroup.controllers", "memory\n");
  write("cgroup/memory.max", std::to_string(GiB) + "\n");
  write("cgroup/memory.current", std::to_string(2 * GiB) + "\n");
  const auto m = host_memory_available(from_);
  EXPECT_EQ(m.bytes, 0u);
  EXPECT_TRUE(contains(m.bound, "cgroup")) << m.bound;
}

TEST_F(HostMemory, WithoutMemAvailableTheBoundIsTheMachinesMemoryAndSwap) {
  write("proc/meminfo", "MemTotal:       67108864 kB\nSwapTotal:      8388608 kB\n");
  const auto m = host_memory_available(from_);
  EXPECT_EQ(m.bytes, 72 * GiB);
  EXPECT_EQ(m.bound, "the machine's memory and swap");
}

TEST_F(HostMemory, MalformedOrMissingFilesBoundNothing) {
  write("proc/cgroup", "garbage without colons\n0::/a\n");
  write("cgroup/cgroup.controllers", "memory\n");
  write("cgroup/a/memory.max", "12 apples\n");
  write("cgroup/a/memory.current", "x\n");
  EXPECT_EQ(host_memory_available(from_).bytes, 46 * GiB);
  fs::remove(root_ / "proc" / "cgroup");
  EXPECT_EQ(host_memory_available(from_).bytes, 46 * GiB);
}

TEST(HostMemoryOfThisMachine, TheHostStoragesLimitIsTheBoundAndItsRefusalSaysWhatSetIt) {
  const auto m = host_memory_available();
  ASSERT_GT(m.bytes, 0u);
  EXPECT_FALSE(m.bound.empty());
  devrt::devices::host_storage s;
  // The two readings are moments apart: the bound moves with the machine's other processes.
  EXPECT_NEAR(static_cast<double>(s.limit()), static_cast<double>(m.bytes), 0.05 * static_cast<double>(m.bytes));
  auto r = s.alloc(s.limit() + GiB);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), devrt::errc::out_of_memory);
  EXPECT_TRUE(contains(r.err().message(), "no more memory for devrt")) << r.err().message();
  EXPECT_TRUE(contains(r.err().message(), "set when devrt started")) << r.err().message();
}

}  // namespace
