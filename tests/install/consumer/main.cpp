// Uses an installed devrt: starts a runtime, reserves host memory through a client, writes and
// reads it back, and prints the usage. Exit code 0 when everything checks out.
#include <cstddef>
#include <iostream>
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

  const devrt::memory::memory_usage usage = host.memory_usage().get();
  std::cout << "devrt consumer: reserved " << size << " bytes on " << runtime.devices().front().name << "\n"
            << usage.to_string();
  if (!same || usage.number_allocs != 1 || usage.bytes_in_use != size) {
    std::cout << "devrt consumer: FAILED (data read back " << (same ? "matches" : "differs") << ")\n";
    return 1;
  }
  std::cout << "devrt consumer: ok\n";
  return 0;
}
