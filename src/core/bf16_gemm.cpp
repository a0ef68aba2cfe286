// bf16 × bf16 → float products (mha/core/bf16_gemm.h): AMX tiles where the CPU has AMX-BF16,
// libxsmm's JIT kernels where it has AVX512_BF16, the float32 panel micro-kernel on widened
// operands elsewhere.
#include "mha/core/bf16_gemm.h"

#include <omp.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <libxsmm.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "mha/core/panel_gemm.h"
#include "mha/core/simd.h"
#include "packed_linear_args.h"

namespace mha::bf16_gemm {

namespace {

std::atomic<int> forced_limit{static_cast<int>(Path::amx)};

// B[kk][c] of a packed B of ldb columns.
bfloat16 packed_at(const bfloat16* b, size_t ldb, size_t kk, size_t c) { return b[kk / 2 * 2 * ldb + 2 * c + kk % 2]; }

// ---- The x86 instructions: AVX512_BF16 (through libxsmm) and AMX; on other CPUs none of them
// (cpu_has_bf16() and cpu_has_amx() false, so path() is float32 and the kernels are never called).
#if defined(__x86_64__)

// libxsmm_init without its mark on the environment: libxsmm 1.17 puts OMP_PROC_BIND=TRUE there
// when no affinity variable is set, and an OpenMP runtime loaded after that binds the thread that
// loads it to one core, and so every thread started from it later (found in `make bench`: once a
// bfloat16 layer had asked for the CPU's path, importing sentence-transformers loaded
// scikit-learn's libgomp, which pinned the process to core 0, and the next 2-thread runs of mha and
// PyTorch slowed by 50-100x). The variable is removed again unless someone else had set one.
void init_libxsmm() {
  const bool unset = !std::getenv("OMP_PROC_BIND") && !std::getenv("KMP_AFFINITY") && !std::getenv("GOMP_CPU_AFFINITY");
  libxsmm_init();
  if (unset) unsetenv("OMP_PROC_BIND");
}

// libxsmm's view of the CPU: Cooper Lake ("cpx") and every later x86 target it knows have
// AVX512_BF16 (an AMD Zen 4 and Intel's Sapphire Rapids report "cpx").
bool cpu_has_bf16() {
  static const bool has = [] {
    init_libxsmm();
    return libxsmm_get_target_archid() >= LIBXSMM_X86_AVX512_CPX;
  }();
  return has;
}

// ---- AMX (Intel's tile unit: TDPBF16PS multiplies 16 × 32 bf16 by 32 × 16 into 16 × 16 floats) ----
//
// Linux hands a process the tile registers only once it asks (arch_prctl ARCH_REQ_XCOMP_PERM for
// XTILEDATA, kernel 5.16 on); a CPU that has AMX-BF16 but a kernel that refuses keeps the other
// paths.
bool cpu_has_amx() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool tile = (edx >> 24) & 1u, bf16 = (edx >> 22) & 1u;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return tile && bf16 && syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return has;
}

#define MHA_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")))

// Palette 1: eight tiles of 16 rows × 64 bytes. Tiles 0–3 hold a 32 × 32 block of C (floats),
// 4–5 two 16-row strips of A (32 bf16 each), 6–7 two 16-column strips of B (16 pair rows).
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

// C's R × N tiles (R, N ∈ {1, 2}) at c = (C loaded from c, or 0) + A's 16·R rows · B's 16·N
// columns over a depth k32 (a multiple of 32); strides in bytes.
template <int R, int N>
MHA_AMX_TARGET void amx_block(const char* a, size_t as, const char* b, size_t bs, size_t k32, char* c, size_t cs,
                              bool load_c) {
  if (load_c) {
    _tile_loadd(0, c, cs);
    if constexpr (N > 1) _tile_loadd(1, c + 64, cs);
    if constexpr (R > 1) _tile_loadd(2, c + 16 * cs, cs);
    if constexpr (R > 1 && N > 1) _tile_loadd(3, c + 16 * cs + 64, cs);
  } else {
    _tile_zero(0);
    if constexpr (N > 1) _tile_zero(1);
    if constexpr (R > 1) _tile_zero(2);
    if constexpr (R > 1 && N > 1) _tile_zero(3);
  }
  for (size_t kk = 0; kk < k32; kk += 32) {
    _tile_loadd(4, a + 2 * kk, as);
    if constexpr (R > 1) _tile_loadd(5, a + 16 * as + 2 * kk, as);
    _tile_loadd(6, b + kk / 2 * bs, bs);
    if constexpr (N > 1) _tile_loadd(7, b + kk / 2 * bs + 64, bs);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (N > 1) _tile_dpbf16ps(1, 4, 7);
    if constexpr (R > 1) _tile_dpbf16ps(2, 5, 6);
    if constexpr (R > 1 && N > 1) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, cs);
  if constexpr (N > 1) _tile_stored(1, c + 64, cs);
  if constexpr (R > 1) _tile_stored(2, c + 16 * cs, cs);
  if constexpr (R > 1 && N > 1) _tile_stored(3, c + 16 * cs + 64, cs);
}

// C (m16 × n16 floats, m16 and n16 multiples of 16) = or += A (m16 × k32 bf16) · B (k32 × n16 in
// pairs): 32 × 32 blocks, 16-wide at an odd edge. Strides in elements.
MHA_AMX_TARGET void amx_tiles(size_t m16, size_t n16, size_t k32, const bfloat16* a, size_t lda, const bfloat16* b,
                              size_t ldb, float* c, size_t ldc, bool accumulate) {
  static const TileConfig config;
  _tile_loadconfig(&config);  // every call: another library may have configured this thread's tiles
  const size_t as = 2 * lda, bs = 4 * ldb, cs = 4 * ldc;
  for (size_t i = 0; i < m16; i += 32) {
    const bool two_rows = i + 32 <= m16;
    const char* ai = reinterpret_cast<const char*>(a + i * lda);
    for (size_t j = 0; j < n16; j += 32) {
      const char* bj = reinterpret_cast<const char*>(b + 2 * j);
      char* cij = reinterpret_cast<char*>(c + i * ldc + j);
      if (j + 32 <= n16) {
        if (two_rows) amx_block<2, 2>(ai, as, bj, bs, k32, cij, cs, accumulate);
        else amx_block<1, 2>(ai, as, bj, bs, k32, cij, cs, accumulate);
      } else {
        if (two_rows) amx_block<2, 1>(ai, as, bj, bs, k32, cij, cs, accumulate);
        else amx_block<1, 1>(ai, as, bj, bs, k32, cij, cs, accumulate);
      }
    }
  }
  _tile_release();
}

// The product of an even depth k on the tiles: A, B and C used in place where m, n and k fill
// whole tiles (attention's blocks), else copied into zero-padded scratch (zeros add nothing, and
// no byte past A's, B's or C's own is read).
void multiply_amx(size_t m, size_t n, size_t k, const bfloat16* a, size_t lda, const bfloat16* b, size_t ldb, float* c,
                  size_t ldc, bool accumulate) {
  const auto up = [](size_t x, size_t to) { return (x + to - 1) / to * to; };
  const size_t m16 = up(m, 16), n16 = up(n, 16), k32 = up(k, 32);
  thread_local std::vector<bfloat16> a_pad, b_pad;
  thread_local std::vector<float> c_pad;
  if (m16 != m || k32 != k) {
    a_pad.assign(m16 * k32, bfloat16{0});
    for (size_t r = 0; r < m; ++r) std::memcpy(a_pad.data() + r * k32, a + r * lda, k * sizeof(bfloat16));
    a = a_pad.data(), lda = k32;
  }
  if (n16 != n || k32 != k) {
    b_pad.assign(k32 * n16, bfloat16{0});
    for (size_t pair = 0; pair < k / 2; ++pair)
      std::memcpy(b_pad.data() + pair * 2 * n16, b + pair * 2 * ldb, 2 * n * sizeof(bfloat16));
    b = b_pad.data(), ldb = n16;
  }
  if (m16 == m && n16 == n) {
    amx_tiles(m, n, k32, a, lda, b, ldb, c, ldc, accumulate);
    return;
  }
  c_pad.assign(m16 * n16, 0.0f);
  if (accumulate)
    for (size_t r = 0; r < m; ++r) std::memcpy(c_pad.data() + r * n16, c + r * ldc, n * sizeof(float));
  amx_tiles(m16, n16, k32, a, lda, b, ldb, c_pad.data(), n16, accumulate);
  for (size_t r = 0; r < m; ++r) std::memcpy(c + r * ldc, c_pad.data() + r * n16, n * sizeof(float));
}

// The row-major product C = A·B is libxsmm's column-major Cᵀ = Bᵀ·Aᵀ: its A is our packed B (n ×
// k, pairs of k interleaved: the VNNI_A layout), its B our A (k × m, leading dimension lda). The
// JIT kernels take an even depth and read A's rows in pairs from the row start, which needs an
// even lda (measured: an odd one gives wrong rows).
bool multiply_vdpbf16ps(size_t m, size_t n, size_t k, const bfloat16* a, size_t lda, const bfloat16* b, size_t ldb,
                        float* c, size_t ldc, bool accumulate) {
  if (lda % 2 != 0) return false;
  const auto M = static_cast<libxsmm_blasint>(n), N = static_cast<libxsmm_blasint>(m),
             K = static_cast<libxsmm_blasint>(k), LDA = static_cast<libxsmm_blasint>(ldb),
             LDB = static_cast<libxsmm_blasint>(lda), LDC = static_cast<libxsmm_blasint>(ldc);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const int flags = LIBXSMM_GEMM_FLAG_VNNI_A;
  const libxsmm_bsmmfunction kernel = libxsmm_bsmmdispatch(M, N, K, &LDA, &LDB, &LDC, &alpha, &beta, &flags, nullptr);
  if (kernel == nullptr) return false;
  kernel(reinterpret_cast<const libxsmm_bfloat16*>(b), reinterpret_cast<const libxsmm_bfloat16*>(a), c);
  return true;
}

#else

bool cpu_has_bf16() { return false; }
bool cpu_has_amx() { return false; }
void multiply_amx(size_t, size_t, size_t, const bfloat16*, size_t, const bfloat16*, size_t, float*, size_t, bool) {
  std::abort();  // unreachable: path() is never amx here
}
bool multiply_vdpbf16ps(size_t, size_t, size_t, const bfloat16*, size_t, const bfloat16*, size_t, float*, size_t,
                        bool) {
  return false;
}

#endif  // __x86_64__

// The product on bf16 pairs (`p`: AMX or VDPBF16PS): the kernels take an even depth; an odd k's
// last row of B (whose pair partner lies outside B) is added on its own.
bool multiply_on_pairs(Path p, size_t m, size_t n, size_t k, const bfloat16* a, size_t lda, const bfloat16* b,
                       size_t ldb, float* c, size_t ldc, bool accumulate) {
  const size_t even = k / 2 * 2;
  if (even > 0) {
    if (p == Path::amx) multiply_amx(m, n, even, a, lda, b, ldb, c, ldc, accumulate);
    else if (!multiply_vdpbf16ps(m, n, even, a, lda, b, ldb, c, ldc, accumulate)) return false;
  } else if (!accumulate) {
    for (size_t r = 0; r < m; ++r) std::fill(c + r * ldc, c + r * ldc + n, 0.0f);
  }
  if (even < k)
    for (size_t r = 0; r < m; ++r) {
      const float x = to_float(a[r * lda + even]);
      for (size_t col = 0; col < n; ++col) c[r * ldc + col] += x * to_float(packed_at(b, ldb, even, col));
    }
  return true;
}

// A and B widened to float (B into panels), the product into a scratch C of whole vectors, then
// written or added to C's n columns.
void multiply_float32(size_t m, size_t n, size_t k, const bfloat16* a, size_t lda, const bfloat16* b, size_t ldb,
                      float* c, size_t ldc, bool accumulate) {
  const size_t W = panel_gemm::panel_width(), n_padded = (n + W - 1) / W * W;
  thread_local std::vector<float> a32, b32, b_panels, c32;
  a32.resize(m * k);
  b32.resize(k * n);
  b_panels.resize(n_padded * k);
  c32.resize(m * n_padded);
  for (size_t r = 0; r < m; ++r) convert(a + r * lda, a32.data() + r * k, k);
  for (size_t kk = 0; kk < k; ++kk)
    for (size_t col = 0; col < n; ++col) b32[kk * n + col] = to_float(packed_at(b, ldb, kk, col));
  panel_gemm::pack_rows(b32.data(), n, k, n, b_panels.data());
  panel_gemm::multiply(m, n, k, {a32.data(), k}, {b_panels.data(), W, k * W}, {c32.data(), n_padded}, false);
  for (size_t r = 0; r < m; ++r)
    for (size_t col = 0; col < n; ++col)
      c[r * ldc + col] = accumulate ? c[r * ldc + col] + c32[r * n_padded + col] : c32[r * n_padded + col];
}

#if defined(__x86_64__)
// out = in rounded to bfloat16 by VCVTNEPS2BF16 (to nearest even; a subnormal input becomes 0),
// compiled for AVX512_BF16 by a function attribute and called only where the CPU has it: one
// instruction per 16 floats where convert()'s integer rounding takes nine (5 % of the bfloat16
// sentence encoder's time, perf).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void round_native(const float* in, bfloat16* out,
                                                                                    size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(in + i)));
  if (i < n) {
    const auto mask = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm256_mask_storeu_epi16(out + i, mask, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, in + i)));
  }
}

// hi = x rounded to bfloat16, lo = x − hi rounded (exact for a float16 x; 0 where x = hi: ±inf),
// 16 at a time on VCVTNEPS2BF16 (compiled for AVX512_BF16, called only where the CPU has it: the
// float16 split products run only on AMX hosts, where the scalar loop below, packing the kv heads,
// took a float16 forward at (4, 8, 2048, 64), causal, from 48 to 90 ms).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void split_native(const float* x, size_t n,
                                                                                  bfloat16* hi,
                                                                                  bfloat16* lo) {
  for (size_t i = 0; i < n; i += 16) {
    const auto mask = static_cast<__mmask16>(n - i >= 16 ? 0xffffu : (1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(mask, x + i);
    const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
    // (the zero-masked forms: GCC 12 builds the plain ones on an "undefined" vector and warns)
    const __m512i h_words = _mm512_maskz_cvtepu16_epi32(0xffff, h);
    const __m512 h32 = _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xffff, h_words, 16));
    const __m512 rest = _mm512_maskz_sub_ps(_mm512_cmp_ps_mask(v, h32, _CMP_NEQ_UQ), v, h32);
    _mm256_mask_storeu_epi16(hi + i, mask, h);
    _mm256_mask_storeu_epi16(lo + i, mask, (__m256i)_mm512_cvtneps_pbh(rest));
  }
}

#else
void round_native(const float*, bfloat16*, size_t) { std::abort(); }             // unreachable: native() is false
void split_native(const float*, size_t, bfloat16*, bfloat16*) { std::abort(); }  // unreachable: native() is false
#endif  // __x86_64__

// x (float16) split into thread-local hi and lo of n each.
struct SplitRow {
  std::vector<float> wide;
  std::vector<bfloat16> hi, lo;
  void of(const float16* x, size_t n) {
    wide.resize(n);
    hi.resize(n);
    lo.resize(n);
    convert(x, wide.data(), n);
    split(wide.data(), n, hi.data(), lo.data());
  }
};

size_t round_up8(size_t k) { return (k + 7) / 8 * 8; }

}  // namespace

size_t packed_size(size_t k, size_t n) { return (k + 1) / 2 * 2 * n; }

// Rows kk and kk + 1 interleaved (a zero row after an odd k's last), as 16-bit integers: a loop
// the compiler vectorizes.
void pack_b(const bfloat16* x, size_t ld, size_t k, size_t n, bfloat16* dst) {
  static_assert(sizeof(bfloat16) == sizeof(uint16_t));
  for (size_t kk = 0; kk < k; kk += 2) {
    uint16_t* pairs = reinterpret_cast<uint16_t*>(dst + kk * n);
    const uint16_t* first = reinterpret_cast<const uint16_t*>(x + kk * ld);
    if (kk + 1 < k) {
      const uint16_t* second = reinterpret_cast<const uint16_t*>(x + (kk + 1) * ld);
      for (size_t col = 0; col < n; ++col) {
        pairs[2 * col] = first[col];
        pairs[2 * col + 1] = second[col];
      }
    } else {
      for (size_t col = 0; col < n; ++col) {
        pairs[2 * col] = first[col];
        pairs[2 * col + 1] = 0;
      }
    }
  }
}

// Row col of X is B's column col, and a pair of it is two neighbours of that row: the pairs are
// X's rows read as 32-bit words, transposed. Blocks of 16 rows keep the reads in a few cache
// lines each and the writes contiguous.
void pack_b_transposed(const bfloat16* x, size_t ld, size_t n, size_t k, bfloat16* dst) {
  constexpr size_t kBlock = 16;
  const size_t pairs = k / 2;
  for (size_t col0 = 0; col0 < n; col0 += kBlock) {
    const size_t cols = std::min(kBlock, n - col0);
    for (size_t p = 0; p < pairs; ++p) {
      bfloat16* out = dst + 2 * (p * n + col0);
      for (size_t c = 0; c < cols; ++c) std::memcpy(out + 2 * c, x + (col0 + c) * ld + 2 * p, 2 * sizeof(bfloat16));
    }
    if (k % 2 != 0)
      for (size_t c = 0; c < cols; ++c) {
        dst[2 * (pairs * n + col0 + c)] = x[(col0 + c) * ld + k - 1];
        dst[2 * (pairs * n + col0 + c) + 1] = bfloat16{0};
      }
  }
}

void split(const float* x, size_t n, bfloat16* hi, bfloat16* lo) {
  if (native()) return split_native(x, n, hi, lo);  // (path(): a ScopedPath pins this too)
  for (size_t i = 0; i < n; ++i) {
    hi[i] = to_bfloat16(x[i]);
    const float h = to_float(hi[i]);
    lo[i] = to_bfloat16(x[i] == h ? 0.0f : x[i] - h);
  }
}

size_t split_depth(size_t k) { return 4 * round_up8(k); }

void split_a(const float16* x, size_t k, bfloat16* dst) {
  thread_local SplitRow row;
  row.of(x, k);
  const size_t part = round_up8(k);
  std::fill(dst, dst + 4 * part, bfloat16{0});
  for (size_t p = 0; p < 4; ++p) std::copy_n((p % 2 ? row.lo : row.hi).data(), k, dst + p * part);
}

// The split rows laid out as a row-major matrix, then packed by the packers above.
void pack_split_b_transposed(const float16* x, size_t ld, size_t n, size_t k, bfloat16* dst, size_t ldb) {
  thread_local SplitRow row;
  thread_local std::vector<bfloat16> rows;
  const size_t part = round_up8(k), depth = 4 * part;
  rows.assign(ldb * depth, bfloat16{0});
  for (size_t c = 0; c < n; ++c) {
    row.of(x + c * ld, k);
    for (size_t p = 0; p < 4; ++p)
      std::copy_n((p < 2 ? row.hi : row.lo).data(), k, rows.data() + c * depth + p * part);
  }
  pack_b_transposed(rows.data(), depth, ldb, depth, dst);
}

void pack_split_b(const float16* x, size_t ld, size_t k, size_t n, bfloat16* hi, bfloat16* lo) {
  thread_local SplitRow row;
  thread_local std::vector<bfloat16> rows_hi, rows_lo;
  rows_hi.resize(k * n);
  rows_lo.resize(k * n);
  for (size_t r = 0; r < k; ++r) {
    row.of(x + r * ld, n);
    std::copy_n(row.hi.data(), n, rows_hi.data() + r * n);
    std::copy_n(row.lo.data(), n, rows_lo.data() + r * n);
  }
  pack_b(rows_hi.data(), n, k, n, hi);
  pack_b(rows_lo.data(), n, k, n, lo);
}

void multiply(size_t m, size_t n, size_t k, const bfloat16* a, size_t lda, const bfloat16* b_packed, size_t ldb,
              float* c, size_t ldc, bool accumulate) {
  if (m == 0 || n == 0) return;
  const Path p = path();
  if (p != Path::float32 && multiply_on_pairs(p, m, n, k, a, lda, b_packed, ldb, c, ldc, accumulate)) return;
  multiply_float32(m, n, k, a, lda, b_packed, ldb, c, ldc, accumulate);
}

// The CPU's best path, whatever is pinned.
static Path best_of_cpu() {
  static const Path best = !cpu_has_bf16() ? Path::float32 : cpu_has_amx() ? Path::amx : Path::vdpbf16ps;
  return best;
}

std::vector<Path> paths() {
  std::vector<Path> out{Path::float32};
  // A pinned target (or MHA_CPU_TARGET) below AVX3 is a CPU without AVX512_BF16 or AMX (simd.h).
  const Path best = mha::detail::pin_allows_avx512() ? best_of_cpu() : Path::float32;
  if (best >= Path::vdpbf16ps) out.push_back(Path::vdpbf16ps);
  if (best >= Path::amx) out.push_back(Path::amx);
  return out;
}

Path path() {
  if (!mha::detail::pin_allows_avx512()) return Path::float32;
  return std::min(best_of_cpu(), static_cast<Path>(forced_limit.load(std::memory_order_relaxed)));
}

bool native() { return path() != Path::float32; }

const char* name(Path p) {
  switch (p) {
    case Path::amx: return "AMX tiles (TDPBF16PS)";
    case Path::vdpbf16ps: return "AVX512_BF16 (VDPBF16PS, libxsmm)";
    default: return "float32 (operands widened)";
  }
}

ScopedPath::ScopedPath(Path limit) : saved_(static_cast<Path>(forced_limit.exchange(static_cast<int>(limit)))) {}
ScopedPath::~ScopedPath() { forced_limit.store(static_cast<int>(saved_)); }

void multiply_blocks(size_t m, size_t n, size_t k, const bfloat16* a, size_t lda, const bfloat16* b_packed,
                     size_t ldb, const RowSegment& finish) {
  // Jobs in row-major order (a thread's consecutive jobs share the rows of A); B's block for 64
  // columns is 64·k bfloat16s (48 KiB at k = 384).
  constexpr size_t kBlock = 64;
  const size_t row_blocks = (m + kBlock - 1) / kBlock, col_blocks = (n + kBlock - 1) / kBlock;
  const auto jobs = static_cast<int64_t>(row_blocks * col_blocks);
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && omp_get_max_threads() > 1 && jobs > 1)
  for (int64_t job = 0; job < jobs; ++job) {
    const size_t r0 = static_cast<size_t>(job) / col_blocks * kBlock, c0 = static_cast<size_t>(job) % col_blocks * kBlock;
    const size_t rows = std::min(kBlock, m - r0), cols = std::min(kBlock, n - c0);
    thread_local std::vector<float> tile;
    tile.resize(rows * cols);
    const bfloat16* b = k > 0 ? b_packed + 2 * c0 : nullptr;  // k = 0 reads no B
    multiply(rows, cols, k, a + r0 * lda, lda, b, ldb, tile.data(), cols, false);
    for (size_t r = 0; r < rows; ++r)
      finish(static_cast<int64_t>(r0 + r), static_cast<int64_t>(c0), tile.data() + r * cols, static_cast<int64_t>(cols));
  }
}

PackedLinear::PackedLinear(View<const float> weight, View<const float> bias, const std::string& what) : what_(what) {
  detail::check_packed_linear(weight, bias, what, out_, in_, bias_);
  Tensor<bfloat16> rounded = Tensor<bfloat16>::uninitialized({out_, in_});
  convert(weight.data(), rounded.data(), static_cast<size_t>(out_ * in_));
  const auto in = static_cast<size_t>(in_), out = static_cast<size_t>(out_);
  if (best_of_cpu() != Path::float32) {
    packed_ = Tensor<bfloat16>::uninitialized({static_cast<int64_t>(packed_size(in, out))});
    if (packed_.numel() > 0) pack_b_transposed(rounded.data(), in, out, in, packed_.data());
  }
  if (!native()) {
    Tensor<float> widened = Tensor<float>::uninitialized({out_, in_});
    convert(rounded.data(), widened.data(), static_cast<size_t>(out_ * in_));
    widened_ = panel_gemm::PackedLinear(widened, bias, what);
  }
}

Tensor<bfloat16> PackedLinear::forward(View<const bfloat16> x) const {
  Tensor<bfloat16> y = Tensor<bfloat16>::uninitialized(detail::packed_linear_output_shape(x.shape(), in_, out_, what_));
  forward(x, y);
  return y;
}

void PackedLinear::forward(View<const bfloat16> x, View<bfloat16> y, const Epilogue& epilogue) const {
  const int64_t m = detail::check_packed_linear_io<bfloat16>(x, y, in_, out_, what_);
  if (m == 0) return;
  const bool bf16_path = native();
  // The float panels where they were packed for this SIMD target (else, with no pairs to fall back
  // on, panel_gemm::PackedLinear's error): x widened, y's blocks rounded as they are finished.
  const bool widened = widened_.packed_width() != 0;
  if (!bf16_path && widened && (widened_.packed_width() == panel_gemm::panel_width() || packed_.numel() == 0)) {
    Tensor<float> x32 = Tensor<float>::uninitialized({m, in_}), y32 = Tensor<float>::uninitialized({m, out_});
    convert(x.data(), x32.data(), static_cast<size_t>(m * in_));
    widened_.forward(x32, y32, [&](int64_t row, int64_t col, float* values, int64_t count) {
      if (epilogue) epilogue(row, col, values, count);
      convert(values, y.data() + row * out_ + col, static_cast<size_t>(count));
    });
    return;
  }
  multiply_blocks(static_cast<size_t>(m), static_cast<size_t>(out_), static_cast<size_t>(in_), x.data(),
                  static_cast<size_t>(in_), packed_.data(), static_cast<size_t>(out_),
                  [&](int64_t row, int64_t col, float* values, int64_t count) {
                    if (bias_.defined())
                      for (int64_t j = 0; j < count; ++j) values[j] += bias_[col + j];
                    if (epilogue) epilogue(row, col, values, count);
                    bfloat16* out = y.data() + row * out_ + col;
                    if (bf16_path) round_native(values, out, static_cast<size_t>(count));
                    else convert(values, out, static_cast<size_t>(count));
                  });
}

}  // namespace mha::bf16_gemm
