//! kvcore-scalar (in progress)
