// The memory actor of one device: it owns the device's memory manager and serializes every
// memory message. Its messages run on a Boost.Asio strand on a thread of its own, or, when a
// request finds the actor idle, on the requesting thread itself, in place (`run_or_post`): a
// device thread that has gone to sleep is then not woken, and the request costs what it costs in
// a tight loop.
//
// Ownership: `actor_core` (the manager and the actor's bookkeeping) is touched only by the
// actor's runner, which the mailbox names (mailbox.hpp: the device thread's strand, or one caller
// at a time). `device_actor` is shared by the runtime and every client of the device; `post` and
// `run_or_post` are safe from any thread.
#pragma once

#include <atomic>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "devrt/memory/memory_manager.hpp"
#include "devrt/runtime/mailbox.hpp"
#include "devrt/runtime/spin.hpp"

namespace spdlog {
class logger;
}

namespace devrt::runtime {

enum class device_kind { host, sim, cuda };
const char* to_string(device_kind k) noexcept;

/// What the runtime knows of a device.
struct device_info {
  device_kind kind = device_kind::host;
  int index = 0;     ///< index among the devices of its kind
  std::string name;  ///< "host", "sim", "cuda:0"
  memory::device_properties properties;
};

/// The state a device actor owns. Every member is called by the actor's runner only (the strand,
/// or a caller serving a message in place).
class actor_core {
 public:
  actor_core(std::unique_ptr<memory::memory_manager> manager, std::shared_ptr<spdlog::logger> log, device_info info);

  memory::memory_manager& manager() noexcept { return *manager_; }
  spdlog::logger& log() noexcept { return *log_; }
  [[nodiscard]] const std::string& device_name() const noexcept { return info_.name; }
  [[nodiscard]] const device_info& info() const noexcept { return info_; }

  /// Reserve; on out_of_memory the manager reclaims once (waits for the streams' fences, explicit
  /// cleanup and flush) and retries once.
  result<memory::memory_handle> reserve(std::uint64_t size, memory::stream_id q = memory::streams::device,
                                        memory::tag_id tag = 0);
  /// Reserves and binds `handle` (the second half of a client's create). A failure is kept with
  /// the handle's identity (its descriptor) so that later uses of the handle report it.
  void create(std::uint64_t size, const memory::memory_handle& handle, memory::stream_id q = memory::streams::device,
              memory::tag_id tag = 0);
  /// Turns a not_found for a handle whose create failed into that failure.
  static error explain(const error& e, const memory::memory_binding& b);

  result<memory::resource> get_resource(const memory::memory_binding& b, std::optional<std::uint64_t> start = {},
                                        std::optional<std::uint64_t> end = {});
  result<void> write(const memory::memory_binding& b, const void* src, std::uint64_t size);
  result<void> read(const memory::memory_binding& b, void* dst, std::uint64_t size);
  /// Copies into `dst` in order on the allocation's stream; `dst` holds the bytes once the event
  /// has passed.
  result<memory::event> read_async(const memory::memory_binding& b, void* dst, std::uint64_t size);
  /// Work on the device's own stream is about to use `b`: records that stream for it when the
  /// allocation belongs to another.
  result<void> use_on_device_stream(const memory::memory_binding& b);
  result<std::uint64_t> size_of(const memory::memory_binding& b);
  /// capture_active when a copy for `b` would be enqueued on the device's stream during a capture.
  result<void> refuse_in_capture(const memory::memory_binding& b, const char* what) const;

  /// Opens a capture window on the manager and, on devices with streams, stream capture.
  result<void> capture_begin();
  /// Closes both; returns the pins and the recorded work (nullptr without streams).
  result<std::pair<std::vector<memory::memory_handle>, std::shared_ptr<memory::recorded_work>>> capture_end();

  /// Sleep and wake of a tag (memory/tag.hpp): the manager queues the work, and `finish` gets the
  /// outcome once the device has passed it and the manager settled it (the memory back with the
  /// device, or the host copy freed); the device thread does not wait meanwhile.
  template <class Finish>
  void sleep_tag(memory::tag_id tag, bool keep_contents, Finish finish) {
    settle_after(manager_->sleep(tag, keep_contents), tag, std::move(finish));
  }
  template <class Finish>
  void wake_tag(memory::tag_id tag, Finish finish) {
    settle_after(manager_->wake(tag), tag, std::move(finish));
  }

  /// Persistent scopes nest: the mode is persistent while at least one is open.
  void enter_persistent();
  void exit_persistent();

  /// Runs `then` once the device has passed event `t` (aborted with the error if the device
  /// reports one, or run at shutdown after a final wait): how reads, synchronization and graph
  /// release complete without the device thread waiting for the GPU.
  void park(memory::event t, message then);
  /// Runs `then` once no fence of the device's streams is pending any more (a configure waiting for
  /// memory freed on busy streams; `then` may park itself again).
  void park_until_fences(message then);
  /// Runs the messages parked until the fences passed, when they have.
  void run_fence_waiters();
  /// Runs what the device has passed; true while work stays parked.
  bool poll_parked();
  /// Shutdown: waits for every parked event and runs what was parked.
  void finish_parked() noexcept;
  /// Whether work waits for the device (parked events, fences, or an explicit cleanup that owes
  /// memory behind fences): the actor keeps polling then.
  [[nodiscard]] bool parked() const noexcept {
    return !parked_.empty() || !fence_waiters_.empty() || manager_->cleanup_owed();
  }

 private:
  template <class Finish>
  void settle_after(result<memory::event> e, memory::tag_id tag, Finish finish) {
    if (!e) {
      finish(result<void>(std::move(e).err()));
      return;
    }
    park(*e, message([tag, f = std::move(finish)](actor_core* core, const error* err) mutable {
      if (core == nullptr) {
        f(result<void>(*err));
        return;
      }
      auto s = core->manager().settle_tag(tag);
      f(s ? result<void>() : result<void>(std::move(s).err()));
    }));
  }

  std::unique_ptr<memory::memory_manager> manager_;
  std::shared_ptr<spdlog::logger> log_;
  device_info info_;
  int persistent_depth_ = 0;
  std::vector<std::pair<memory::event, message>> parked_;
  std::vector<message> fence_waiters_;
};

/// How a device actor serves its messages.
struct actor_options {
  /// How long the device thread, out of messages, keeps polling the mailbox before it sleeps
  /// (0: it sleeps at once).
  std::chrono::microseconds idle_spin{0};
  /// Whether `run_or_post` may run a message on the calling thread when the actor is idle; when
  /// false it always posts.
  bool serve_in_place = true;
};

class device_actor : public std::enable_shared_from_this<device_actor> {
 public:
  /// Starts the device thread. `completions` runs completion handlers that have no executor of
  /// their own.
  device_actor(device_info info, std::unique_ptr<memory::memory_manager> manager,
               boost::asio::any_io_executor completions, std::shared_ptr<spdlog::logger> log,
               actor_options options = {});
  device_actor(const device_actor&) = delete;
  device_actor& operator=(const device_actor&) = delete;
  ~device_actor();

  /// Queues a message for the device thread; after shutdown the message is completed with a
  /// shutdown error instead. Thread-safe.
  void post(message m);
  /// Runs the message here and now when nobody runs the actor (the device thread asleep or gone
  /// idle), else queues it as `post` does. Serving in place is what lets a request that finds the
  /// device idle return without waking the device thread; the actor still runs one message at a
  /// time. For devrt's own messages only: a message that runs the caller's code (submit) is
  /// posted, so that it runs on the device thread as documented. Thread-safe.
  void run_or_post(message m);

  /// Completes every queued message with a shutdown error, destroys the memory manager on the
  /// strand and joins the device thread. Idempotent. Must not be called from the device thread.
  void shutdown() noexcept;

  [[nodiscard]] const device_info& info() const noexcept { return info_; }
  /// Where completions without an executor of their own run: the runtime's completion threads.
  [[nodiscard]] const boost::asio::any_io_executor& completion_executor() const noexcept { return completions_; }

  /// Messages processed, drains run on the device thread, and messages served in place by their
  /// callers (for tests and benchmarks).
  [[nodiscard]] std::uint64_t messages_processed() const noexcept { return processed_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t drains() const noexcept { return drains_.load(std::memory_order_relaxed); }
  [[nodiscard]] std::uint64_t served_in_place() const noexcept {
    return served_in_place_.load(std::memory_order_relaxed);
  }

  /// Most messages one drain runs before it yields the strand and reschedules itself.
  static constexpr std::size_t drain_budget = 1024;

 private:
  static error stopped_error();
  void schedule_drain();
  void drain();
  /// The end of a batch (`in_place`: of a message a caller served; the driver calls of queued
  /// deallocations are then left to the device thread).
  void after_batch(bool in_place = false);
  /// Polls the mailbox for up to idle_spin_; true when messages were taken into batch_.
  bool spin_for_messages();
  /// While work is parked on events, checks them again after a short while (backing off up to a
  /// millisecond), so their completions come without a message to wake the device thread.
  void arm_poll();

  device_info info_;
  boost::asio::io_context io_{1};
  boost::asio::strand<boost::asio::io_context::executor_type> strand_;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  boost::asio::any_io_executor completions_;
  std::shared_ptr<spdlog::logger> log_;
  std::chrono::microseconds idle_spin_;
  const bool serve_in_place_;
  mailbox mailbox_;
  // The actor's state: touched only by its runner, the one `mailbox_` names (the device thread's
  // strand or a caller serving a message in place).
  std::unique_ptr<actor_core> core_;
  // Strand-only state.
  std::vector<message> batch_;
  std::size_t next_ = 0;
  std::atomic<std::uint64_t> processed_{0};
  std::atomic<std::uint64_t> drains_{0};
  std::atomic<std::uint64_t> served_in_place_{0};
  std::atomic<bool> stopped_{false};
  boost::asio::steady_timer poll_timer_;
  bool poll_armed_ = false;
  std::chrono::microseconds poll_delay_{20};
  std::thread thread_;
};

}  // namespace devrt::runtime
