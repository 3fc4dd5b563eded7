// devrt-inspect: shows the pool layout of a device, validates layouts and config files (see
// tools/inspect/cli.hpp).
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "inspect/cli.hpp"

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return devrt::inspect::run_cli(args, std::cout, std::cerr);
  } catch (const std::exception& e) {
    // Only the unexpected lands here (an exception from a device or the standard library).
    std::cerr << "devrt-inspect: " << e.what() << "\n";
    return 1;
  }
}
