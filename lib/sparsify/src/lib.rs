//! gradkit-sparsify
