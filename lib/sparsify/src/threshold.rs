//! Threshold selection: keep every entry with `|x| > th` (strict, as Ok-Topk's code does).

/// All indices with |x| > th, ascending.
pub fn above(x: &[f32], th: f32) -> Vec<u32> {
    x.iter()
        .enumerate()
        .filter(|(_, v)| v.abs() > th)
        .map(|(i, _)| i as u32)
        .collect()
}
