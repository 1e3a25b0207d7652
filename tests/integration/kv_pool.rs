//! The paged KV pool against one `DenseKv` per sequence, bit for bit, with its books
//! audited after every op (`kvcore_test_support::pool_diff`): appends (committed, rolled
//! back, failed part-way), tail replacements, truncations, forks, frees, publishing to
//! the prefix cache and finding prefixes again, eviction, budgets and refused
//! allocations, over every element type.

use kvcore_test_support::pool_diff::{PoolScenario, run};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn pool_matches_dense_per_sequence(bytes in proptest::collection::vec(any::<u8>(), 0..1200)) {
        let scenario = PoolScenario::from_bytes(&bytes).unwrap();
        if let Err(d) = run(&scenario) {
            prop_assert!(false, "{d}");
        }
    }
}
