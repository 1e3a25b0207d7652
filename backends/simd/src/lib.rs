//! kvcore-simd (in progress)
