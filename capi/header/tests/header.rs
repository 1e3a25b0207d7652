//! The committed header is what cbindgen generates from kvcore-capi's source now: any
//! change to the exported API must come with the regenerated `capi/include/kvcore.h`.
//! Run with `KVCORE_BLESS=1` to rewrite it.

use std::path::Path;

#[test]
fn committed_header_matches_the_source() {
    // This crate lives in capi/header; the C ABI crate is its parent directory.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("capi/");
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("UTF-8 header");
    let path = dir.join("include/kvcore.h");
    if std::env::var_os("KVCORE_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write include/kvcore.h");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "capi/include/kvcore.h is out of date with capi/src/lib.rs: regenerate it with \
         `KVCORE_BLESS=1 cargo test -p kvcore-capi-header --release --test header` and commit it"
    );
}
