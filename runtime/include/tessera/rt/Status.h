//===- Status.h - Status and StatusOr ----------------------------*- C++
//-*-===//
//
// IREE-style error handling for the Tessera runtime: every fallible API
// returns a Status (ok, or a code plus message) or a StatusOr<T>. Exceptions
// may be used inside a translation unit but never cross the API.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_STATUS_H
#define TESSERA_RT_STATUS_H

#include <cassert>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

namespace tessera::rt {

/// Canonical error codes (a subset of absl/IREE's).
enum class StatusCode {
  Ok = 0,
  InvalidArgument,
  NotFound,
  OutOfRange,
  FailedPrecondition,
  DataLoss,
  Unimplemented,
  Internal,
  Unavailable,
  Aborted,
};

/// Returns a stable lower-case name for `code`, e.g. "invalid argument".
const char *statusCodeName(StatusCode code);

/// The result of a fallible operation: ok, or an error code with a message.
class [[nodiscard]] Status {
public:
  /// An ok status.
  Status() = default;
  Status(StatusCode code, std::string message)
      : code(code), msg(std::move(message)) {}

  static Status okStatus() { return Status(); }

  bool ok() const { return code == StatusCode::Ok; }
  StatusCode getCode() const { return code; }
  const std::string &message() const { return msg; }

  /// "<code name>: <message>", or "ok".
  std::string toString() const;

  /// Returns a copy whose message is prefixed with `context` + ": ".
  Status withContext(const std::string &context) const;

  /// Explicitly discards the status.
  void ignoreError() const {}

private:
  StatusCode code = StatusCode::Ok;
  std::string msg;
};

namespace detail {
template <typename... Args> std::string concat(Args &&...args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
} // namespace detail

/// Builds an error status whose message is the concatenation of `args`
/// (anything streamable).
template <typename... Args> Status makeError(StatusCode code, Args &&...args) {
  return Status(code, detail::concat(std::forward<Args>(args)...));
}
template <typename... Args> Status invalidArgument(Args &&...args) {
  return makeError(StatusCode::InvalidArgument, std::forward<Args>(args)...);
}
template <typename... Args> Status notFound(Args &&...args) {
  return makeError(StatusCode::NotFound, std::forward<Args>(args)...);
}
template <typename... Args> Status outOfRange(Args &&...args) {
  return makeError(StatusCode::OutOfRange, std::forward<Args>(args)...);
}
template <typename... Args> Status failedPrecondition(Args &&...args) {
  return makeError(StatusCode::FailedPrecondition, std::forward<Args>(args)...);
}
template <typename... Args> Status dataLoss(Args &&...args) {
  return makeError(StatusCode::DataLoss, std::forward<Args>(args)...);
}
template <typename... Args> Status unimplemented(Args &&...args) {
  return makeError(StatusCode::Unimplemented, std::forward<Args>(args)...);
}
template <typename... Args> Status internalError(Args &&...args) {
  return makeError(StatusCode::Internal, std::forward<Args>(args)...);
}
template <typename... Args> Status unavailable(Args &&...args) {
  return makeError(StatusCode::Unavailable, std::forward<Args>(args)...);
}

/// Either a value of type T or an error Status.
template <typename T> class [[nodiscard]] StatusOr {
public:
  /// Implicit from an error status (must not be ok).
  StatusOr(Status status) : st(std::move(status)) {
    assert(!st.ok() && "StatusOr constructed from an ok Status");
    if (st.ok())
      st = internalError("StatusOr constructed from an ok Status");
  }
  /// Implicit from a value (or anything convertible to T).
  template <typename U, typename = std::enable_if_t<
                            std::is_convertible_v<U &&, T> &&
                            !std::is_same_v<std::decay_t<U>, Status>>>
  StatusOr(U &&value) : val(T(std::forward<U>(value))) {}

  bool ok() const { return st.ok(); }
  const Status &status() const & { return st; }
  Status status() && { return std::move(st); }

  T &value() & { return *val; }
  const T &value() const & { return *val; }
  T &&value() && { return std::move(*val); }
  T &operator*() & { return *val; }
  const T &operator*() const & { return *val; }
  T &&operator*() && { return std::move(*val); }
  T *operator->() { return &*val; }
  const T *operator->() const { return &*val; }

private:
  Status st;
  std::optional<T> val;
};

} // namespace tessera::rt

#define TESSERA_RT_CONCAT_IMPL(a, b) a##b
#define TESSERA_RT_CONCAT(a, b) TESSERA_RT_CONCAT_IMPL(a, b)

/// Returns the status of `expr` from the enclosing function if it is an error.
#define TESSERA_RETURN_IF_ERROR(expr)                                          \
  do {                                                                         \
    ::tessera::rt::Status tesseraStatus_ = (expr);                             \
    if (!tesseraStatus_.ok())                                                  \
      return tesseraStatus_;                                                   \
  } while (false)

#define TESSERA_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr)                          \
  auto tmp = (expr);                                                           \
  if (!tmp.ok())                                                               \
    return std::move(tmp).status();                                            \
  lhs = std::move(tmp).value()

/// `TESSERA_ASSIGN_OR_RETURN(auto x, makeX());` — evaluates a StatusOr,
/// returns its error or assigns its value to `lhs`.
#define TESSERA_ASSIGN_OR_RETURN(lhs, expr)                                    \
  TESSERA_ASSIGN_OR_RETURN_IMPL(TESSERA_RT_CONCAT(tesseraStatusOr_, __LINE__), \
                                lhs, expr)

#endif // TESSERA_RT_STATUS_H
