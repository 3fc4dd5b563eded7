#include "devrt/devices/sim_storage.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

using namespace devrt;
using devrt::devices::sim_options;
using devrt::devices::sim_storage;

TEST(SimStorage, H200Properties) {
  const auto o = sim_options::h200();
  EXPECT_EQ(o.props.alignment, 512u);
  EXPECT_EQ(o.props.capacity, 150'109'880'320ULL);
  EXPECT_EQ(o.props.max_page_size, 150'109'880'320ULL / 4);
}

namespace {

sim_options timed_streams(std::chrono::milliseconds after) {
  sim_options o = sim_options::h200();
  o.streams = true;
  o.runs_after = after;
  return o;
}

}  // namespace

TEST(SimStorage, WithoutRunsAfterEventsPassOnlyWhenTheTestLetsThem) {
  sim_options o = sim_options::h200();
  o.streams = true;
  sim_storage sim(o);
  const memory::stream_id s = sim.create_stream();
  const memory::event e = *sim.record_event(s);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(*sim.query_event(e));
  sim.progress_stream(s);
  EXPECT_TRUE(*sim.query_event(e));
}

TEST(SimStorage, RunsAfterPassesEventsByThemselvesInTheOrderRecorded) {
  sim_storage sim(timed_streams(std::chrono::milliseconds(500)));
  const memory::stream_id a = sim.create_stream();
  const memory::stream_id b = sim.create_stream();
  const memory::event first = *sim.record_event(a);
  const memory::event second = *sim.record_event(b);
  const memory::event third = *sim.record_event(a);
  // Just recorded: the simulated GPU has not run them yet (half a second leaves room for a loaded
  // machine between the records and these queries).
  EXPECT_FALSE(*sim.query_event(first));
  EXPECT_FALSE(sim.has_passed(third));
  // They pass with no progress call, never a later one before an earlier one.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!sim.has_passed(third) && std::chrono::steady_clock::now() < until) {
    const bool t = sim.has_passed(third);
    const bool s = sim.has_passed(second);
    const bool f = sim.has_passed(first);
    EXPECT_TRUE(!t || s) << "the third event passed before the second";
    EXPECT_TRUE(!s || f) << "the second event passed before the first";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(sim.has_passed(first));
  EXPECT_TRUE(sim.has_passed(second));
  EXPECT_TRUE(sim.has_passed(third));
  EXPECT_EQ(sim.passed_on(a), third);
  EXPECT_EQ(sim.passed_on(b), second);
}

TEST(SimStorage, RunsAfterKeepsAStreamWaitingForAnotherStreamsEvent) {
  sim_storage sim(timed_streams(std::chrono::milliseconds(50)));
  const memory::stream_id a = sim.create_stream();
  const memory::stream_id b = sim.create_stream();
  const memory::event on_a = *sim.record_event(a);
  ASSERT_TRUE(sim.stream_wait_event(b, on_a));
  const memory::event on_b = *sim.record_event(b);
  // Work queued on b after the wait is ordered after a's event, at once and once both have run.
  EXPECT_TRUE(sim.ordered_after(sim.stream_uid(b), on_a));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!sim.has_passed(on_b) && std::chrono::steady_clock::now() < until) {
    const bool b_done = sim.has_passed(on_b);
    EXPECT_TRUE(!b_done || sim.has_passed(on_a)) << "b's work ran before the event it waits for";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(sim.has_passed(on_b));
  EXPECT_TRUE(sim.has_passed(on_a));
  // The test may still run a stream ahead of time.
  const memory::event later = *sim.record_event(a);
  sim.progress_stream(a);
  EXPECT_TRUE(sim.has_passed(later));
}

TEST(SimStorage, SynchronizeStreamWaitsUntilTheStreamsWorkHasRun) {
  const auto after = std::chrono::milliseconds(30);
  sim_storage sim(timed_streams(after));
  const memory::stream_id a = sim.create_stream();
  const memory::stream_id b = sim.create_stream();
  const memory::event on_a = *sim.record_event(a);
  const memory::event on_b = *sim.record_event(b);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(sim.synchronize_stream(a));
  // The calling thread slept as long as the simulated kernels take, and a's work has run.
  EXPECT_GE(std::chrono::steady_clock::now() - start, after);
  EXPECT_TRUE(sim.has_passed(on_a));
  EXPECT_TRUE(sim.has_passed(on_b)) << "recorded earlier, so due earlier";
  EXPECT_EQ(sim.waits(), 0u) << "a client's wait is not the memory manager's";
}

TEST(SimStorage, SynchronizeStreamWithoutRunsAfterRunsTheStreamAtOnce) {
  sim_options o = sim_options::h200();
  o.streams = true;
  sim_storage sim(o);
  const memory::stream_id a = sim.create_stream();
  const memory::stream_id b = sim.create_stream();
  const memory::event on_b = *sim.record_event(b);
  ASSERT_TRUE(sim.stream_wait_event(a, on_b));
  const memory::event on_a = *sim.record_event(a);
  ASSERT_TRUE(sim.synchronize_stream(a));
  EXPECT_TRUE(sim.has_passed(on_a));
  EXPECT_TRUE(sim.has_passed(on_b)) << "a waited for it";
  // A destroyed stream is an error, as a record on it is.
  sim.destroy_stream(a);
  const auto r = sim.synchronize_stream(a);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.code(), errc::device_error);
}
