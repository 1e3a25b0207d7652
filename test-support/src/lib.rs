//! `kvcore-test-support`: what kvcore's tests, fuzz targets and benches share, kept out
//! of the core crate's public API.
//!
//! - [`kv_diff`]: the differential checker of the KV stores ([`kv_diff::SpecKv`], the
//!   specification store, and [`kv_diff::run`]), for the property tests and the
//!   `kv_growth` and `kv_window` fuzz targets; and the store conformance suite, which
//!   any store, kvcore's or not, runs with one [`kv_store_suite!`] invocation;
//! - [`pool_diff`]: the differential checker of the paged KV pool (many sequences, forks,
//!   the prefix cache, the budget) against one dense store per sequence, with the pool's
//!   books audited, for the property tests and the `kv_pool` fuzz target;
//! - [`tiny`]: tiny random Llama models as in-memory GGUF files;
//! - [`faults`]: fault injection (a backend that fails its `k`-th kernel call, an
//!   allocation gate that refuses the `k`-th allocation);
//! - [`conformance`]: the backend conformance suite, which any backend runs with one
//!   [`conformance_suite!`] invocation in its tests;
//! - [`session`]: snapshots of sessions and consistent edits of session files.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod conformance;
pub mod faults;
pub mod kv_diff;
pub mod pool_diff;
pub mod session;
pub mod tiny;
