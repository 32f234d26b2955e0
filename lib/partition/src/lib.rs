//! gradkit-partition: who works on which part of the gradient.
//!
//! DEFT's layer partitioning, norm-based k allocation and bin-packing ([`deft`], DEFT §3),
//! and Ok-Topk's balanced space partition ([`oktopk`], Ok-Topk §3.1.1 Step B). Plans are
//! plain data (`plan/1` rows), checked by the one validator every consumer uses ([`plan`]);
//! nothing here communicates.

pub mod deft;
pub mod oktopk;
pub mod plan;
