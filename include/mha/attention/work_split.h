#pragma once
// How a call's work is shared among threads. Each backend cuts a call into tasks from its shape
// alone (so that the results are the same bits for any thread count); this takes the backend's
// own plan (the tasks its parallel loops hand out, in order, each with its work) and models how
// `threads` threads share them under OpenMP's dynamic schedule: a thread that is free takes the
// next task (or run of tasks), and a loop ends when its last task does. A task's work is counted
// in score elements × the products per score (cpu_flash) or keys read (decode), not timed.
// docs/performance.md ("Threads") tabulates it for `mha bench`'s shapes, as
// tests/attention/work_split_test.cpp prints it.
#include <cstdint>

#include "mha/attention/options.h"
#include "mha/core/tensor.h"

namespace mha::attention {

enum class Pass { forward, backward };

struct WorkSplit {
  Backend backend = Backend::automatic;  // the backend that runs the pass (automatic resolved)
  int64_t loops = 0;                     // parallel loops, one after another (a barrier between two)
  int64_t tasks = 0;                     // tasks over all loops
  int64_t fewest = 0, most = 0;          // tasks one thread runs over all loops: the fewest, the most
  double idle = 0;                       // the threads' idle share of the loops' time: 1 − work / (threads × time)
};

// The split of sdpa_forward (Pass::forward) or sdpa_backward (Pass::backward) on these shapes
// and options among `threads` threads (>= 1). The options are checked as the call checks them;
// the reference backend, which runs no parallel tasks of its own, is an error.
template <class T>
WorkSplit work_split(const Shape& query, const Shape& key, const Shape& value, const Options<T>& options, Pass pass,
                     int threads);

}  // namespace mha::attention
