// A thread that completes many waiters in a row (the store thread after a commit) holds a
// WakeBatch for the loop: the wake-ups the completions ask for (Worker::deliver's post to an I/O
// thread) are sent once, when the batch ends, not one by one. On a host where the completing
// thread shares a core with the I/O thread, each early wake-up let the I/O thread preempt it after
// one completion: a context switch there and back per waiter instead of one per batch.
#pragma once

#include <functional>
#include <vector>

namespace fencegate {

class WakeBatch {
 public:
  WakeBatch() : outer_(current_) { current_ = this; }
  ~WakeBatch() {
    current_ = outer_;
    for (auto& w : wakes_) w();
  }
  WakeBatch(const WakeBatch&) = delete;
  WakeBatch& operator=(const WakeBatch&) = delete;

  // Runs `wake` now on a thread without a batch, else when the innermost batch ends.
  static void wake(std::function<void()> wake) {
    if (current_) current_->wakes_.push_back(std::move(wake));
    else wake();
  }

 private:
  static inline thread_local WakeBatch* current_ = nullptr;
  WakeBatch* outer_;
  std::vector<std::function<void()>> wakes_;
};

}  // namespace fencegate
