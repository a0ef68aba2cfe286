#pragma once
// A group of processes as mha uses it: one MPI communicator, the few operations context-parallel
// attention and data-parallel training need, and a count of what this rank sent (the tests assert
// message counts, the benchmark reports bytes).
//
// MPI is initialised on first use (MPI_THREAD_FUNNELED: only the thread that called in talks to
// MPI; OpenMP's threads compute) and finalised at exit. Every MPI error becomes an mha::Error on
// the rank that saw it; run_or_abort turns an error on any rank into every rank's exit, so a failed
// rank never leaves the others waiting for a message that will not come.
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace mha::distributed {

// What this rank has sent: point-to-point messages and collective operations, with their bytes.
struct Traffic {
  int64_t messages = 0, message_bytes = 0;
  int64_t collectives = 0, collective_bytes = 0;
};

class Communicator {
 public:
  // MPI_COMM_WORLD (every process mpirun started).
  static Communicator& world();

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm handle() const { return comm_; }
  const Traffic& traffic() const { return traffic_; }
  void reset_traffic() { traffic_ = {}; }

  // One step around the ring, non-blocking: `send` goes to rank + 1, `receive` (exactly the size
  // rank − 1 sends) fills from rank − 1. Neither buffer may be touched until wait() returns.
  class Transfer {
   public:
    Transfer() = default;
    Transfer(Transfer&& other) noexcept;
    Transfer& operator=(Transfer&& other) noexcept;
    ~Transfer();  // waits (a transfer is never abandoned in flight)
    // Lets MPI progress a large transfer while the caller computes; true when it has finished.
    bool test();
    void wait();

   private:
    friend class Communicator;
    MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  };
  Transfer ring_shift(std::span<const std::byte> send, std::span<std::byte> receive);

  // Rank i's send[send_offsets[j] .. + send_counts[j]) arrives in rank j's receive at
  // receive_offsets[i] (MPI_Alltoallv on bytes).
  void all_to_all(std::span<const std::byte> send, const std::vector<int64_t>& send_counts,
                  std::span<std::byte> receive, const std::vector<int64_t>& receive_counts);
  // Every rank's `values`, rank by rank (MPI_Allgather).
  std::vector<int64_t> all_gather(std::span<const int64_t> values);
  // Sums in place across ranks (MPI_Allreduce).
  void all_reduce_sum(std::span<float> values);
  void all_reduce_sum(std::span<double> values);
  // The largest of every rank's `value` (MPI_Allreduce with MPI_MAX).
  double all_reduce_max(double value);
  // Every rank's bytes, rank by rank, on every rank (MPI_Allgatherv); sizes may differ.
  std::vector<std::vector<std::byte>> all_gather_bytes(std::span<const std::byte> bytes);
  void barrier();

 private:
  explicit Communicator(MPI_Comm comm);
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  Traffic traffic_;
};

// Runs `body`; if it throws on this rank, prints "mha (rank r of P): <message>" on stderr and
// aborts every rank with exit code 1 (MPI_Abort). Returns body's result otherwise.
int run_or_abort(Communicator& comm, const std::function<int()>& body);

}  // namespace mha::distributed
