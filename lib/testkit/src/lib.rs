//! gradkit-testkit: what the tools' tests share (a dev-dependency only, never linked into a
//! tool): running a built binary as a user would and checking how it refused, and the plan/1
//! fixtures every plan consumer must treat alike.

pub mod cli;
pub mod mpi;
pub mod plans;
pub mod rng;
pub mod traces;
