// devrt errors as boost::system::error_code, the first argument of every completion signature.
//
// An error_code holds a category and a value only, yet callers deserve the whole message ("out of
// device memory: the device refused 4294967296 bytes ..."). `to_error_code` therefore gives each
// distinct message a category object of its own, interned for the life of the process (at most
// `max_detailed_messages` of them; past that the plain category is used). All devrt categories
// share one category id, so they compare equal: `ec == devrt::errc::out_of_memory` and
// `ec.category() == devrt::runtime::category()` hold whatever the message.
#pragma once

#include <boost/system/error_code.hpp>
#include <boost/system/system_error.hpp>

#include "devrt/memory/error.hpp"

namespace devrt::runtime {

inline constexpr std::size_t max_detailed_messages = 4096;

/// The devrt category (name "devrt"); its messages are the generic message of each kind.
const boost::system::error_category& category() noexcept;

/// The code of a kind, with the generic message.
boost::system::error_code make_error_code(errc c) noexcept;

/// The code of an error, whose message() is the error's full message.
boost::system::error_code to_error_code(const error& e);

/// The devrt kind of a code (errc::ok for success, errc::device_error for foreign categories).
errc to_errc(const boost::system::error_code& ec) noexcept;

}  // namespace devrt::runtime

namespace devrt {
// Lets `ec == devrt::errc::x` compare against Boost error codes.
inline boost::system::error_code make_error_code(errc c) noexcept { return runtime::make_error_code(c); }
}  // namespace devrt

template <>
struct boost::system::is_error_code_enum<devrt::errc> : std::true_type {};
