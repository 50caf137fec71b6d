//===- CommandLine.h - Flag parsing for the runtime tools --------*- C++ -*-===//
//
// The one loop tessera-run and tessera-preprocess share: walks argv, splits
// `--flag=value`, and hands out a flag's value from the same or the next
// argument.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_COMMANDLINE_H
#define TESSERA_RT_COMMANDLINE_H

#include "tessera/rt/Status.h"

#include <string>

namespace tessera::rt {

class ArgReader {
public:
  ArgReader(int argc, char **argv) : argc(argc), argv(argv) {}

  /// Moves to the next argument; false when there is none.
  bool next() {
    if (++i >= argc)
      return false;
    flag = argv[i];
    inlineValue.clear();
    hasInline = false;
    if (flag.rfind("--", 0) == 0) {
      size_t eq = flag.find('=');
      if (eq != std::string::npos) {
        inlineValue = flag.substr(eq + 1);
        flag = flag.substr(0, eq);
        hasInline = true;
      }
    }
    return true;
  }

  /// The current argument without an inline `=value`.
  const std::string &arg() const { return flag; }
  /// The current argument as given.
  const char *raw() const { return argv[i]; }
  /// Whether the current flag carried `=value`.
  bool hasInlineValue() const { return hasInline; }

  /// The current flag's value: the inline one or the next argument.
  StatusOr<std::string> value() {
    if (hasInline)
      return inlineValue;
    if (i + 1 >= argc)
      return invalidArgument("missing value for ", flag);
    return std::string(argv[++i]);
  }

private:
  int argc;
  char **argv;
  int i = 0;
  std::string flag, inlineValue;
  bool hasInline = false;
};

} // namespace tessera::rt

#endif // TESSERA_RT_COMMANDLINE_H
