#include "devrt/runtime/error.hpp"

// Boost.System categories have a protected non-virtual destructor by design.
#pragma GCC diagnostic ignored "-Wnon-virtual-dtor"

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace devrt::runtime {

namespace {

// Shared by every devrt category so that they compare equal.
constexpr boost::ulong_long_type category_id = 0x6465767274'0001ULL;

class generic_category final : public boost::system::error_category {
 public:
  constexpr generic_category() noexcept : boost::system::error_category(category_id) {}
  [[nodiscard]] const char* name() const noexcept override { return "devrt"; }
  [[nodiscard]] std::string message(int ev) const override { return error::make(static_cast<errc>(ev)).message(); }
};

// A category that carries one full message.
class detailed_category final : public boost::system::error_category {
 public:
  explicit detailed_category(std::string message) noexcept
      : boost::system::error_category(category_id), message_(std::move(message)) {}
  [[nodiscard]] const char* name() const noexcept override { return "devrt"; }
  [[nodiscard]] std::string message(int /*ev*/) const override { return message_; }

 private:
  std::string message_;
};

const generic_category generic_instance;

struct registry {
  std::mutex mutex;
  std::unordered_map<std::string, std::unique_ptr<detailed_category>> by_message;
};

registry& messages() {
  static registry* r = new registry();  // never destroyed: codes may outlive static destruction
  return *r;
}

}  // namespace

const boost::system::error_category& category() noexcept { return generic_instance; }

boost::system::error_code make_error_code(errc c) noexcept { return {static_cast<int>(c), generic_instance}; }

boost::system::error_code to_error_code(const error& e) {
  if (e.code == errc::ok) return {};
  std::string text = e.message();
  registry& r = messages();
  std::lock_guard lock(r.mutex);
  auto it = r.by_message.find(text);
  if (it == r.by_message.end()) {
    if (r.by_message.size() >= max_detailed_messages) return runtime::make_error_code(e.code);
    auto cat = std::make_unique<detailed_category>(text);
    it = r.by_message.emplace(std::move(text), std::move(cat)).first;
  }
  return {static_cast<int>(e.code), *it->second};
}

errc to_errc(const boost::system::error_code& ec) noexcept {
  if (!ec) return errc::ok;
  if (ec.category() == generic_instance) return static_cast<errc>(ec.value());
  return errc::device_error;
}

}  // namespace devrt::runtime
