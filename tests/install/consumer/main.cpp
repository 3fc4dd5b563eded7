// Uses an installed devrt: starts a runtime, reserves host memory through a client, writes and
// reads it back, and prints the usage; asks for a CUDA device it does not have. Exit code 0 when
// everything checks out.
#include <cstddef>
#include <iostream>
#include <string>
#include <vector>

#include "devrt/runtime/runtime.hpp"

namespace rt = devrt::runtime;

int main() {
  rt::runtime_options opts;
  opts.use_cuda = false;  // the host device only, with or without GPUs
  rt::runtime runtime(opts);
  const rt::compute_client host = runtime.host();

  constexpr std::size_t size = 1 << 20;
  const devrt::memory::memory_handle h = host.reserve(size).get();
  std::vector<std::byte> bytes(size);
  for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<std::byte>(i % 251);
  host.write(h.binding(), bytes).get();
  const bool same = host.read(h.binding()).get() == bytes;

  // No CUDA device here (use_cuda is off): the error says what to use instead.
  std::string no_cuda;
  try {
    (void)runtime.cuda(0);
  } catch (const devrt::exception& e) {
    if (e.code() == devrt::errc::not_found) no_cuda = e.what();
  }
  std::cout << "devrt consumer: runtime.cuda(0): " << no_cuda << "\n";
  const bool says_what_to_do = no_cuda.find("use runtime::host() or runtime::sim()") != std::string::npos;

  const devrt::memory::memory_usage usage = host.memory_usage().get();
  std::cout << "devrt consumer: reserved " << size << " bytes on " << runtime.devices().front().name << "\n"
            << usage.to_string();
  if (!same || usage.number_allocs != 1 || usage.bytes_in_use != size || !says_what_to_do) {
    std::cout << "devrt consumer: FAILED (data read back " << (same ? "matches" : "differs")
              << (says_what_to_do ? "" : "; runtime.cuda(0) does not say what to use instead") << ")\n";
    return 1;
  }
  std::cout << "devrt consumer: ok\n";
  return 0;
}
