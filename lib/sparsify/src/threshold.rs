//! Threshold selection: keep every entry with `|x| > th` (strict, as Ok-Topk's reference code
//! does; Ok-Topk §3.1.3). Hard-threshold sparsification (DEFT Table 1) is this with a fixed th.

use rayon::prelude::*;

use crate::topk::CHUNK;

/// All indices with |x| > th, ascending.
pub fn above(x: &[f32], th: f32) -> Vec<u32> {
    if x.len() < 2 * CHUNK {
        return above_seq(x, th, 0);
    }
    let parts: Vec<Vec<u32>> = x
        .par_chunks(CHUNK)
        .enumerate()
        .map(|(ci, c)| above_seq(c, th, (ci * CHUNK) as u32))
        .collect();
    parts.concat()
}

/// The number of entries with |x| > th.
pub fn count_above(x: &[f32], th: f32) -> usize {
    let count = |c: &[f32]| c.iter().filter(|v| v.abs() > th).count();
    if x.len() < 2 * CHUNK {
        return count(x);
    }
    x.par_chunks(CHUNK).map(count).sum()
}

/// Keeps the positions of `positions` (ascending) with |x| > th.
pub fn refine(x: &[f32], positions: &[u32], th: f32) -> Vec<u32> {
    positions
        .iter()
        .copied()
        .filter(|&i| x[i as usize].abs() > th)
        .collect()
}

fn above_seq(x: &[f32], th: f32, base: u32) -> Vec<u32> {
    let mut v = Vec::new();
    crate::topk::scan_mask(x, base, |e| e.abs() > th, |i, _| v.push(i));
    v
}
