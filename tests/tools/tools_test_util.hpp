// Helpers shared by the tools tests: a scratch folder and file writers (plain and gzip'd).
#pragma once

#include <unistd.h>
#include <zlib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace devrt::replay::testing {

/// A fresh folder under the system's temporary folder, removed with everything in it.
class scratch_dir {
 public:
  scratch_dir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("devrt-tools-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] std::string file(std::string_view name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline std::string write_plain(const std::string& path, std::string_view text) {
  std::ofstream f(path, std::ios::binary);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
  return path;
}

inline std::string write_gz(const std::string& path, std::string_view text) {
  gzFile f = gzopen(path.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot open " + path);
  const int n = gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
  gzclose(f);
  if (n != static_cast<int>(text.size())) throw std::runtime_error("cannot write " + path);
  return path;
}

}  // namespace devrt::replay::testing
