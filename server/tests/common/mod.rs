//! Shared by the server's tests that check bodies without a model.

use kvcore_server::api::Limits;

/// SmolLM2's shape in a small server: 512 positions, 64 MiB of blocks of 64.
pub const LIMITS: Limits = Limits {
    ctx: 512,
    kv_budget: 64 << 20,
    block_len: 64,
    block_bytes: 2_949_120,
    vocab: 49_152,
};
