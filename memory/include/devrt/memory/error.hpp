// Errors of the memory core: one error type with kinds and the values that explain it.
//
// Every fallible operation of the core returns `result<T>`; nothing in memory/ throws on the
// reserve path. An `error` is a small value (no heap allocation unless it carries input text, as
// parse errors do) so that transient errors such as `pool_capacity_exceeded` stay cheap.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace devrt {

/// Error kinds. The numeric values are stable: they are also the values of the error codes that
/// the runtime's asynchronous operations complete with (see devrt/runtime/error.hpp).
enum class errc : int {
  ok = 0,
  // Lookup and use of handles.
  not_found = 1,         ///< handle or binding does not resolve (never initialized, stale, freed)
  already_bound = 2,     ///< the handle given to bind already has memory
  invalid_argument = 3,  ///< an argument is out of range (e.g. a view past the end of a slice)
  // Allocation.
  buffer_too_big = 10,          ///< no pool accepts this size: permanent
  pool_capacity_exceeded = 11,  ///< the accepting pool is capped and full: transient
  out_of_memory = 12,           ///< the device refused the allocation: transient
  // Configuration (layout validation and parsing).
  empty_pool_list = 20,
  zero_size = 21,
  slice_larger_than_page = 22,
  cap_smaller_than_page = 23,
  too_many_pages = 24,
  too_many_pools = 25,
  malformed_size = 26,
  malformed_layout = 27,
  malformed_config = 28,
  mapping_unsupported = 29,  ///< an arena pool on a device that cannot map memory into address ranges
  // State.
  capture_active = 30,  ///< the operation is not allowed while a capture window is open
  no_capture = 31,      ///< capture_end without capture_begin
  shutdown = 32,        ///< the runtime is shutting down or gone
  asleep = 33,          ///< a reserve with a tag that is asleep (memory/tag.hpp): wake it first
  device_error = 40,    ///< the storage backend failed (driver error, failed flush)
  task_failed = 41,     ///< a function submitted to a device threw
  unsupported = 42,     ///< the device does not offer the operation (e.g. mapping on a device without it)
  would_deadlock = 43,  ///< a wait on the device's own thread for a request that only that thread can serve
};

/// Whether an error kind means the layout or configuration given was invalid.
constexpr bool is_config_error(errc c) noexcept { return static_cast<int>(c) >= 20 && static_cast<int>(c) < 30; }

/// Whether retrying after freeing memory can succeed.
constexpr bool is_transient(errc c) noexcept { return c == errc::pool_capacity_exceeded || c == errc::out_of_memory; }

/// Short stable name of an error kind ("not_found", "buffer_too_big", ...).
const char* to_string(errc c) noexcept;

/// An error with the values that explain it. Which fields are meaningful depends on `code`; the
/// message says them in words.
struct error {
  errc code = errc::ok;
  std::uint64_t size = 0;    ///< requested size, or the offending value
  std::uint64_t limit = 0;   ///< capacity, page size, maximum allowed value
  std::uint64_t in_use = 0;  ///< bytes in use where relevant
  const char* detail = "";   ///< static text: a reason, a field name, an error name
  std::string text;          ///< input echoed back (parse errors); empty on hot paths
  /// out_of_memory from a manager: the lines that explain it (the request, the device, devrt's
  /// figures, the largest live allocations, a hint), appended to the message.
  std::string context;

  /// A full sentence saying what happened and, where useful, what to do.
  [[nodiscard]] std::string message() const;

  static error make(errc c, const char* detail = "") {
    error e;
    e.code = c;
    e.detail = detail;
    return e;
  }
};

/// Exception thrown at API boundaries that throw (e.g. `result<T>::value()`).
class exception : public std::runtime_error {
 public:
  explicit exception(error e) : std::runtime_error(e.message()), error_(std::move(e)) {}
  [[nodiscard]] const error& err() const noexcept { return error_; }
  [[nodiscard]] errc code() const noexcept { return error_.code; }

 private:
  error error_;
};

/// Either a value or an error. Small subset of C++23's std::expected.
template <class T>
class [[nodiscard]] result {
 public:
  result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT(google-explicit-constructor)
  result(error e) : v_(std::in_place_index<1>, std::move(e)) {}      // NOLINT(google-explicit-constructor)

  [[nodiscard]] bool has_value() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  T& value() & {
    check();
    return std::get<0>(v_);
  }
  const T& value() const& {
    check();
    return std::get<0>(v_);
  }
  T&& value() && {
    check();
    return std::move(std::get<0>(v_));
  }
  // Checked like value(): on an error they throw devrt::exception with its message, never
  // std::bad_variant_access, whose text says nothing about what went wrong.
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  [[nodiscard]] const error& err() const& { return std::get<1>(v_); }
  [[nodiscard]] error&& err() && { return std::move(std::get<1>(v_)); }
  [[nodiscard]] errc code() const noexcept { return has_value() ? errc::ok : std::get<1>(v_).code; }

 private:
  void check() const {
    if (!has_value()) throw exception(std::get<1>(v_));
  }
  std::variant<T, error> v_;
};

/// `result<void>`: success or an error.
template <>
class [[nodiscard]] result<void> {
 public:
  result() = default;
  result(error e) : e_(std::move(e)), ok_(false) {}  // NOLINT(google-explicit-constructor)

  [[nodiscard]] bool has_value() const noexcept { return ok_; }
  explicit operator bool() const noexcept { return ok_; }
  void value() const {
    if (!ok_) throw exception(e_);
  }
  [[nodiscard]] const error& err() const& { return e_; }
  [[nodiscard]] error&& err() && { return std::move(e_); }
  [[nodiscard]] errc code() const noexcept { return ok_ ? errc::ok : e_.code; }

 private:
  error e_;
  bool ok_ = true;
};

}  // namespace devrt
