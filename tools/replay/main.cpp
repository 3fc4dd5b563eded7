// devrt-replay: replays an allocation trace against devrt (see tools/replay/cli.hpp).
#include <unistd.h>

#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "replay/cli.hpp"

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return devrt::replay::run_cli(args, std::cout, std::cerr, ::isatty(STDERR_FILENO) != 0);
  } catch (const std::exception& e) {
    // Only the unexpected lands here (an exception from the runtime or the standard library).
    std::cerr << "devrt-replay: " << e.what() << "\n";
    return 1;
  }
}
