#pragma once
// Each backend's parallel loops as data: the tasks its `omp for` loops hand out, in their order,
// with the work each does, from the plan the backend itself runs. work_split
// (mha/attention/work_split.h) models how a number of threads shares them.
#include <cstdint>
#include <vector>

#include "mha/attention/work_split.h"
#include "problem.h"

namespace mha::attention::detail {

struct TaskLoop {  // a schedule(dynamic) loop: a free thread takes the next task
  std::vector<double> work;  // per task, in the loop's order (score elements × products, or keys read)
};

// The loops one after another (a barrier between two).
std::vector<TaskLoop> cpu_flash_forward_loops(const Problem& p);
template <class T>
std::vector<TaskLoop> cpu_flash_backward_loops(const Problem& p);
std::vector<TaskLoop> decode_loops(const Problem& p);

// How `threads` threads share the loops (mha/attention/work_split.h), Backend left to the caller.
WorkSplit share(const std::vector<TaskLoop>& loops, int threads);

}  // namespace mha::attention::detail
