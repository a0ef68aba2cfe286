// The distributed tests' main, run under mpirun: every rank runs every test; rank 0 prints
// GoogleTest's report and the other ranks only their failures, each marked with its rank; the
// process fails if any rank failed.
//
// `--fail-on-rank=R`: instead, rank R throws inside run_or_abort while the others wait in a
// barrier, to show that one failing rank ends them all (ctest "distributed.abort").
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "mha/core/error.h"
#include "mha/distributed/communicator.h"

namespace {

// Prints a failed assertion with the rank that saw it (ranks other than 0).
class RankFailures : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailures(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::printf("[rank %d] %s:%d: failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                result.line_number(), result.summary());
    std::fflush(stdout);
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto& comm = mha::distributed::Communicator::world();
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--fail-on-rank=", 15) != 0) continue;
    const int failing = std::atoi(argv[i] + 15);
    return mha::distributed::run_or_abort(comm, [&] {
      if (comm.rank() == failing) throw mha::Error("deliberate failure");
      comm.barrier();  // the others would wait here for ever
      return 0;
    });
  }
  if (comm.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailures(comm.rank()));
  }
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  double any = failed;
  comm.all_reduce_sum(std::span<double>(&any, 1));
  if (comm.rank() == 0 && any > 0) std::printf("%g of %d ranks failed\n", any, comm.size());
  return any > 0 ? 1 : 0;
}
