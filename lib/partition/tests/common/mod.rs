//! The partition tests' generator: gradkit-testkit's seeded one, run as xorshift64* from the
//! raw seed (`Rng::xorshift64star(seed)`), the stream these tests' data were made with.

#![allow(dead_code)] // each test file uses its own subset

pub use gradkit_testkit::rng::Rng;
