//! kvcore-rayon (in progress)
