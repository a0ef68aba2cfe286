// The machine's read bandwidth as `mha bench --decode` and `--paged` measure it (bench.h).
#include <omp.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cstdio>

#include "bench/bench.h"

namespace mha::tools::bench {
namespace {

// A parallel sum over 1 GiB (on every thread, the way the decode kernel reads): blocks of 32 KiB,
// each summed into independent accumulators so that the adds never wait on each other (one
// running sum read 25% less on a 2-core Zen 3: a dependency chain, not the memory), with 64-byte
// loads where the CPU has AVX-512: the compiler's 16-byte loop read 22 GB/s on an Intel Xeon VM
// where this one reads 29, and below what the decode kernels themselves read there (session 36);
// and each line prefetched (into L2) kPrefetchAhead bytes before it is read, as the decode kernels
// prefetch: on that VM a core's reads are bounded by the misses it keeps in flight, and the
// prefetches raised the sum from 26-28 GB/s to 29-30, where float32 decode at Hkv 32 read 29.5
// (session 37). One pass of read() takes the time the machine needs to read `bytes`.
constexpr int64_t kPrefetchAhead = 16384;
inline void prefetch_ahead(const uint64_t* p) {  // an address, not a pointer past the array: a hint only
  __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(p) + kPrefetchAhead), /*rw=*/0,
                     /*locality=*/1);
}
uint64_t sum_block(const uint64_t* data, int64_t count) {
  uint64_t acc[8] = {};
  for (int64_t i = 0; i < count; i += 8) {
    prefetch_ahead(data + i);
    for (int j = 0; j < 8; ++j) acc[j] += data[i + j];
  }
  uint64_t sum = 0;
  for (uint64_t a : acc) sum += a;
  return sum;
}
#if defined(__x86_64__)
__attribute__((target("avx512f"))) uint64_t sum_block_avx512(const uint64_t* data, int64_t count) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < count; i += 32) {
    for (int64_t line = 0; line < 32; line += 8) prefetch_ahead(data + i + line);
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(data + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(data + i + 8));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(data + i + 16));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(data + i + 24));
  }
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  uint64_t sum = 0;
  for (uint64_t lane : lanes) sum += lane;
  return sum;
}
#endif

}  // namespace

ReadBandwidth::ReadBandwidth() : data_(new uint64_t[kCount]) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < kCount; ++i) data_[i] = static_cast<uint64_t>(i);
}

void ReadBandwidth::read() {
    uint64_t sum = 0;
#if defined(__x86_64__)
    const bool wide = __builtin_cpu_supports("avx512f");
#pragma omp parallel for schedule(static) reduction(+ : sum)
    for (int64_t b = 0; b < kCount; b += kBlock)
      sum += wide ? sum_block_avx512(data_.get() + b, kBlock) : sum_block(data_.get() + b, kBlock);
#else
#pragma omp parallel for schedule(static) reduction(+ : sum)
    for (int64_t b = 0; b < kCount; b += kBlock) sum += sum_block(data_.get() + b, kBlock);
#endif
    total_ += sum;
    if (total_ == 42) std::printf(" ");  // keep the sum alive
}


}  // namespace mha::tools::bench
