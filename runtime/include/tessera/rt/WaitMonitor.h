//===- WaitMonitor.h - What a rank waits for, for the watchdog --*- C++ -*-===//
//
// tessera-run's watchdog ends a rank that makes no progress for --timeout
// seconds, naming what it waited for. The executor tracks its own
// instructions and p2p batches (Executor::stalledInstruction); a WaitMonitor
// tracks the steps outside them: those of a checkpoint save or load
// (barriers, all-gathers, file writes and reads). The rank's thread marks
// the step it enters and leaves, the watchdog thread polls.
//
//===----------------------------------------------------------------------===//

#ifndef TESSERA_RT_WAITMONITOR_H
#define TESSERA_RT_WAITMONITOR_H

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace tessera::rt {

class WaitMonitor {
public:
  /// What a step waits on: other ranks (a collective) or the file system.
  enum class On { Peers, FileSystem };

  /// The rank enters `step` (say "saving checkpoint iteration 5 to DIR:
  /// waiting for ..."), replacing any previous one; its clock starts now.
  void begin(std::string step, On on) {
    std::lock_guard<std::mutex> lock(mutex);
    current = std::move(step);
    waitsOn = on;
    sinceNs = nowNs();
  }
  /// The rank is in no step.
  void end() {
    std::lock_guard<std::mutex> lock(mutex);
    current.clear();
  }

  /// Once the current step has lasted `seconds` or more: "<step> made no
  /// progress for N s", with what it waits on in `on`; else "".
  std::string stalled(double seconds, On *on = nullptr) const {
    std::lock_guard<std::mutex> lock(mutex);
    if (current.empty())
      return "";
    double stuck = double(nowNs() - sinceNs) * 1e-9;
    if (stuck < seconds)
      return "";
    if (on)
      *on = waitsOn;
    return current + " made no progress for " + std::to_string(int64_t(stuck)) +
           " s";
  }

  /// The likely cause the watchdog names after a stalled step.
  static const char *likelyCause(On on) {
    return on == On::Peers ? "a peer rank may have died or stalled"
                           : "the file system may have stalled";
  }

  /// begin() on construction and end() on destruction; a null monitor
  /// does nothing.
  class Step {
  public:
    Step(WaitMonitor *monitor, std::string step, On on) : monitor(monitor) {
      if (monitor)
        monitor->begin(std::move(step), on);
    }
    ~Step() {
      if (monitor)
        monitor->end();
    }
    Step(const Step &) = delete;
    Step &operator=(const Step &) = delete;

  private:
    WaitMonitor *monitor;
  };

private:
  static int64_t nowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  mutable std::mutex mutex;
  std::string current;
  On waitsOn = On::Peers;
  int64_t sinceNs = 0;
};

} // namespace tessera::rt

#endif // TESSERA_RT_WAITMONITOR_H
