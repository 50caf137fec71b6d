//===- Status.cpp - Status and StatusOr -----------------------------------===//

#include "tessera/rt/Status.h"

namespace tessera::rt {

const char *statusCodeName(StatusCode code) {
  switch (code) {
  case StatusCode::Ok:
    return "ok";
  case StatusCode::InvalidArgument:
    return "invalid argument";
  case StatusCode::NotFound:
    return "not found";
  case StatusCode::OutOfRange:
    return "out of range";
  case StatusCode::FailedPrecondition:
    return "failed precondition";
  case StatusCode::DataLoss:
    return "data loss";
  case StatusCode::Unimplemented:
    return "unimplemented";
  case StatusCode::Internal:
    return "internal";
  case StatusCode::Unavailable:
    return "unavailable";
  case StatusCode::Aborted:
    return "aborted";
  }
  return "unknown";
}

std::string Status::toString() const {
  if (ok())
    return "ok";
  return std::string(statusCodeName(code)) + ": " + msg;
}

Status Status::withContext(const std::string &context) const {
  if (ok())
    return *this;
  return Status(code, context + ": " + msg);
}

} // namespace tessera::rt
