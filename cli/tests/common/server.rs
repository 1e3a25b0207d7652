//! A `kvcore serve` process for one test, on a loopback port the OS picks, and a small
//! blocking HTTP client (ureq) for it: whole JSON bodies, server-sent event streams,
//! the Prometheus metrics.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// A running server; killed when dropped (unless it already exited).
pub struct Server {
    pub child: Child,
    pub url: String,
    /// Everything it printed on stderr so far.
    pub log: Arc<Mutex<String>>,
}

impl Server {
    /// `kvcore serve SMOLLM2 --port 0 --backend rayon -t 2 extra…`, once it listens.
    pub fn start(extra: &[&str]) -> Server {
        let model = super::smollm2();
        let args = [
            "serve",
            &model,
            "--port",
            "0",
            "--backend",
            "rayon",
            "-t",
            "2",
        ];
        let mut child = super::spawn_kvcore(args.iter().chain(extra), Stdio::null(), Stdio::null());
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Some(at) = line.find("listening on http://") {
                        let _ = tx.send(line[at + "listening on ".len()..].trim().to_string());
                    }
                    let mut l = log.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
            });
        }
        let url = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                panic!("kvcore serve did not start: {}", log.lock().unwrap());
            }
        };
        Server { child, url, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `GET path`: status and body text.
    pub fn get(&self, path: &str) -> (u16, String) {
        let r = ureq::get(&format!("{}{path}", self.url)).call();
        let resp = response(r);
        (resp.status(), resp.into_string().expect("a text body"))
    }

    /// `POST path` with a raw body: status, `Retry-After`, and the body as JSON.
    pub fn post_raw(&self, path: &str, body: &str) -> (u16, Option<String>, Value) {
        let r = ureq::post(&format!("{}{path}", self.url))
            .set("Content-Type", "application/json")
            .send_string(body);
        let resp = response(r);
        let status = resp.status();
        let retry = resp.header("Retry-After").map(str::to_string);
        let text = resp.into_string().expect("a text body");
        let json =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("a JSON body ({e}): {text:?}"));
        (status, retry, json)
    }

    /// `POST path` with a JSON body.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let (status, _, json) = self.post_raw(path, &body.to_string());
        (status, json)
    }

    /// Opens a streamed request (`"stream": true` in `body`); read it with [`Stream`].
    pub fn stream(&self, path: &str, body: &Value) -> Result<Stream, (u16, Option<String>, Value)> {
        let r = ureq::post(&format!("{}{path}", self.url))
            .set("Content-Type", "application/json")
            .send_string(&body.to_string());
        let resp = response(r);
        let status = resp.status();
        if status != 200 {
            let retry = resp.header("Retry-After").map(str::to_string);
            let text = resp.into_string().expect("a text body");
            return Err((
                status,
                retry,
                serde_json::from_str(&text).expect("a JSON error"),
            ));
        }
        assert_eq!(
            resp.header("Content-Type"),
            Some("text/event-stream"),
            "a stream's content type"
        );
        Ok(Stream {
            reader: BufReader::new(Box::new(resp.into_reader())),
        })
    }

    /// The value of metric `name` (a line `name value`).
    pub fn metric(&self, name: &str) -> f64 {
        let (status, text) = self.get("/metrics");
        assert_eq!(status, 200);
        metric(&text, name)
    }

    /// Polls until `cond(metrics text)` or `timeout`; whether it held.
    pub fn wait_metrics(&self, timeout: Duration, cond: impl Fn(&str) -> bool) -> bool {
        let start = Instant::now();
        loop {
            let (_, text) = self.get("/metrics");
            if cond(&text) {
                return true;
            }
            if start.elapsed() > timeout {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Polls for up to 10 s until no sequence runs and no KV block is in use (what a
    /// finished or cancelled request leaves, the prefix cache aside); whether it came.
    pub fn wait_freed(&self) -> bool {
        self.wait_metrics(Duration::from_secs(10), |m| {
            metric(m, "kvcore_running_sequences") == 0.0
                && metric(m, "kvcore_kv_pool_blocks_in_use") == 0.0
        })
    }

    /// Resident set size now and at its peak, bytes (Linux `/proc`).
    pub fn rss(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("/proc/PID/status");
        let kb = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map_or(0, |k| k * 1024)
        };
        (kb("VmRSS:"), kb("VmHWM:"))
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(ok.success());
    }

    /// Waits up to `timeout` for the process to exit; its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status.code().unwrap_or(-1));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The value of metric `name` in a Prometheus text body.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no metric {name} in {text}"))
        .trim()
        .parse()
        .expect("a number")
}

fn response(r: Result<ureq::Response, ureq::Error>) -> ureq::Response {
    match r {
        Ok(resp) => resp,
        Err(ureq::Error::Status(_, resp)) => resp,
        Err(e) => panic!("HTTP transport error: {e}"),
    }
}

/// A server-sent event stream, read event by event.
pub struct Stream {
    reader: BufReader<Box<dyn Read + Send + Sync>>,
}

impl Stream {
    /// The next event's data (`None` at the end of the body); `[DONE]` is returned as
    /// the string `"[DONE]"`. Comments (keep-alives) are skipped.
    pub fn next_data(&mut self) -> Option<String> {
        let mut data = None;
        loop {
            let mut line = String::new();
            let n = self.reader.read_line(&mut line).expect("read the stream");
            if n == 0 {
                return data;
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if data.is_some() {
                    return data;
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let payload = line
                .strip_prefix("data:")
                .unwrap_or_else(|| panic!("not a data line: {line:?}"))
                .trim_start();
            data = Some(payload.to_string());
        }
    }

    /// Reads to the end: every chunk's JSON (before `[DONE]`) and whether `[DONE]` came.
    pub fn read_all(&mut self) -> (Vec<Value>, bool) {
        let mut chunks = Vec::new();
        while let Some(d) = self.next_data() {
            if d == "[DONE]" {
                assert!(self.next_data().is_none(), "events after [DONE]");
                return (chunks, true);
            }
            chunks.push(serde_json::from_str(&d).unwrap_or_else(|e| panic!("chunk {d:?}: {e}")));
        }
        (chunks, false)
    }
}

/// The text of a stream's chunks (chat deltas or completion texts), checking each is a
/// well-formed chunk of `object` with one choice, that only the last has a finish
/// reason, and returning it.
pub fn stream_text(chunks: &[Value], object: &str) -> (String, String) {
    let mut text = String::new();
    let mut finish = None;
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(c["object"], object, "chunk {i}: {c}");
        assert!(
            c["id"].as_str().is_some_and(|s| !s.is_empty()),
            "chunk {i} id"
        );
        assert!(c["created"].as_u64().is_some(), "chunk {i} created");
        let choices = c["choices"].as_array().expect("choices");
        if choices.is_empty() {
            assert!(
                c["usage"].is_object(),
                "a chunk without choices is the usage chunk"
            );
            continue;
        }
        assert_eq!(choices.len(), 1, "chunk {i}");
        let ch = &choices[0];
        assert!(finish.is_none(), "chunk {i} after the finish reason: {c}");
        let piece = if object == "chat.completion.chunk" {
            ch["delta"]["content"].as_str().unwrap_or("")
        } else {
            ch["text"].as_str().expect("text")
        };
        text.push_str(piece);
        if let Some(f) = ch["finish_reason"].as_str() {
            finish = Some(f.to_string());
        }
    }
    (text, finish.expect("a chunk with a finish reason"))
}
