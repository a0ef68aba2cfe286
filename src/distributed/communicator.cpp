#include "mha/distributed/communicator.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <utility>

#include "mha/core/error.h"

namespace mha::distributed {
namespace {

// An MPI call's result: an mha::Error naming the operation and MPI's own words on failure (the
// communicator returns errors instead of aborting, MPI_ERRORS_RETURN).
void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(std::string("MPI: ") + what + " failed: " + std::string(text, static_cast<size_t>(length)));
}

int count_of(int64_t bytes, const char* what) {
  check(bytes >= 0 && bytes <= INT_MAX, what, ": expected a message of at most ", INT_MAX, " bytes, got ", bytes);
  return static_cast<int>(bytes);
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

MPI_Comm initialized_world() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    std::atexit(finalize_at_exit);
  }
  return MPI_COMM_WORLD;
}

}  // namespace

Communicator& Communicator::world() {
  static Communicator comm(initialized_world());
  return comm;
}

Communicator::Communicator(MPI_Comm comm) : comm_(comm) {
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

Communicator::Transfer::Transfer(Transfer&& other) noexcept {
  std::swap(requests_, other.requests_);
}

Communicator::Transfer& Communicator::Transfer::operator=(Transfer&& other) noexcept {
  if (this != &other) {
    try {
      wait();
    } catch (...) {
    }
    std::swap(requests_, other.requests_);
  }
  return *this;
}

Communicator::Transfer::~Transfer() {
  try {
    wait();
  } catch (...) {  // a destructor may not throw; the error surfaces in MPI's next call
  }
}

bool Communicator::Transfer::test() {
  int done = 0;
  check_mpi(MPI_Testall(2, requests_, &done, MPI_STATUSES_IGNORE), "MPI_Testall (ring transfer)");
  return done != 0;
}

void Communicator::Transfer::wait() {
  check_mpi(MPI_Waitall(2, requests_, MPI_STATUSES_IGNORE), "MPI_Waitall (ring transfer)");
}

Communicator::Transfer Communicator::ring_shift(std::span<const std::byte> send, std::span<std::byte> receive) {
  const int next = (rank_ + 1) % size_, previous = (rank_ + size_ - 1) % size_;
  const int send_count = count_of(static_cast<int64_t>(send.size()), "ring_shift: send");
  const int receive_count = count_of(static_cast<int64_t>(receive.size()), "ring_shift: receive");
  Transfer t;
  constexpr int kTag = 17;
  check_mpi(MPI_Irecv(receive.data(), receive_count, MPI_BYTE, previous, kTag, comm_, &t.requests_[0]), "MPI_Irecv");
  check_mpi(MPI_Isend(send.data(), send_count, MPI_BYTE, next, kTag, comm_, &t.requests_[1]), "MPI_Isend");
  traffic_.messages += 1;
  traffic_.message_bytes += send_count;
  return t;
}

void Communicator::all_to_all(std::span<const std::byte> send, const std::vector<int64_t>& send_counts,
                              std::span<std::byte> receive, const std::vector<int64_t>& receive_counts) {
  const auto ranks = static_cast<size_t>(size_);
  check(send_counts.size() == ranks && receive_counts.size() == ranks, "all_to_all: expected ", size_,
        " counts each, got ", send_counts.size(), " and ", receive_counts.size());
  std::vector<int> sc(ranks), so(ranks), rc(ranks), ro(ranks);
  int64_t s_total = 0, r_total = 0;
  for (size_t j = 0; j < ranks; ++j) {
    so[j] = count_of(s_total, "all_to_all: send offset");
    ro[j] = count_of(r_total, "all_to_all: receive offset");
    sc[j] = count_of(send_counts[j], "all_to_all: send count");
    rc[j] = count_of(receive_counts[j], "all_to_all: receive count");
    s_total += send_counts[j];
    r_total += receive_counts[j];
  }
  check(s_total == static_cast<int64_t>(send.size()) && r_total == static_cast<int64_t>(receive.size()),
        "all_to_all: expected buffers of ", s_total, " and ", r_total, " bytes, got ", send.size(), " and ",
        receive.size());
  check_mpi(MPI_Alltoallv(send.data(), sc.data(), so.data(), MPI_BYTE, receive.data(), rc.data(), ro.data(), MPI_BYTE,
                          comm_),
            "MPI_Alltoallv");
  traffic_.collectives += 1;
  traffic_.collective_bytes += s_total - send_counts[static_cast<size_t>(rank_)];  // what leaves this rank
}

std::vector<int64_t> Communicator::all_gather(std::span<const int64_t> values) {
  std::vector<int64_t> all(values.size() * static_cast<size_t>(size_));
  const int n = count_of(static_cast<int64_t>(values.size()), "all_gather");
  check_mpi(MPI_Allgather(values.data(), n, MPI_INT64_T, all.data(), n, MPI_INT64_T, comm_), "MPI_Allgather");
  traffic_.collectives += 1;
  traffic_.collective_bytes += static_cast<int64_t>(values.size_bytes());
  return all;
}

void Communicator::all_reduce_sum(std::span<float> values) {
  const int n = count_of(static_cast<int64_t>(values.size()), "all_reduce_sum");
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, values.data(), n, MPI_FLOAT, MPI_SUM, comm_), "MPI_Allreduce");
  traffic_.collectives += 1;
  traffic_.collective_bytes += static_cast<int64_t>(values.size_bytes());
}

void Communicator::all_reduce_sum(std::span<double> values) {
  const int n = count_of(static_cast<int64_t>(values.size()), "all_reduce_sum");
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, values.data(), n, MPI_DOUBLE, MPI_SUM, comm_), "MPI_Allreduce");
  traffic_.collectives += 1;
  traffic_.collective_bytes += static_cast<int64_t>(values.size_bytes());
}

double Communicator::all_reduce_max(double value) {
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MAX, comm_), "MPI_Allreduce");
  traffic_.collectives += 1;
  traffic_.collective_bytes += static_cast<int64_t>(sizeof value);
  return value;
}

std::vector<std::vector<std::byte>> Communicator::all_gather_bytes(std::span<const std::byte> bytes) {
  const int64_t mine = static_cast<int64_t>(bytes.size());
  const std::vector<int64_t> sizes = all_gather(std::span<const int64_t>(&mine, 1));
  std::vector<int> counts(sizes.size()), offsets(sizes.size());
  int64_t total = 0;
  for (size_t j = 0; j < sizes.size(); ++j) {
    offsets[j] = count_of(total, "all_gather_bytes: offset");
    counts[j] = count_of(sizes[j], "all_gather_bytes: count");
    total += sizes[j];
  }
  std::vector<std::byte> all(static_cast<size_t>(total));
  check_mpi(MPI_Allgatherv(bytes.data(), count_of(mine, "all_gather_bytes"), MPI_BYTE, all.data(), counts.data(),
                           offsets.data(), MPI_BYTE, comm_),
            "MPI_Allgatherv");
  traffic_.collectives += 1;
  traffic_.collective_bytes += mine;
  std::vector<std::vector<std::byte>> parts;
  for (size_t j = 0; j < sizes.size(); ++j)
    parts.emplace_back(all.begin() + offsets[j], all.begin() + offsets[j] + counts[j]);
  return parts;
}

void Communicator::barrier() { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

int run_or_abort(Communicator& comm, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mha (rank %d of %d): %s\n", comm.rank(), comm.size(), e.what());
    std::fflush(stderr);
    MPI_Abort(comm.handle(), 1);
    return 1;
  }
}

}  // namespace mha::distributed
