//! gradkit-sparsify: gradient selection (sparsification) methods and error feedback.
//!
//! Every method of the papers lives in its own module, named after the paper, with the
//! section it implements cited in its doc comment. Selection works on `&[f32]` slices
//! (the flat, error-compensated accumulator of one rank) and returns strictly ascending
//! `u32` indices. This crate knows nothing of communication or files.

pub mod threshold;
pub mod topk;
