// work_split (mha/attention/work_split.h): the backend's loops (work_split.h), dealt to threads as
// OpenMP's dynamic schedule deals them.
#include "work_split.h"

#include <algorithm>
#include <numeric>

namespace mha::attention::detail {

WorkSplit share(const std::vector<TaskLoop>& loops, int threads) {
  WorkSplit split;
  split.loops = static_cast<int64_t>(loops.size());
  std::vector<int64_t> taken(static_cast<size_t>(threads), 0);
  double work = 0, time = 0;
  for (const TaskLoop& loop : loops) {
    // Every thread starts the loop at once; the thread free first (the lowest, on a tie) takes the
    // next task.
    std::vector<double> free_at(static_cast<size_t>(threads), 0.0);
    for (double task : loop.work) {
      const size_t thread = static_cast<size_t>(std::min_element(free_at.begin(), free_at.end()) - free_at.begin());
      free_at[thread] += task;
      ++taken[thread];
    }
    const size_t n = loop.work.size();
    work += std::accumulate(loop.work.begin(), loop.work.end(), 0.0);
    time += *std::max_element(free_at.begin(), free_at.end());
    split.tasks += static_cast<int64_t>(n);
  }
  split.fewest = *std::min_element(taken.begin(), taken.end());
  split.most = *std::max_element(taken.begin(), taken.end());
  split.idle = time > 0 ? 1.0 - work / (threads * time) : 0.0;
  return split;
}

}  // namespace mha::attention::detail
