//! gradkit-collectives
