//! Nothing but a home for `tests/header.rs`, the drift check of `capi/include/kvcore.h`.
