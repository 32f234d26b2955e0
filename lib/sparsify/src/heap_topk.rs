//! Top-k by magnitude with a size-k min-heap: the textbook n·log k selection that DEFT's
//! cost model (Eq. 6: a top-k over m elements costs m·log2 k) assumes. gradkit selects with
//! [`crate::topk`] (about two streaming passes, nearly independent of k); this one exists to
//! measure the model's assumption beside it (`examples/bench_topk_heap.rs`), not to be used.
//!
//! One pass in index order keeps the k best entries seen so far, ordered by (|x|, lower index
//! first) exactly as [`crate::topk::topk_indices`], so both give the same set. An entry enters
//! the heap only if it beats the current k-th best, so on data in random order the heap is
//! touched about k·ln(n/k) times and the pass costs ≈ n comparisons; n·log k is its worst
//! case (magnitudes ascending along the index).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::topk::key;

/// Exactly min(k, n) indices of largest |x|, ties to the lower index; returned ascending.
pub fn topk_heap(x: &[f32], k: usize) -> Vec<u32> {
    let k = k.min(x.len());
    if k == 0 {
        return Vec::new();
    }
    // Root = the worst kept entry: the smallest magnitude, among equal ones the highest index.
    let mut heap: BinaryHeap<Reverse<(u32, Reverse<u32>)>> = BinaryHeap::with_capacity(k);
    for (i, &v) in x.iter().enumerate() {
        let e = (key(v), Reverse(i as u32));
        if heap.len() < k {
            heap.push(Reverse(e));
        } else if let Some(mut root) = heap.peek_mut() {
            // Later indices lose ties, so only a strictly larger magnitude enters.
            if e.0 > (root.0).0 {
                *root = Reverse(e);
            }
        }
    }
    let mut out: Vec<u32> = heap.into_iter().map(|Reverse((_, Reverse(i)))| i).collect();
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: sort every index by (|x| descending, index ascending), keep k.
    fn reference(x: &[f32], k: usize) -> Vec<u32> {
        let mut idx: Vec<u32> = (0..x.len() as u32).collect();
        idx.sort_by(|&a, &b| key(x[b as usize]).cmp(&key(x[a as usize])).then(a.cmp(&b)));
        idx.truncate(k.min(x.len()));
        idx.sort_unstable();
        idx
    }

    #[test]
    fn equals_the_definition_and_gradkits_top_k() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for n in [0usize, 1, 2, 7, 100, 1000, 70_000] {
            // Few distinct magnitudes (ties everywhere), signs and zeros mixed in.
            let x: Vec<f32> = (0..n)
                .map(|_| {
                    let r = next();
                    let m = (r % 17) as f32 * 0.25;
                    if r & (1 << 20) != 0 {
                        -m
                    } else {
                        m
                    }
                })
                .collect();
            for k in [0usize, 1, 3, n / 10, n / 2, n.saturating_sub(1), n, n + 5] {
                let want = reference(&x, k);
                assert_eq!(topk_heap(&x, k), want, "n={n} k={k}");
                assert_eq!(crate::topk::topk_indices(&x, k), want, "n={n} k={k}");
            }
        }
    }

    #[test]
    fn ascending_magnitudes_replace_the_root_every_time() {
        // The worst case: every new entry beats the k-th best so far.
        let x: Vec<f32> = (0..500).map(|i| i as f32).collect();
        assert_eq!(topk_heap(&x, 10), (490..500).collect::<Vec<u32>>());
        let y: Vec<f32> = x.iter().rev().copied().collect();
        assert_eq!(topk_heap(&y, 10), (0..10).collect::<Vec<u32>>());
    }
}
