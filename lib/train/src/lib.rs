//! gradkit-train
