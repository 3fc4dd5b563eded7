// The main of the CUDA test programs.
//
// Module loading is eager unless the caller chose (CUDA_MODULE_LOADING): under CUDA's default
// lazy loading, the first launch of a kernel waits for kernels already running on other streams,
// which orders the very accesses the stream tests mean to race, so a race test would pass
// vacuously. The GPU script runs the tests with LAZY as well.
//
// DEVRT_TEST_WATCHDOG=SECONDS: if the program still runs after that long, every thread prints its
// stack (raw addresses, with the program's load address, for addr2line) and the program aborts,
// so a hang on a machine without a debugger says where it is.
#include <execinfo.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace {

void print_stack(int /*sig*/) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  char head[64];
  const int len = std::snprintf(head, sizeof head, "== thread %ld\n", static_cast<long>(syscall(SYS_gettid)));
  (void)!write(2, head, static_cast<std::size_t>(len));
  backtrace_symbols_fd(frames, n, 2);
}

void on_crash(int sig) {
  const char* what = sig == SIGSEGV  ? "== crash: SIGSEGV\n"
                     : sig == SIGBUS ? "== crash: SIGBUS\n"
                                     : "== crash: SIGABRT\n";
  (void)!write(2, what, std::strlen(what));
  print_stack(sig);
  int maps = open("/proc/self/maps", O_RDONLY);
  char buf[4096];
  for (ssize_t n; maps >= 0 && (n = read(maps, buf, sizeof buf)) > 0;)
    (void)!write(2, buf, static_cast<std::size_t>(n));
  signal(sig, SIG_DFL);
  raise(sig);
}

void dump_every_thread() {
  std::fprintf(stderr, "== watchdog: the program still runs; every thread's stack follows\n");
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (line.find("devrt_cuda") != std::string::npos && line.find("r-xp") != std::string::npos) {
      std::fprintf(stderr, "== map %s\n", line.c_str());
    }
  }
  const pid_t pid = getpid();
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    const long tid = std::strtol(task.path().filename().c_str(), nullptr, 10);
    syscall(SYS_tgkill, pid, tid, SIGUSR2);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::abort();
}

}  // namespace

int main(int argc, char** argv) {
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  std::printf("[ cuda     ] CUDA_MODULE_LOADING=%s\n", std::getenv("CUDA_MODULE_LOADING"));
  {
    void* warm[4];
    (void)backtrace(warm, 4);  // loads the unwinder before any signal needs it
    // A crash prints its stack and the program's maps (for addr2line), then dies as it would.
    for (const int sig : {SIGSEGV, SIGBUS, SIGABRT}) signal(sig, on_crash);
  }
  if (const char* w = std::getenv("DEVRT_TEST_WATCHDOG"); w != nullptr && std::atoi(w) > 0) {
    struct sigaction sa {};
    sa.sa_handler = print_stack;
    sigaction(SIGUSR2, &sa, nullptr);
    const int seconds = std::atoi(w);
    std::thread([seconds] {
      std::this_thread::sleep_for(std::chrono::seconds(seconds));
      dump_every_thread();
    }).detach();
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
