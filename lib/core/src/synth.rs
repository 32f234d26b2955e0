//! Synthetic gradient traces (filled in with `gradtrace synthetic`).
