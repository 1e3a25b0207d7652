//! `kvcore-test-support`: what kvcore's tests, fuzz targets and benches share, kept out
//! of the core crate's public API.
//!
//! - [`kv_diff`]: the differential checker of the KV stores ([`kv_diff::SpecKv`], the
//!   specification store, and [`kv_diff::run`]), for the property tests and the
//!   `kv_growth` fuzz target, and for anyone writing a store of their own;
//! - [`session`]: snapshots of sessions and consistent edits of session files;
//! - [`tiny`]: tiny random Llama models as in-memory GGUF files.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod kv_diff;
pub mod session;
pub mod tiny;
