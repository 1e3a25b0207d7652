//! Fuzz target `session_load`: arbitrary bytes restored as a session file for a tiny
//! model, as they are and with the fingerprint and checksum fixed up; any error must
//! leave the session unchanged, any success must write back to the same bytes (the
//! check is `fuzz/checks/session_load.rs`, shared with `tests/integration/fuzz_corpus_replay.rs`).

#![no_main]

#[path = "../checks/session_load.rs"]
mod check;

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;

fn fixture() -> &'static check::Fixture {
    static FIXTURE: OnceLock<check::Fixture> = OnceLock::new();
    FIXTURE.get_or_init(check::Fixture::build)
}

fuzz_target!(|data: &[u8]| check::check_session_load(data, fixture()));
