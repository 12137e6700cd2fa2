// The compact wire's passes on a CPU (collectives/exact_wire.py has the definition and the eager reference):
// one pass over memory each, OpenMP over blocks. Built at run time by collectives/wire_cpu.py.
//
// Bit-relevant: built with -ffp-contract=off and without -ffast-math, so every float64 * and + rounds on its own
// (the eager code's ops), int64 -> float64 and float64 -> float32 round to nearest even, subnormals are kept.
// Int64 shifts and adds go through uint64 (torch's wrapping two's complement; C++ calls signed overflow undefined).
#include <cmath>
#include <cstdint>
#include <cstring>

typedef int64_t i64;
typedef uint64_t u64;
typedef __int128 i128;

static const int DIGIT = 40;
static const i64 LOW40 = (i64(1) << DIGIT) - 1;
static const int GRID = 96;
static const double M80 = 1208925819614629174706176.0;  // 2^80
static const double M40 = 1099511627776.0;              // 2^40
static const double DOWN = 0x1p-96;                      // 2^-GRID
static const double MARGIN = 0x1p-40;                    // the settle test's outward widening

static inline i64 shl(i64 x, i64 k) { return i64(u64(x) << k); }  // k in 0..63, wraps as torch's <<
static inline i64 add(i64 a, i64 b) { return i64(u64(a) + u64(b)); }
static inline i64 clamp(i64 x, i64 lo, i64 hi) { return x < lo ? lo : (x > hi ? hi : x); }

// bit_length of x >= 1 from float64's exponent, as exact_wire._bits (a conversion that rounds up adds a bit)
static inline i64 bits(i64 x) {
    int e;
    std::frexp(double(x), &e);
    return e;
}

// max(mx, -mn - 1), wrapping as torch's int64 ops
static inline i64 span(i64 mx, i64 mn) {
    i64 m = i64(u64(0) - u64(mn) - 1);
    return mx > m ? mx : m;
}

static inline double pow2(i64 e) {  // 2^e from the exponent bits, e in [-1022, 1023]
    u64 b = u64(e + 1023) << 52;
    double d;
    std::memcpy(&d, &b, 8);
    return d;
}

static inline uint32_t bits32(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}

static inline i64 block_end(i64 b, i64 block, i64 n) { return b * block + block < n ? b * block + block : n; }

extern "C" {

// Phase 1: carry-normalize the limbs in place (stores only the words that change); per block E with |L| < 2^E
// (exact_wire._top) and whether any `bad` is non-zero (bad may be null).
void wire_scan(i64* l0, i64* l1, i64* l2, const double* bad, i64 n, i64 block, int32_t* top, int32_t* flag,
               int threads) {
    i64 nb = (n + block - 1) / block;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (i64 b = 0; b < nb; b++) {
        i64 a = b * block, e = block_end(b, block, n);
        i64 mx = INT64_MIN, mn = INT64_MAX;
        for (i64 i = a; i < e; i++) {
            i64 x0 = l0[i], x1 = l1[i], x2 = l2[i];
            x1 = add(x1, x0 >> DIGIT);
            x0 &= LOW40;
            x2 = add(x2, x1 >> DIGIT);
            x1 &= LOW40;
            if (x0 != l0[i]) l0[i] = x0;
            if (x1 != l1[i]) l1[i] = x1;
            if (x2 != l2[i]) l2[i] = x2;
            mx = x2 > mx ? x2 : mx;
            mn = x2 < mn ? x2 : mn;
        }
        i64 m = span(mx, mn), E = 2 * DIGIT + bits(add(m, 1));
        if (m == 0) {  // v = l2 in {0, -1}: on with v = l2 2^40 + l1, then L
            mx = INT64_MIN, mn = INT64_MAX;
            for (i64 i = a; i < e; i++) {
                i64 v = add(shl(l2[i], DIGIT), l1[i]);
                mx = v > mx ? v : mx;
                mn = v < mn ? v : mn;
            }
            m = span(mx, mn);
            E = DIGIT + bits(add(m, 1));
            if (m == 0) {
                mx = INT64_MIN, mn = INT64_MAX;
                for (i64 i = a; i < e; i++) {
                    i64 v = add(shl(add(shl(l2[i], DIGIT), l1[i]), DIGIT), l0[i]);
                    mx = v > mx ? v : mx;
                    mn = v < mn ? v : mn;
                }
                E = bits(add(span(mx, mn), 1));
            }
        }
        top[b] = int32_t(E);
        if (bad) {
            int32_t any = 0;
            for (i64 i = a; i < e; i++) any |= bad[i] != 0.0;  // NaN != 0 holds, -0.0 != 0 does not
            flag[b] = any;
        }
    }
}

// Phase 2: words[i] = (floor(L / 2^s) << k) | [L mod 2^s != 0] of normalized limbs, s per block (0 <= s < 144).
// Exact by cases: the bits below 2^s never reach the floor, so it is a floor of l2 (s >= 80), of l2 2^40 + l1
// (s >= 40), or of L itself (s < 40, where |L| < 2^(s + 53) fits an int128).
void wire_encode(const i64* l0, const i64* l1, const i64* l2, const i64* s, i64 n, i64 block, int k, i64* words,
                 int threads) {
    i64 nb = (n + block - 1) / block;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (i64 b = 0; b < nb; b++) {
        i64 a = b * block, e = block_end(b, block, n), sb = s[b];
        if (sb >= 2 * DIGIT) {
            i64 t = sb - 2 * DIGIT, mask = (i64(1) << t) - 1;
            for (i64 i = a; i < e; i++)
                words[i] = shl(l2[i] >> t, k) | i64((l0[i] | l1[i] | (l2[i] & mask)) != 0);
        } else if (sb >= DIGIT) {
            i64 t = sb - DIGIT, mask = (i64(1) << t) - 1;
            for (i64 i = a; i < e; i++) {
                i128 u = i128(l2[i]) * (i128(1) << DIGIT) + l1[i];
                words[i] = shl(i64(u >> t), k) | i64((l0[i] | (l1[i] & mask)) != 0);
            }
        } else {
            i64 mask = (i64(1) << sb) - 1;
            for (i64 i = a; i < e; i++) {
                i128 u = i128(l2[i]) * (i128(1) << DIGIT) + l1[i];
                i128 L = u * (i128(1) << DIGIT) + l0[i];
                words[i] = shl(i64(L >> sb), k) | i64((l0[i] & mask) != 0);
            }
        }
    }
}

// exact_wire._settled for one element: every integer of [h 2^s, (h + f) 2^s - f] has lo's float32 result
static inline bool settled(i64 h, i64 f, i64 s, double w_lo, double scale) {
    i64 H = h + f;  // |h| <= 2^53
    i64 n0 = shl(H, s < DIGIT ? s : DIGIT) & LOW40;
    i64 n1 = (shl(H, clamp(s - DIGIT, 0, DIGIT)) >> clamp(DIGIT - s, 0, 63)) & LOW40;
    i64 n2 = shl(H, clamp(s - 2 * DIGIT, 0, 63)) >> clamp(2 * DIGIT - s, 0, 63);
    n0 -= f;  // then carry-normalize (limbs.normalize_)
    n1 = add(n1, n0 >> DIGIT);
    n0 &= LOW40;
    n2 = add(n2, n1 >> DIGIT);
    n1 &= LOW40;
    double v = (double(n2) * M80 + double(n1) * M40) + double(n0);  // limbs.combine's chain
    double w_hi = (v * DOWN) * scale;                                // limbs.scaled
    float down = float(w_lo - std::fabs(w_lo) * MARGIN), up = float(w_hi + std::fabs(w_hi) * MARGIN);
    return bits32(down) == bits32(up);
}

// Phase 2's decode: out = float32(fl(h) * (2^(s - 96) * scale)) with h = word >> k; per block the elements with
// F = word & (2^k - 1) > 0 (tested) and those of them the settle test leaves for phase 3 (late).
void wire_decode(const i64* words, const i64* s, i64 n, i64 block, int k, double scale, float* out,
                 int32_t* tested, int32_t* late, int threads) {
    i64 nb = (n + block - 1) / block, fmask = (i64(1) << k) - 1;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (i64 b = 0; b < nb; b++) {
        i64 a = b * block, e = block_end(b, block, n), sb = s[b];
        double fac = pow2(sb - GRID) * scale;
        int32_t t = 0, l = 0;
        for (i64 i = a; i < e; i++) {
            i64 w = words[i], h = w >> k, f = w & fmask;
            double lo = double(h) * fac;
            out[i] = float(lo);
            if (f) {
                t++;
                l += !settled(h, f, sb, lo, scale);
            }
        }
        tested[b] = t;
        late[b] = l;
    }
}

// The elements of the listed blocks that the settle test leaves for phase 3, ascending, into idx; their count.
i64 wire_late(const i64* words, const i64* s, i64 n, i64 block, int k, double scale, const i64* blocks, i64 count,
              i64* idx) {
    i64 c = 0, fmask = (i64(1) << k) - 1;
    for (i64 j = 0; j < count; j++) {
        i64 b = blocks[j], sb = s[b];
        double fac = pow2(sb - GRID) * scale;
        for (i64 i = b * block, e = block_end(b, block, n); i < e; i++) {
            i64 w = words[i], h = w >> k, f = w & fmask;
            if (f && !settled(h, f, sb, double(h) * fac, scale)) idx[c++] = i;
        }
    }
    return c;
}
}

// The packed all-reduce's wire (collectives/allreduce.py, `narrow` and `widen`): int64 values as their low W bytes,
// least significant first (two's complement; the caller's values fit). Each element's bytes are a fixed-size copy.
template <int W>
static void narrow_w(const i64* v, i64 n, unsigned char* out, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads)
    for (i64 i = 0; i < n; i++) std::memcpy(out + i * W, v + i, W);
}

// element i's W bytes, sign-extended. Every element but the last is read as 8 bytes (in bounds: i W + 8 <= n W for
// W >= 4), whose bytes past W the shift drops.
template <int W>
static inline i64 widened(const unsigned char* in, i64 i, i64 n) {
    u64 x = 0;
    std::memcpy(&x, in + i * W, i + 1 < n ? 8 : W);
    return i64(x << (64 - 8 * W)) >> (64 - 8 * W);  // arithmetic shift: the top byte's sign bit extended
}

// acc[i] = (assign ? 0 : acc[i]) + the value of element i's W bytes (wrapping, as torch's int64 add)
template <int W>
static void widen_add_w(const unsigned char* in, i64 n, i64* acc, int assign, int threads) {
    if (n <= 0) return;
    if (assign) {
#pragma omp parallel for schedule(static) num_threads(threads)
        for (i64 i = 0; i < n - 1; i++) {
            u64 x;
            std::memcpy(&x, in + i * W, 8);
            acc[i] = i64(x << (64 - 8 * W)) >> (64 - 8 * W);
        }
    } else {
#pragma omp parallel for schedule(static) num_threads(threads)
        for (i64 i = 0; i < n - 1; i++) {
            u64 x;
            std::memcpy(&x, in + i * W, 8);
            acc[i] = add(acc[i], i64(x << (64 - 8 * W)) >> (64 - 8 * W));
        }
    }
    acc[n - 1] = assign ? widened<W>(in, n - 1, n) : add(acc[n - 1], widened<W>(in, n - 1, n));
}

extern "C" {
int wire_narrow(const i64* v, i64 n, int width, unsigned char* out, int threads) {
    switch (width) {
        case 5: narrow_w<5>(v, n, out, threads); return 0;
        case 6: narrow_w<6>(v, n, out, threads); return 0;
        case 7: narrow_w<7>(v, n, out, threads); return 0;
        default: return -1;
    }
}

int wire_widen_add(const unsigned char* in, i64 n, int width, i64* acc, int assign, int threads) {
    switch (width) {
        case 5: widen_add_w<5>(in, n, acc, assign, threads); return 0;
        case 6: widen_add_w<6>(in, n, acc, assign, threads); return 0;
        case 7: widen_add_w<7>(in, n, acc, assign, threads); return 0;
        default: return -1;
    }
}
}
