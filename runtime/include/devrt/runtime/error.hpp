// devrt errors as boost::system::error_code, the first argument of every completion signature,
// and as the exception devrt's futures throw.
//
// An error_code holds a kind and a category pointer, nothing that could own an error's values:
// a category per error would have to live forever (error codes are copied freely and never
// destroyed in any order one could track), and a bounded store of them ends up handing out
// messages with zero values. So the two travel apart:
//
// - The code says which kind of error it is: `ec == devrt::errc::out_of_memory` and
//   `ec.category() == devrt::runtime::category()` hold, and `ec.message()` is a sentence about the
//   kind that claims no values.
// - The values (sizes, capacity, bytes in use, the device's error name) travel in the exception:
//   devrt's future (the default token) and the std::future it converts to throw
//   `devrt::runtime::system_error`, a boost::system::system_error whose `what()` is the error's
//   full message and whose `err()` is the devrt::error itself. Every error carries its own values,
//   however many errors came before; nothing is kept process-wide.
//
// A callback or another Asio token (use_awaitable, asio::use_future) receives the code alone.
#pragma once

#include <boost/system/error_code.hpp>
#include <boost/system/system_error.hpp>
#include <memory>

#include "devrt/memory/error.hpp"

namespace devrt::runtime {

/// The devrt category (name "devrt"); its messages describe each kind without values.
const boost::system::error_category& category() noexcept;

/// The code of a kind.
boost::system::error_code make_error_code(errc c) noexcept;

/// The code of an error: its kind (see the file comment for where the values go).
boost::system::error_code to_error_code(const error& e) noexcept;

/// The devrt kind of a code (errc::ok for success, errc::device_error for foreign categories).
errc to_errc(const boost::system::error_code& ec) noexcept;

/// What devrt's futures throw: the error code of the kind, plus the devrt::error with its values.
/// Copies share the error (nothrow copy, as exceptions need).
class system_error : public boost::system::system_error {
 public:
  explicit system_error(error e);
  /// The error with its values.
  [[nodiscard]] const error& err() const noexcept { return *error_; }
  /// The error's full message.
  [[nodiscard]] const char* what() const noexcept override { return message_->c_str(); }

 private:
  std::shared_ptr<const error> error_;
  std::shared_ptr<const std::string> message_;
};

}  // namespace devrt::runtime

namespace devrt {
// Lets `ec == devrt::errc::x` compare against Boost error codes.
inline boost::system::error_code make_error_code(errc c) noexcept { return runtime::make_error_code(c); }
}  // namespace devrt

template <>
struct boost::system::is_error_code_enum<devrt::errc> : std::true_type {};
