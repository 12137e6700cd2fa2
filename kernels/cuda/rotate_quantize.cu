// Rotate-quantize in CUDA: the Triton backend's rotate_quantize (kernels/triton/rotated_mm.py) runs these for
// Hadamard blocks of 256 when the operand's C is contiguous (rows) or its rows are (columns); every other case
// takes the Triton kernel. kernels/cuda/rotate.py builds this file with NVRTC and launches it.
//
// The bits of kernels/ref/rotated_mm.quantize_symmetric(block_hadamard(finite_or_zero(row))) per row, as the
// Triton kernel (kernels/triton/rotated_mm._rotate_quantize_kernel) gives them, with the butterflies' layout
// changes done by warp shuffles instead of a float32 scratch row: Triton 3.6 has no shuffle, and the scratch
// traffic (~21 bytes an element against a floor of 5) is what its kernel is bound by (docs/perf.md).
//
// One CTA of 8 warps a row; warp w rotates the row's Hadamard blocks w, w + 8, ... (256 elements each). Lane l
// holds elements 8l .. 8l + 7 of a block: stages h = 1, 2, 4 pair elements inside a lane, stages h = 8 .. 128
// pair lane l with lane l ^ (h / 8). Every output is exactly (a + b) or (a - b) of the reference's pairing
// (lower index a, upper b), in the reference's stage order; IEEE + is commutative, so a + b may be taken on
// either lane, and a - b is taken as the partner's a minus this lane's b on the upper lane. The rotated row
// stays in registers for the step (amax / 127) and the codes: one read of the row, one write of its codes.
// No multiply-add exists to contract (only + - and a division, taken as __fdiv_rn like the reference's).
//
// Strides and sizes are ints (the launcher passes C ints; the host checks they fit); addresses are formed in
// 64 bits.
#define WARPS 8
#define BLOCK 256
#define PER_LANE 8            // BLOCK / 32
#define MAX_BLOCKS_A_WARP 8   // rows up to 8 warps x 8 blocks x 256 = 16384 elements

__device__ __forceinline__ bool finite(float x) { return fabsf(x) <= 3.402823466e38f; }

__device__ __forceinline__ float code8(float t) {  // ref.to_int8 as float: round half even, clamp, NaN -> 0
  return t != t ? 0.0f : fminf(fmaxf(rintf(t), -127.0f), 127.0f);
}

// symmetric_step: amax / 127 as a tensor division; a NaN amax (or 0) gives step 1
__device__ __forceinline__ float symmetric_step(float amax, int nan) {
  const float s = nan ? 1.0f : __fdiv_rn(amax, 127.0f);
  return s > 0.0f ? s : 1.0f;
}

// the largest |v| of 8 rotated values, and whether one is NaN (fmaxf drops a NaN; torch.amax keeps it)
__device__ __forceinline__ void take_max(const float e[8], float& amax, int& nan) {
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    nan |= e[k] != e[k];
    amax = fmaxf(amax, fabsf(e[k]));
  }
}

// over the warp's lanes: a max and an or, exact in any order
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, m));
  return x;
}

__device__ __forceinline__ int warp_or(int x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x |= __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
rotate_quantize_rows(const float* __restrict__ src, signed char* __restrict__ codes, float* __restrict__ step_out,
                     int* __restrict__ bad_out, int s_row, int c, int kp) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long row = blockIdx.x;
  const float* x = src + row * (long long)s_row;
  const int nblocks = c / BLOCK;  // the host asks for c % 256 == 0 (no padding inside a block)
  float v[MAX_BLOCKS_A_WARP][PER_LANE];
  float amax = 0.0f;
  int bad = 0, nan = 0;
#pragma unroll
  for (int i = 0; i < MAX_BLOCKS_A_WARP; ++i) {  // every block's loads first: all in flight at once
    const int blk = warp + i * WARPS;
    if (blk < nblocks) {
      const float4* p = reinterpret_cast<const float4*>(x + blk * BLOCK + lane * PER_LANE);
      const float4 lo = p[0], hi = p[1];
      float* e = v[i];
      e[0] = lo.x; e[1] = lo.y; e[2] = lo.z; e[3] = lo.w; e[4] = hi.x; e[5] = hi.y; e[6] = hi.z; e[7] = hi.w;
    }
  }
#pragma unroll
  for (int i = 0; i < MAX_BLOCKS_A_WARP; ++i) {
    const int blk = warp + i * WARPS;
    if (blk < nblocks) {
      float* e = v[i];
#pragma unroll
      for (int k = 0; k < PER_LANE; ++k) {  // finite_or_zero: +0.0 for inf and NaN, and the row is flagged
        const bool ok = finite(e[k]);
        bad |= !ok;
        e[k] = ok ? e[k] : 0.0f;
      }
#pragma unroll
      for (int h = 1; h < PER_LANE; h <<= 1) {  // stages inside the lane
#pragma unroll
        for (int k = 0; k < PER_LANE; ++k) {
          if ((k & h) == 0) {
            const float a = e[k], b = e[k + h];
            e[k] = __fadd_rn(a, b);
            e[k + h] = __fsub_rn(a, b);
          }
        }
      }
#pragma unroll
      for (int m = 1; m < 32; m <<= 1) {  // stage h = 8 m: lane l pairs with lane l ^ m
        const bool upper = (lane & m) != 0;
#pragma unroll
        for (int k = 0; k < PER_LANE; ++k) {
          const float other = __shfl_xor_sync(0xffffffffu, e[k], m);
          e[k] = upper ? __fsub_rn(other, e[k]) : __fadd_rn(e[k], other);
        }
      }
      take_max(e, amax, nan);
    }
  }
  // the row's largest |rotated|, and its flags
  amax = warp_max(amax);
  bad = warp_or(bad);
  nan = warp_or(nan);
  __shared__ float s_amax[WARPS];
  __shared__ int s_bad[WARPS], s_nan[WARPS];
  if (lane == 0) { s_amax[warp] = amax; s_bad[warp] = bad; s_nan[warp] = nan; }
  __syncthreads();
  amax = s_amax[0]; bad = s_bad[0]; nan = s_nan[0];
#pragma unroll
  for (int w = 1; w < WARPS; ++w) { amax = fmaxf(amax, s_amax[w]); bad |= s_bad[w]; nan |= s_nan[w]; }
  const float step = symmetric_step(amax, nan);
  if (threadIdx.x == 0) { step_out[row] = step; bad_out[row] = bad; }
  signed char* q = codes + row * (long long)kp;
#pragma unroll
  for (int i = 0; i < MAX_BLOCKS_A_WARP; ++i) {
    const int blk = warp + i * WARPS;
    if (blk < nblocks) {
      char4 lo, hi;
      signed char out[PER_LANE];
#pragma unroll
      for (int k = 0; k < PER_LANE; ++k) out[k] = (signed char)code8(__fdiv_rn(v[i][k], step));
      lo = make_char4(out[0], out[1], out[2], out[3]);
      hi = make_char4(out[4], out[5], out[6], out[7]);
      char4* p = reinterpret_cast<char4*>(q + blk * BLOCK + lane * PER_LANE);
      p[0] = lo;
      p[1] = hi;
    }
  }
  // columns c .. kp - 1 (the 16-padding past c) are zero codes, as the Triton kernel writes them
  for (int j = c + threadIdx.x; j < kp; j += WARPS * 32) q[j] = 0;
}

// rotate-quantize of strided operand rows (G's columns for dw: operand row j is source column j, its C index
// strided by s_col). One CTA takes 32 adjacent source columns; each Hadamard block of 256 C indices comes in as
// a [256, 32] tile, 128 coalesced bytes a source row. Thread (warp w, lane l) loads column l at C indices
// 32w .. 32w + 31 of the block: they differ in the index's bits 0-4, so the stages h = 1 .. 16 pair registers
// inside the thread and run in registers as loaded, with no exchange between threads. The stages h = 32, 64,
// 128 pair C indices held by different warps: the tile goes through shared memory once, and warp w then rotates
// columns 4w .. 4w + 3 with lane l holding C indices 32k + l (k = 0 .. 7), so those stages pair registers k and
// k ^ (h / 32) inside the lane. Every stage pairs as the reference does, in its order. The shared-memory
// accesses are one row a warp (stores) and one row a lane (reads), conflict-free. A column of C = 8192 does not
// fit in registers, so the blocks are rotated twice: once for the step, once for the codes (9 bytes an element
// moved, against 5 at the floor and ~21 through the Triton kernel's scratch).

#define COLS 32
#define SPAN (BLOCK / WARPS)  // C indices of a block a thread loads: 32, one warp's share of the tile's rows
// the column kernels' dynamic shared memory, two [BLOCK][COLS + 1] float tiles; kernels/cuda/rotate.py reads the
// number from this line and passes it at launch
#define TILES_BYTES 67584
static_assert(TILES_BYTES == 2 * BLOCK * (COLS + 1) * sizeof(float), "TILES_BYTES: two tiles");

// the butterfly stages h = 1, 2, .., n / 2 over n registers (index bits inside the thread), in the reference's
// order: register k (bit h clear) takes a + b, register k + h takes a - b
template <int N>
__device__ __forceinline__ void stages_in_registers(float (&e)[N]) {
#pragma unroll
  for (int h = 1; h < N; h <<= 1) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      if ((k & h) == 0) {
        const float a = e[k], b = e[k + h];
        e[k] = __fadd_rn(a, b);
        e[k + h] = __fsub_rn(a, b);
      }
    }
  }
}

// cp.async of one float (4 bytes, through L1), or of none (zeros written) for a column past the operand's rows
__device__ __forceinline__ void copy4(float* dst, const float* src, bool live) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(live ? 4 : 0) : "memory");
}

template <int N>
__device__ __forceinline__ void wait_copies() {  // all but this thread's N newest groups of copies have landed
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// the copies of the block at C index c0 into the tile, as one group: this thread copies column lane at C indices
// 32 warp .. 32 warp + 31, the elements it rotates in finish_tile (so only its own copies must have landed there)
__device__ __forceinline__ void issue_tile(float (*tile)[COLS + 1], const float* __restrict__ src, int s_col,
                                           long long c0, int j0, bool live_col, int warp, int lane) {
  const long long r0 = c0 + SPAN * warp;
  const float* p = src + (live_col ? r0 * s_col + j0 + lane : 0);
  const long long stride = live_col ? s_col : 0;
#pragma unroll
  for (int i = 0; i < SPAN; ++i) copy4(&tile[SPAN * warp + i][lane], p + i * stride, live_col);
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// this thread's 32 elements of the landed tile (C indices 32 warp .. 32 warp + 31 of column lane, the block at
// c0) made finite (the thread's flag or'ed into the return) and rotated by the stages h = 1 .. 16, in place
__device__ __forceinline__ int finish_tile(float (*tile)[COLS + 1], long long c0, int has_pre,
                                           const float* __restrict__ pre, int pre_stride, int warp, int lane) {
  const long long r0 = c0 + SPAN * warp;
  float x[SPAN];
#pragma unroll
  for (int i = 0; i < SPAN; ++i) x[i] = tile[SPAN * warp + i][lane];
  if (has_pre) {
    float sc[SPAN];
#pragma unroll
    for (int i = 0; i < SPAN; ++i) sc[i] = pre[(r0 + i) * pre_stride];
#pragma unroll
    for (int i = 0; i < SPAN; ++i) x[i] = __fmul_rn(code8(__fdiv_rn(x[i], sc[i])), sc[i]);
  }
  int bad = 0;
#pragma unroll
  for (int i = 0; i < SPAN; ++i) {
    const bool ok = finite(x[i]);
    bad |= !ok;
    x[i] = ok ? x[i] : 0.0f;
  }
  stages_in_registers(x);
#pragma unroll
  for (int i = 0; i < SPAN; ++i) tile[SPAN * warp + i][lane] = x[i];
  return bad;
}

// column jj of the tile, its rotation finished by the stages h = 32, 64, 128: lane l gets C indices 32k + l
__device__ __forceinline__ void tile_column(float (*tile)[COLS + 1], int jj, int lane, float e[8]) {
  float v[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = tile[32 * k + lane][jj];
  stages_in_registers(v);
#pragma unroll
  for (int k = 0; k < 8; ++k) e[k] = v[k];
}

// a rotated column's codes for the block at out (its C indices 32k + l from lane l)
__device__ __forceinline__ void store_column_codes(signed char* out, const float e[8], float step, int lane) {
#pragma unroll
  for (int k = 0; k < 8; ++k) out[32 * k + lane] = (signed char)code8(__fdiv_rn(e[k], step));
}

// warp 0's lane l: the or over the warps of the flags of tile column l (each thread loaded column lane)
__device__ __forceinline__ int column_flags(int (*s_bad)[COLS], int bad, int warp, int lane) {
  s_bad[warp][lane] = bad;
  __syncthreads();
  int any = 0;
  if (warp == 0) {
#pragma unroll
    for (int w = 0; w < WARPS; ++w) any |= s_bad[w][lane];
  }
  return any;
}

// C indices c .. kp - 1 (the 16-padding) of the CTA's columns are zero codes, as the Triton kernel writes them
__device__ __forceinline__ void zero_padding(signed char* codes, int j0, int rows, int c, int kp) {
  for (int j = 0; j < COLS; ++j)
    if (j0 + j < rows)
      for (int i = c + threadIdx.x; i < kp; i += WARPS * 32) codes[(long long)(j0 + j) * kp + i] = 0;
}

// one pass over blocks first, first + stride, ... of the CTA's 32 columns (all of them, or a split's share), with
// two tiles in shared memory: the next block's copies are in flight while this one is rotated. CODES: this warp's
// four columns' codes cut with their steps; else their largest |rotated| and NaN into amax and nan. Returns the
// or of the flags of the column this thread loads.
template <bool CODES>
__device__ __forceinline__ int blocks_pass(float (*tiles)[COLS + 1], const float* __restrict__ src,
                                           signed char* __restrict__ codes, int s_col, int rows, int c, int kp,
                                           int first, int stride, int j0, bool live_col, int has_pre,
                                           const float* __restrict__ pre, int pre_stride, const float step[4],
                                           float amax[4], int nan[4], int warp, int lane) {
  const int nblocks = c / BLOCK;
  int bad = 0, buf = 0;
  if (first < nblocks) issue_tile(tiles, src, s_col, (long long)first * BLOCK, j0, live_col, warp, lane);
  for (int b = first; b < nblocks; b += stride, buf ^= 1) {
    float (*tile)[COLS + 1] = tiles + buf * BLOCK;
    if (b + stride < nblocks) {
      issue_tile(tiles + (buf ^ 1) * BLOCK, src, s_col, (long long)(b + stride) * BLOCK, j0, live_col, warp, lane);
      wait_copies<1>();
    } else {
      wait_copies<0>();
    }
    bad |= finish_tile(tile, (long long)b * BLOCK, has_pre, pre, pre_stride, warp, lane);
    __syncthreads();
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int jj = 4 * warp + q;
      float e[8];
      tile_column(tile, jj, lane, e);
      if (CODES) {
        if (j0 + jj < rows)
          store_column_codes(codes + (long long)(j0 + jj) * kp + (long long)b * BLOCK, e, step[q], lane);
      } else {
        take_max(e, amax[q], nan[q]);
      }
    }
    __syncthreads();  // every warp has read the tile before the copies of the block after next overwrite it
  }
  return bad;
}

// has_pre: the operand is the dequantized code of src / pre, rebuilt as the Triton kernel's PRE does
// (x_hat with one step: pre_stride 0; w_hat with a step per C index: pre_stride 1); its flags are the rebuilt
// value's.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
rotate_quantize_cols(const float* __restrict__ src, signed char* __restrict__ codes, float* __restrict__ step_out,
                     int* __restrict__ bad_out, int s_col, int rows, int c, int kp, int has_pre,
                     const float* __restrict__ pre, int pre_stride) {
  extern __shared__ float dyn[];  // two tiles: TILES_BYTES, set by the launcher
  float (*tiles)[COLS + 1] = reinterpret_cast<float (*)[COLS + 1]>(dyn);
  __shared__ int s_bad[WARPS][COLS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int j0 = blockIdx.x * COLS;
  const bool live_col = j0 + lane < rows;  // the tile column this thread loads (threadIdx.x % 32 == lane)
  float amax[4] = {0.0f, 0.0f, 0.0f, 0.0f}, step[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  int nan[4] = {0, 0, 0, 0};
  // the step: every block rotated once
  const int bad = blocks_pass<false>(tiles, src, codes, s_col, rows, c, kp, 0, 1, j0, live_col, has_pre, pre,
                                     pre_stride, step, amax, nan, warp, lane);
#pragma unroll
  for (int q = 0; q < 4; ++q) step[q] = symmetric_step(warp_max(amax[q]), warp_or(nan[q]));
  // the codes: every block rotated again
  blocks_pass<true>(tiles, src, codes, s_col, rows, c, kp, 0, 1, j0, live_col, has_pre, pre, pre_stride, step, amax,
                    nan, warp, lane);
  const int any = column_flags(s_bad, bad, warp, lane);
  if (warp == 0 && live_col) bad_out[j0 + lane] = any;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int j = j0 + 4 * warp + q;
    if (lane == 0 && j < rows) step_out[j] = step[q];
  }
  zero_padding(codes, j0, rows, c, kp);
}

// The columns with C split over CTAs (grid: column groups x splits), for shapes with few column groups: x_hat's
// and w_hat's columns at open-1b's k of 2048 are 64 groups for 132 SMs. Two launches over the same blocks
// (b = split, split + splits, ...). The first takes each column's largest |rotated|, its NaN and its flag into
// global words by atomics: atomicMax on a non-negative float's bits orders them as the values, and max and or
// are exact in any order. The second rotates the blocks again and cuts the codes with the step.

extern "C" __global__ void __launch_bounds__(WARPS * 32)
rotate_cols_amax(const float* __restrict__ src, int s_col, int rows, int c, int has_pre, const float* __restrict__ pre,
                 int pre_stride, unsigned* __restrict__ amax_bits, int* __restrict__ nan_out,
                 int* __restrict__ bad_out) {
  extern __shared__ float dyn[];  // two tiles: TILES_BYTES, set by the launcher
  float (*tiles)[COLS + 1] = reinterpret_cast<float (*)[COLS + 1]>(dyn);
  __shared__ int s_bad[WARPS][COLS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int j0 = blockIdx.x * COLS;
  const bool live_col = j0 + lane < rows;
  float amax[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const float step[4] = {1.0f, 1.0f, 1.0f, 1.0f};  // unused by this pass
  int nan[4] = {0, 0, 0, 0};
  const int bad = blocks_pass<false>(tiles, src, nullptr, s_col, rows, c, 0, blockIdx.y, gridDim.y, j0, live_col,
                                     has_pre, pre, pre_stride, step, amax, nan, warp, lane);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float m = warp_max(amax[q]);
    const int n = warp_or(nan[q]);
    const int j = j0 + 4 * warp + q;
    if (lane == 0 && j < rows) {
      atomicMax(amax_bits + j, __float_as_uint(m));
      if (n) atomicOr(nan_out + j, 1);
    }
  }
  const int any = column_flags(s_bad, bad, warp, lane);
  if (warp == 0 && live_col && any) atomicOr(bad_out + j0 + lane, 1);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
rotate_cols_codes(const float* __restrict__ src, signed char* __restrict__ codes, int s_col, int rows, int c,
                  int kp, int has_pre, const float* __restrict__ pre, int pre_stride, const unsigned* __restrict__ amax_bits,
                  const int* __restrict__ nan_in, const int* __restrict__ bad_in, float* __restrict__ step_out,
                  int* __restrict__ bad_out) {
  extern __shared__ float dyn[];
  float (*tiles)[COLS + 1] = reinterpret_cast<float (*)[COLS + 1]>(dyn);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int j0 = blockIdx.x * COLS;
  const bool live_col = j0 + lane < rows;
  float step[4], amax[4];  // amax, nan: unused by this pass
  int nan[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int j = j0 + 4 * warp + q;
    step[q] = j < rows ? symmetric_step(__uint_as_float(amax_bits[j]), nan_in[j]) : 1.0f;
    if (blockIdx.y == 0 && lane == 0 && j < rows) { step_out[j] = step[q]; bad_out[j] = bad_in[j]; }
  }
  blocks_pass<true>(tiles, src, codes, s_col, rows, c, kp, blockIdx.y, gridDim.y, j0, live_col, has_pre, pre,
                    pre_stride, step, amax, nan, warp, lane);
  if (blockIdx.y == 0) zero_padding(codes, j0, rows, c, kp);
}
