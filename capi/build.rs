//! The shared library's SONAME carries the version, `libkvcore_c.so.MAJOR.MINOR`: there is
//! no ABI promise before 1.0, so every minor release is a new ABI.
fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_default();
    let minor = std::env::var("CARGO_PKG_VERSION_MINOR").unwrap_or_default();
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libkvcore_c.so.{major}.{minor}");
    }
}
