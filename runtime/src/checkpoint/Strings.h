//===- Strings.h - How checkpoint messages print values ---------*- C++ -*-===//
//
// Internal to runtime/src/checkpoint/: how checkpoint error messages print
// shapes ("[3, 5]") and CRC-32s ("0x0a1b2c3d"), and the prefix / suffix
// tests on buffer names ("main:", "adam.exp_avg:" + a bucket view).
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_CHECKPOINT_STRINGS_H
#define TESSERA_RT_CHECKPOINT_STRINGS_H

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::rt::ckpt {

inline std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

inline std::string shapeString(const std::vector<int64_t> &shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

inline bool startsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

inline bool endsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.substr(s.size() - suffix.size()) == suffix;
}

} // namespace tessera::rt::ckpt

#endif // TESSERA_RT_CHECKPOINT_STRINGS_H
