// gradkit's selection and compression kernels (docs/GPU.md). One self-contained source:
// NVRTC compiles it at run time (it ships no CUB and no standard headers, so nothing is
// included), and the host C++ compiler compiles it unchanged under the emulation header
// (lib/cuda-emu/src/emu.h, GK_EMU defined) for the CPU checks in make test.
//
// The host side that launches these, in order, is lib/cuda/src/exec.rs; every kernel's
// semantics is the CPU `Kernels` method named beside it (lib/sparsify/src/kernels.rs).
// Rules that make the results bit-identical to the CPU where the CPU is exact:
// * no floating-point contraction: NVRTC is given --fmad=false, the emulation
//   -ffp-contract=off, so `a*b + c` rounds twice as on the CPU;
// * order-dependent work (ordered compaction) uses per-tile counts, one scan and a
//   recomputation, never atomics; atomics only add integers (histograms) or floats where
//   the CPU order is not reproducible anyway (scatter-add with repeated indices);
// * f64 sums (moments, 1-bit scales) are reduced in a fixed tree order per launch
//   configuration: deterministic, but not the CPU's eight-lane order (bounded in the tests).

#ifndef GK_EMU
#define GK_KERNEL extern "C" __global__
#define GK_DEVICE __device__ __forceinline__
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
#endif

// Threads per block and elements per thread of the tiled (ordered) kernels. exec.rs reads
// the same numbers (GK_BLOCK, GK_TILE there) and the tests check they agree.
#define GK_BLOCK 256
#define GK_ITEMS 8
#define GK_TILE (GK_BLOCK * GK_ITEMS)

// Planted bugs (compiled only by the emulation tests, which must detect each).
#ifdef GRADKIT_PLANT_SIGN_GT_FOR_GE
#define GK_NONNEG(c) ((c) > 0.0f)
#else
#define GK_NONNEG(c) ((c) >= 0.0f)
#endif
#ifdef GRADKIT_PLANT_THRESHOLD_GE_FOR_GT
#define GK_ABOVE(a, th) ((a) >= (th))
#else
#define GK_ABOVE(a, th) ((a) > (th))
#endif
#ifdef GRADKIT_PLANT_COMPACT_OFF_BY_ONE
#define GK_COMPACT_END(n) ((n) - 1u)
#else
#define GK_COMPACT_END(n) (n)
#endif

// The magnitude order of the CPU top-k: the IEEE bits with the sign cleared.
GK_DEVICE u32 gk_key(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// Selection flags of one element, packed as (greater << 16) | equal.
// mode 0: threshold, |v| > th (a float compare: NaN never passes).
// mode 1: top-k against the k-th largest key T: greater = key > T, equal = key == T.
GK_DEVICE u32 gk_flags(float v, u32 mode, float th, u32 t) {
  if (mode == 0u) {
    return GK_ABOVE(fabsf(v), th) ? (1u << 16) : 0u;
  }
  u32 k = gk_key(v);
  return k > t ? (1u << 16) : (k == t ? 1u : 0u);
}

// Exclusive scan over the block (Hillis-Steele in shared memory); every thread gets the
// block's total. All threads must call it.
GK_DEVICE u32 gk_block_scan(u32 v, u32* sh, u32* total) {
  u32 t = threadIdx.x;
  sh[t] = v;
  __syncthreads();
  for (u32 off = 1; off < GK_BLOCK; off <<= 1) {
    u32 a = t >= off ? sh[t - off] : 0u;
    __syncthreads();
    sh[t] += a;
    __syncthreads();
  }
  u32 incl = sh[t];
  *total = sh[GK_BLOCK - 1];
  __syncthreads();
  return incl - v;
}

// Sum of the block's doubles in a fixed tree order; the result is valid in thread 0.
GK_DEVICE double gk_block_sum(double v, double* sh) {
  u32 t = threadIdx.x;
  sh[t] = v;
  __syncthreads();
  for (u32 off = GK_BLOCK / 2; off > 0; off >>= 1) {
    if (t < off) sh[t] += sh[t + off];
    __syncthreads();
  }
  double r = sh[0];
  __syncthreads();
  return r;
}

// ---- ordered selection: count per tile, scan, compact -----------------------------------

// counts[b] = greater, counts[nb + b] = equal in tile b (tile b = elements b*TILE ..).
GK_KERNEL void gk_count(const float* x, u32 n, u32 mode, float th, const u32* st,
                        u32* counts, u32 nb) {
  __shared__ u32 sh[GK_BLOCK];
  u32 t = mode == 1u ? st[0] : 0u;
  u32 base = blockIdx.x * GK_TILE + threadIdx.x * GK_ITEMS;
  u32 f = 0;
  for (u32 j = 0; j < GK_ITEMS; j++) {
    u32 i = base + j;
    if (i < n) f += gk_flags(x[i], mode, th, t);
  }
  u32 total;
  gk_block_scan(f, sh, &total);
  if (threadIdx.x == 0) {
    counts[blockIdx.x] = total >> 16;
    counts[nb + blockIdx.x] = total & 0xffffu;
  }
}

// One block: both rows of counts (nb each) to exclusive prefix sums in place; totals[0] =
// all greater, totals[1] = all equal.
GK_KERNEL void gk_scan(u32* counts, u32 nb, u32* totals) {
  __shared__ u32 sh[GK_BLOCK];
  u32 per = (nb + GK_BLOCK - 1) / GK_BLOCK;
  for (u32 row = 0; row < 2; row++) {
    u32* a = counts + row * nb;
    u32 lo = threadIdx.x * per;
    u32 hi = lo + per < nb ? lo + per : nb;
    u32 s = 0;
    for (u32 i = lo; i < hi; i++) s += a[i];
    u32 total;
    u32 run = gk_block_scan(s, sh, &total);
    for (u32 i = lo; i < hi; i++) {
      u32 v = a[i];
      a[i] = run;
      run += v;
    }
    if (threadIdx.x == 0) totals[row] = total;
    __syncthreads();
  }
}

// Writes the selected indices (and values, unless val is null) in ascending index order.
// Top-k (mode 1) takes every key > T and the first k - (number of keys > T) keys == T, so
// ties go to the lower index; st[2] holds k.
GK_KERNEL void gk_compact(const float* x, u32 n, u32 mode, float th, const u32* st,
                          const u32* counts, u32 nb, const u32* totals, u32* idx, float* val) {
  __shared__ u32 sh[GK_BLOCK];
  u32 t = mode == 1u ? st[0] : 0u;
  u32 need = mode == 1u ? st[2] - totals[0] : 0u;
  u32 end = GK_COMPACT_END(n);
  u32 base = blockIdx.x * GK_TILE + threadIdx.x * GK_ITEMS;
  u32 f[GK_ITEMS];
  u32 sum = 0;
  for (u32 j = 0; j < GK_ITEMS; j++) {
    u32 i = base + j;
    f[j] = i < end ? gk_flags(x[i], mode, th, t) : 0u;
    sum += f[j];
  }
  u32 total;
  u32 before = gk_block_scan(sum, sh, &total);
  u32 gt = counts[blockIdx.x] + (before >> 16);
  u32 eq = counts[nb + blockIdx.x] + (before & 0xffffu);
  for (u32 j = 0; j < GK_ITEMS; j++) {
    u32 i = base + j;
    u32 pos;
    if (f[j] >> 16) {
      pos = gt + (eq < need ? eq : need);
      gt++;
    } else if (f[j]) {
      bool take = eq < need;
      pos = gt + eq;
      eq++;
      if (!take) continue;
    } else {
      continue;
    }
    idx[pos] = i;
    if (val) val[pos] = x[i];
  }
}

// ---- radix select of the k-th largest key ------------------------------------------------
// st[0] = the key's bits found so far, st[1] = the rank still sought among the keys that
// share them (1 = the largest), st[2] = k. Four passes of 8 bits, from bit 24 down.

GK_KERNEL void gk_radix_hist(const float* x, u32 n, u32 shift, const u32* st, u32* hist) {
  __shared__ u32 h[256];
  if (threadIdx.x < 256) h[threadIdx.x] = 0;
  __syncthreads();
  u32 prefix = st[0];
  for (u32 i = blockIdx.x * GK_BLOCK + threadIdx.x; i < n; i += gridDim.x * GK_BLOCK) {
    u32 k = gk_key(x[i]);
    if (shift == 24u || (k >> (shift + 8)) == (prefix >> (shift + 8))) {
      atomicAdd(&h[(k >> shift) & 255u], 1u);
    }
  }
  __syncthreads();
  if (threadIdx.x < 256 && h[threadIdx.x]) atomicAdd(&hist[threadIdx.x], h[threadIdx.x]);
}

// One block: picks the digit that holds the rank sought, then clears the histogram for the
// next pass.
GK_KERNEL void gk_radix_pick(u32 shift, u32* st, u32* hist) {
  if (threadIdx.x == 0) {
    u32 r = st[1];
    for (int d = 255; d >= 0; d--) {
      u32 c = hist[d];
      if (r <= c) {
        st[0] |= (u32)d << shift;
        st[1] = r;
        break;
      }
      r -= c;
    }
  }
  __syncthreads();
  if (threadIdx.x < 256) hist[threadIdx.x] = 0;
}

// ---- sums: Gaussiank's moments and the 1-bit scale ----------------------------------------

// part[2b], part[2b+1] = Σx, Σx² (f64) of block b's grid-stride share.
GK_KERNEL void gk_moments_part(const float* x, u32 n, double* part) {
  __shared__ double sh[GK_BLOCK];
  double s = 0.0, s2 = 0.0;
  for (u32 i = blockIdx.x * GK_BLOCK + threadIdx.x; i < n; i += gridDim.x * GK_BLOCK) {
    double v = (double)x[i];
    s += v;
    s2 += v * v;
  }
  s = gk_block_sum(s, sh);
  s2 = gk_block_sum(s2, sh);
  if (threadIdx.x == 0) {
    part[2 * blockIdx.x] = s;
    part[2 * blockIdx.x + 1] = s2;
  }
}

// One block: out[0] = mean, out[1] = population std, as gaussiank::mean_std finishes them.
GK_KERNEL void gk_moments_final(const double* part, u32 np, u32 n, double* out) {
  __shared__ double sh[GK_BLOCK];
  double s = 0.0, s2 = 0.0;
  for (u32 i = threadIdx.x; i < np; i += GK_BLOCK) {
    s += part[2 * i];
    s2 += part[2 * i + 1];
  }
  s = gk_block_sum(s, sh);
  s2 = gk_block_sum(s2, sh);
  if (threadIdx.x == 0) {
    if (n == 0) {
      out[0] = 0.0;
      out[1] = 0.0;
    } else {
      double nn = (double)n;
      double mean = s / nn;
      double var = s2 / nn - mean * mean;
      out[0] = mean;
      out[1] = sqrt(var > 0.0 ? var : 0.0);
    }
  }
}

// part[b] = Σ(e + x)² (x zero past nx) of block b's share of the ne elements.
GK_KERNEL void gk_sumsq_sum(const float* x, u32 nx, const float* e, u32 ne, double* part) {
  __shared__ double sh[GK_BLOCK];
  double s2 = 0.0;
  for (u32 i = blockIdx.x * GK_BLOCK + threadIdx.x; i < ne; i += gridDim.x * GK_BLOCK) {
    float c = e[i] + (i < nx ? x[i] : 0.0f);
    s2 += (double)c * (double)c;
  }
  s2 = gk_block_sum(s2, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s2;
}

// One block: *s = √(Σ part / len) as f32 (the RMS scale of onebit.rs).
GK_KERNEL void gk_scale_final(const double* part, u32 np, u32 len, float* s) {
  __shared__ double sh[GK_BLOCK];
  double a = 0.0;
  for (u32 i = threadIdx.x; i < np; i += GK_BLOCK) a += part[i];
  a = gk_block_sum(a, sh);
  if (threadIdx.x == 0) *s = len == 0 ? 0.0f : (float)sqrt(a / (double)len);
}

// ---- 1-bit: pack with error feedback, unpack ----------------------------------------------

// `c − (±s)`, the sign from c (the CPU's `feedback`).
GK_DEVICE float gk_feedback(float c, float s, bool pos) { return c - (pos ? s : -s); }

// Worker compressor, pass 2: per byte B, c = e + x (x zero past nx), its sign bits MSB-first,
// e ← c − s·sign(c), with s read from the device (*sp).
GK_KERNEL void gk_onebit_compress(const float* x, u32 nx, float* e, u32 nbytes, u8* bits,
                                  const float* sp) {
  float s = *sp;
  for (u32 b = blockIdx.x * GK_BLOCK + threadIdx.x; b < nbytes; b += gridDim.x * GK_BLOCK) {
    u32 w = 0;
    for (u32 j = 0; j < 8; j++) {
      u32 i = 8 * b + j;
      float c = e[i] + (i < nx ? x[i] : 0.0f);
      bool pos = GK_NONNEG(c);
      e[i] = gk_feedback(c, s, pos);
      w |= (pos ? 1u : 0u) << (7 - j);
    }
    bits[b] = (u8)w;
  }
}

// The deferred compressor in one pass: c = (e − due·sign(e)) + x, written to e, its sign
// bits, and part[b] = Σc² of block b's share (then gk_scale_final gives the scale).
GK_KERNEL void gk_onebit_deferred(const float* x, u32 nx, float* e, u32 nbytes, u8* bits,
                                  float due, double* part) {
  __shared__ double sh[GK_BLOCK];
  double s2 = 0.0;
  for (u32 b = blockIdx.x * GK_BLOCK + threadIdx.x; b < nbytes; b += gridDim.x * GK_BLOCK) {
    u32 w = 0;
    for (u32 j = 0; j < 8; j++) {
      u32 i = 8 * b + j;
      float v = e[i];
      float c = gk_feedback(v, due, GK_NONNEG(v)) + (i < nx ? x[i] : 0.0f);
      e[i] = c;
      w |= (GK_NONNEG(c) ? 1u : 0u) << (7 - j);
      s2 += (double)c * (double)c;
    }
    bits[b] = (u8)w;
  }
  s2 = gk_block_sum(s2, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s2;
}

// The server stage in one pass (onebit::server_sum_deferred): for element i, z = 0.0 plus
// ±s_m of each of the p messages in message order (message m's bytes at msgs + m·stride),
// c = z + (err − due·sign(err)), written to err, its sign bits into out, and part[b] = Σc²
// of block b's share.
GK_KERNEL void gk_onebit_server(const u8* msgs, u32 stride, const float* scales, u32 p,
                                float* err, u32 nbytes, u8* out, float due, double* part) {
  __shared__ double sh[GK_BLOCK];
  double s2 = 0.0;
  for (u32 b = blockIdx.x * GK_BLOCK + threadIdx.x; b < nbytes; b += gridDim.x * GK_BLOCK) {
    u32 w = 0;
    for (u32 j = 0; j < 8; j++) {
      u32 i = 8 * b + j;
      float z = 0.0f;
      for (u32 m = 0; m < p; m++) {
        float s = scales[m];
        z += ((msgs[m * stride + b] >> (7 - j)) & 1u) ? s : -s;
      }
      float v = err[i];
      float c = z + gk_feedback(v, due, GK_NONNEG(v));
      err[i] = c;
      w |= (GK_NONNEG(c) ? 1u : 0u) << (7 - j);
      s2 += (double)c * (double)c;
    }
    out[b] = (u8)w;
  }
  s2 = gk_block_sum(s2, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s2;
}

// One block: *out = Σ part (f64).
GK_KERNEL void gk_sum_final(const double* part, u32 np, double* out) {
  __shared__ double sh[GK_BLOCK];
  double a = 0.0;
  for (u32 i = threadIdx.x; i < np; i += GK_BLOCK) a += part[i];
  a = gk_block_sum(a, sh);
  if (threadIdx.x == 0) *out = a;
}

// pack_and_feedback for a given scale: bits of buf, buf ← buf − s·sign(buf).
GK_KERNEL void gk_onebit_pack(float* buf, u32 nbytes, u8* bits, float s) {
  for (u32 b = blockIdx.x * GK_BLOCK + threadIdx.x; b < nbytes; b += gridDim.x * GK_BLOCK) {
    u32 w = 0;
    for (u32 j = 0; j < 8; j++) {
      u32 i = 8 * b + j;
      float c = buf[i];
      bool pos = GK_NONNEG(c);
      buf[i] = gk_feedback(c, s, pos);
      w |= (pos ? 1u : 0u) << (7 - j);
    }
    bits[b] = (u8)w;
  }
}

// out[i] = ±s from bit i (MSB-first), or out[i] += ±s when add is 1.
GK_KERNEL void gk_onebit_unpack(const u8* bits, float s, float* out, u32 n, u32 add) {
  for (u32 i = blockIdx.x * GK_BLOCK + threadIdx.x; i < n; i += gridDim.x * GK_BLOCK) {
    bool one = (bits[i >> 3] >> (7 - (i & 7))) & 1u;
    float v = one ? s : -s;
    out[i] = add ? out[i] + v : v;
  }
}

// ---- gather, scatter-add -----------------------------------------------------------------

GK_KERNEL void gk_gather(const float* x, const u32* idx, u32 m, float* out) {
  for (u32 j = blockIdx.x * GK_BLOCK + threadIdx.x; j < m; j += gridDim.x * GK_BLOCK) {
    out[j] = x[idx[j]];
  }
}

// dense[idx[j]] += val[j]. With repeated indices the additions happen in an unspecified
// order (the CPU adds in list order): equal for distinct indices, else up to rounding.
GK_KERNEL void gk_scatter_add(float* dense, const u32* idx, const float* val, u32 m) {
  for (u32 j = blockIdx.x * GK_BLOCK + threadIdx.x; j < m; j += gridDim.x * GK_BLOCK) {
    atomicAdd(&dense[idx[j]], val[j]);
  }
}

// ---- error feedback on resident data (the device seam, resident.rs) ------------------------

// a[i] += b[i]: the accumulator acc = residual + g, in the residual's memory.
GK_KERNEL void gk_add(float* a, const float* b, u32 n) {
  for (u32 i = blockIdx.x * GK_BLOCK + threadIdx.x; i < n; i += gridDim.x * GK_BLOCK) {
    a[i] = a[i] + b[i];
  }
}

// x[idx[j]] = +0: the entries that leave the residual (distinct indices).
GK_KERNEL void gk_zero_at(float* x, const u32* idx, u32 m) {
  for (u32 j = blockIdx.x * GK_BLOCK + threadIdx.x; j < m; j += gridDim.x * GK_BLOCK) {
    x[idx[j]] = 0.0f;
  }
}

// ---- the fp16 wire: IEEE binary16 as the `half` crate converts (its portable path) ----------

GK_DEVICE u16 gk_f32_to_f16(float v) {
  u32 x = __float_as_uint(v);
  u32 sign = x & 0x80000000u, exp = x & 0x7f800000u, man = x & 0x007fffffu;
  if (exp == 0x7f800000u) {
    u32 nan_bit = man == 0 ? 0u : 0x0200u;
    return (u16)((sign >> 16) | 0x7c00u | nan_bit | (man >> 13));
  }
  u32 hs = sign >> 16;
  int he = (int)(exp >> 23) - 127 + 15;
  if (he >= 0x1f) return (u16)(hs | 0x7c00u);
  if (he <= 0) {
    if (14 - he > 24) return (u16)hs;
    u32 m = man | 0x00800000u;
    u32 hm = m >> (14 - he);
    u32 rb = 1u << (13 - he);
    if ((m & rb) != 0 && (m & (3 * rb - 1)) != 0) hm += 1;
    return (u16)(hs | hm);
  }
  u32 h = hs | ((u32)he << 10) | (man >> 13);
  u32 rb = 0x1000u;
  if ((man & rb) != 0 && (man & (3 * rb - 1)) != 0) h += 1;
  return (u16)h;
}

GK_DEVICE float gk_f16_to_f32(u16 i) {
  if ((i & 0x7fffu) == 0) return __uint_as_float((u32)i << 16);
  u32 hs = i & 0x8000u, he = i & 0x7c00u, hm = i & 0x03ffu;
  if (he == 0x7c00u) {
    return __uint_as_float(hm == 0 ? ((hs << 16) | 0x7f800000u)
                                   : ((hs << 16) | 0x7fc00000u | (hm << 13)));
  }
  u32 sign = hs << 16;
  if (he == 0) {
    u32 e = 0;  // leading zeros of the 10-bit mantissa within 16 bits, minus 6
    while (((hm << e) & 0x0200u) == 0) e++;
    u32 ex = (127 - 15 - e) << 23;
    u32 m = (hm << (14 + e)) & 0x7fffffu;
    return __uint_as_float(sign | ex | m);
  }
  u32 ex = (u32)((int)(he >> 10) - 15 + 127) << 23;
  return __uint_as_float(sign | ex | (hm << 13));
}

GK_KERNEL void gk_to_f16(const float* x, u32 n, u16* out) {
  for (u32 i = blockIdx.x * GK_BLOCK + threadIdx.x; i < n; i += gridDim.x * GK_BLOCK) {
    out[i] = gk_f32_to_f16(x[i]);
  }
}

GK_KERNEL void gk_from_f16(const u16* h, u32 n, float* out) {
  for (u32 i = blockIdx.x * GK_BLOCK + threadIdx.x; i < n; i += gridDim.x * GK_BLOCK) {
    out[i] = gk_f16_to_f32(h[i]);
  }
}

// Every kernel, for the emulator's launch table (exec.rs has the same list).
#define GK_KERNELS(X)                                                                    \
  X(gk_count) X(gk_scan) X(gk_compact) X(gk_radix_hist) X(gk_radix_pick)                 \
  X(gk_moments_part) X(gk_moments_final) X(gk_sumsq_sum) X(gk_scale_final)               \
  X(gk_onebit_compress) X(gk_onebit_deferred) X(gk_onebit_server) X(gk_sum_final)        \
  X(gk_onebit_pack) X(gk_onebit_unpack)                                                  \
  X(gk_gather) X(gk_scatter_add) X(gk_to_f16) X(gk_from_f16) X(gk_add) X(gk_zero_at)
