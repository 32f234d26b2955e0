//! Threshold selection: keep every entry with `|x| > th` (strict, as Ok-Topk's reference code
//! does; Ok-Topk §3.1.3). Hard-threshold sparsification (DEFT Table 1) is this with a fixed th.
//!
//! Every pass here is one streaming read of x: the predicate is evaluated 32 lanes at a time
//! into a bit mask (SSE2 compare + movemask on x86-64), blocks without a hit cost one test, and
//! hits are appended with unchecked writes into per-chunk buffers whose capacity is reserved
//! per block. Chunks of [`CHUNK`] elements run on rayon threads (one thread below two chunks)
//! and their outputs are concatenated in index order, so results are ascending and
//! independent of the thread count.

use rayon::prelude::*;

/// Elements per parallel chunk of a selection pass (large, so that per-chunk buffers and
/// task overheads stay small next to the streaming read).
pub(crate) const CHUNK: usize = 1 << 18;

/// All indices with |x| > th, ascending.
pub fn above(x: &[f32], th: f32) -> Vec<u32> {
    collect::<_, false>(x, &AbsGt(th)).0
}

/// All indices with |x| > th, ascending, with their values `x[i]` (one pass; no gather).
pub fn above_with_values(x: &[f32], th: f32) -> (Vec<u32>, Vec<f32>) {
    collect::<_, true>(x, &AbsGt(th))
}

/// The number of entries with |x| > th.
pub fn count_above(x: &[f32], th: f32) -> usize {
    let p = AbsGt(th);
    let count = |c: &[f32]| {
        let mut blocks = c.chunks_exact(32);
        let mut n = 0usize;
        for b in &mut blocks {
            n += p.mask32(b).count_ones() as usize;
        }
        n + blocks.remainder().iter().filter(|v| p.test(**v)).count()
    };
    if x.len() < 2 * CHUNK {
        return count(x);
    }
    x.par_chunks(CHUNK).map(count).sum()
}

/// Keeps the (index, value) pairs with |value| > th, in place and in order.
pub(crate) fn refine_values(idx: &mut Vec<u32>, val: &mut Vec<f32>, th: f32) {
    let mut w = 0;
    for r in 0..idx.len() {
        let v = val[r];
        if v.abs() > th {
            idx[w] = idx[r];
            val[w] = v;
            w += 1;
        }
    }
    idx.truncate(w);
    val.truncate(w);
}

/// A per-element predicate with a 32-lane mask form.
pub(crate) trait Lanes: Sync {
    fn test(&self, v: f32) -> bool;
    /// Bit j set iff `test(b[j])`; `b.len() == 32`.
    fn mask32(&self, b: &[f32]) -> u32;
}

/// `|v| > th` (float comparison: NaN never passes).
pub(crate) struct AbsGt(pub f32);

impl Lanes for AbsGt {
    #[inline(always)]
    fn test(&self, v: f32) -> bool {
        v.abs() > self.0
    }
    #[inline(always)]
    fn mask32(&self, b: &[f32]) -> u32 {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::*;
            assert!(b.len() >= 32);
            // SAFETY: SSE2 is part of x86-64; the loads read b[0..32], checked above.
            unsafe {
                let t = _mm_set1_ps(self.0);
                let am = _mm_castsi128_ps(_mm_set1_epi32(0x7fff_ffff));
                let p = b.as_ptr();
                let mut m = 0u32;
                for g in 0..8 {
                    let v = _mm_and_ps(_mm_loadu_ps(p.add(4 * g)), am);
                    m |= (_mm_movemask_ps(_mm_cmpgt_ps(v, t)) as u32) << (4 * g);
                }
                m
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let mut m = 0u32;
            for (j, v) in b[..32].iter().enumerate() {
                m |= (self.test(*v) as u32) << j;
            }
            m
        }
    }
}

/// The magnitude key every selection orders by: `|v|`'s bits, so that the integer order is the
/// order of |v| (NaN above +inf).
#[inline]
pub(crate) fn key(v: f32) -> u32 {
    v.to_bits() & 0x7fff_ffff
}

/// `key(v) >= lo` with `key = bits & 0x7fff_ffff` (orders every |v|; NaN above +inf).
pub(crate) struct KeyGe(pub u32);

impl Lanes for KeyGe {
    #[inline(always)]
    fn test(&self, v: f32) -> bool {
        key(v) >= self.0
    }
    #[inline(always)]
    fn mask32(&self, b: &[f32]) -> u32 {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::*;
            assert!(b.len() >= 32);
            // Keys and lo are ≤ 0x7fff_ffff, so a signed compare against lo − 1 is exact (lo = 0
            // gives −1, which every key exceeds).
            // SAFETY: SSE2 is part of x86-64; the loads read b[0..32], checked above.
            unsafe {
                let t = _mm_set1_epi32((self.0 as i32).wrapping_sub(1));
                let am = _mm_set1_epi32(0x7fff_ffff);
                let p = b.as_ptr() as *const __m128i;
                let mut m = 0u32;
                for g in 0..8 {
                    let v = _mm_and_si128(_mm_loadu_si128(p.add(g)), am);
                    let c = _mm_castsi128_ps(_mm_cmpgt_epi32(v, t));
                    m |= (_mm_movemask_ps(c) as u32) << (4 * g);
                }
                m
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let mut m = 0u32;
            for (j, v) in b[..32].iter().enumerate() {
                m |= (self.test(*v) as u32) << j;
            }
            m
        }
    }
}

/// Ascending positions with `p.test(x[i])` and, when `VALUES`, their values (else empty).
pub(crate) fn collect<P: Lanes, const VALUES: bool>(x: &[f32], p: &P) -> (Vec<u32>, Vec<f32>) {
    if x.len() < 2 * CHUNK {
        let (mut idx, mut val) = (Vec::new(), Vec::new());
        scan_into::<P, VALUES>(x, 0, p, &mut idx, &mut val);
        return (idx, val);
    }
    let parts: Vec<(Vec<u32>, Vec<f32>)> = x
        .par_chunks(CHUNK)
        .enumerate()
        .map(|(ci, c)| {
            let (mut idx, mut val) = (Vec::new(), Vec::new());
            scan_into::<P, VALUES>(c, (ci * CHUNK) as u32, p, &mut idx, &mut val);
            (idx, val)
        })
        .collect();
    concat(parts)
}

/// Concatenates per-chunk outputs in order.
pub(crate) fn concat(parts: Vec<(Vec<u32>, Vec<f32>)>) -> (Vec<u32>, Vec<f32>) {
    if parts.len() == 1 {
        return parts.into_iter().next().expect("one part");
    }
    let total: usize = parts.iter().map(|p| p.0.len()).sum();
    let vtotal: usize = parts.iter().map(|p| p.1.len()).sum();
    let (mut idx, mut val) = (Vec::with_capacity(total), Vec::with_capacity(vtotal));
    for (i, v) in parts {
        idx.extend_from_slice(&i);
        val.extend_from_slice(&v);
    }
    (idx, val)
}

/// Appends `base + j` (and `c[j]` when `VALUES`) for every j with `p.test(c[j])`, in order.
#[inline(always)]
pub(crate) fn scan_into<P: Lanes, const VALUES: bool>(
    c: &[f32],
    base: u32,
    p: &P,
    idx: &mut Vec<u32>,
    val: &mut Vec<f32>,
) {
    let guess = c.len() / 64 + 32;
    idx.reserve(guess);
    if VALUES {
        val.reserve(guess);
    }
    let mut blocks = c.chunks_exact(32);
    let mut off = base;
    for b in &mut blocks {
        let mut m = p.mask32(b);
        if m != 0 {
            idx.reserve(32);
            if VALUES {
                val.reserve(32);
            }
            let mut len = idx.len();
            let (pi, pv) = (idx.as_mut_ptr(), val.as_mut_ptr());
            while m != 0 {
                let j = m.trailing_zeros();
                // SAFETY: at most 32 writes after a reserve of 32 (in both vectors when
                // VALUES); j < 32 = b.len(); the lengths are set to the written prefix below.
                unsafe {
                    *pi.add(len) = off + j;
                    if VALUES {
                        *pv.add(len) = *b.get_unchecked(j as usize);
                    }
                }
                len += 1;
                m &= m - 1;
            }
            // SAFETY: every slot below len was written above or before.
            unsafe {
                idx.set_len(len);
                if VALUES {
                    val.set_len(len);
                }
            }
        }
        off += 32;
    }
    for (j, v) in blocks.remainder().iter().enumerate() {
        if p.test(*v) {
            idx.push(off + j as u32);
            if VALUES {
                val.push(*v);
            }
        }
    }
}
