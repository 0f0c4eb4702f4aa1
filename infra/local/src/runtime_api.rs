//! A Lambda Runtime API served on loopback, so the real function binaries run here as they run on
//! Lambda: the binary long-polls `next`, answers with `response` or `error`, or reports `init/error`.
//! Used by the binary tests and the cold-start benchmark (init time = process start to first `next`).

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// What the fake Runtime API holds for one binary.
#[derive(Default)]
pub struct Runtime {
    events: VecDeque<(String, String)>,
    /// request id -> (success, body)
    answers: BTreeMap<String, (bool, String)>,
    first_next: Option<Instant>,
    init_error: Option<String>,
}

/// Serves the Lambda Runtime API for one binary on a loopback port.
async fn serve(runtime: Arc<Mutex<Runtime>>) -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let runtime = runtime.clone();
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut reader = BufReader::new(read);
                loop {
                    let mut request_line = String::new();
                    if reader.read_line(&mut request_line).await.unwrap_or(0) == 0 {
                        return;
                    }
                    let mut length = 0usize;
                    loop {
                        let mut header = String::new();
                        if reader.read_line(&mut header).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let header = header.trim_end();
                        if header.is_empty() {
                            break;
                        }
                        if let Some((name, value)) = header.split_once(':') {
                            if name.eq_ignore_ascii_case("content-length") {
                                length = value.trim().parse().unwrap_or(0);
                            }
                        }
                    }
                    let mut body = vec![0u8; length];
                    if reader.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    let body = String::from_utf8_lossy(&body).into_owned();
                    let path = request_line
                        .split_whitespace()
                        .nth(1)
                        .unwrap_or("")
                        .to_string();
                    let response = if path.ends_with("/runtime/invocation/next") {
                        // Long-poll: hand out the next event, or wait for one.
                        loop {
                            let next = {
                                let mut rt = runtime.lock().unwrap();
                                rt.first_next.get_or_insert_with(Instant::now);
                                rt.events.pop_front()
                            };
                            if let Some((id, event)) = next {
                                break format!(
                                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nlambda-runtime-aws-request-id: {id}\r\nlambda-runtime-deadline-ms: {}\r\nlambda-runtime-invoked-function-arn: arn:aws:lambda:us-east-1:123456789012:function:test\r\nlambda-runtime-trace-id: Root=1-5bef4de7-ad49b0e87f6ef6c87fc2e700;Parent=9a9197af755a6419;Sampled=1\r\ncontent-length: {}\r\n\r\n{event}",
                                    now_ms() + 60_000,
                                    event.len()
                                );
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    } else if let Some(rest) = path.strip_prefix("/2018-06-01/runtime/invocation/")
                    {
                        let (id, kind) = rest.split_once('/').unwrap_or((rest, ""));
                        runtime
                            .lock()
                            .unwrap()
                            .answers
                            .insert(id.to_string(), (kind == "response", body));
                        "HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n".to_string()
                    } else if path.ends_with("/runtime/init/error") {
                        runtime.lock().unwrap().init_error = Some(body);
                        "HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\n\r\n".to_string()
                    } else {
                        "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_string()
                    };
                    if write.write_all(response.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok(port)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A function binary running under the fake Runtime API; killed when dropped.
pub struct Function {
    pub name: String,
    child: Child,
    runtime: Arc<Mutex<Runtime>>,
    started: Instant,
    invocations: u32,
}

impl Function {
    /// Starts the binary at `path` as function `binary` with `env` (plus the Runtime API's own).
    pub async fn start(path: &Path, env: &BTreeMap<String, String>) -> Result<Function> {
        let binary = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let binary = binary.as_str();
        let runtime = Arc::new(Mutex::new(Runtime::default()));
        let port = serve(runtime.clone()).await?;
        let started = Instant::now();
        let child = Command::new(path)
            .envs(env)
            .env("AWS_LAMBDA_RUNTIME_API", format!("127.0.0.1:{port}"))
            .env("AWS_LAMBDA_FUNCTION_NAME", binary)
            .env("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST")
            .env("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "128")
            .env("AWS_LAMBDA_LOG_GROUP_NAME", format!("/aws/lambda/{binary}"))
            .env("AWS_LAMBDA_LOG_STREAM_NAME", "test")
            .env("AWS_LAMBDA_LOG_FORMAT", "JSON")
            // STEPLINE_RUNTIME_LOGS=1 shows the binaries' logs (debugging a run).
            .stdout(logs())
            .stderr(logs())
            .spawn()
            .with_context(|| format!("starting {}", path.display()))?;
        Ok(Function {
            name: binary.to_string(),
            child,
            runtime,
            started,
            invocations: 0,
        })
    }

    /// Delivers one event and waits for the binary's answer.
    pub async fn invoke(&mut self, event: String) -> Result<Value> {
        self.invocations += 1;
        let id = format!("req-{}-{}", self.name, self.invocations);
        self.runtime
            .lock()
            .unwrap()
            .events
            .push_back((id.clone(), event));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some((ok, body)) = self.runtime.lock().unwrap().answers.remove(&id) {
                if !ok {
                    bail!("{} reported an error: {body}", self.name);
                }
                return Ok(serde_json::from_str(&body).unwrap_or(Value::String(body)));
            }
            if let Some(error) = &self.runtime.lock().unwrap().init_error {
                bail!("{} failed to initialise: {error}", self.name);
            }
            if Instant::now() > deadline {
                bail!("{} did not answer within 30 s", self.name);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Process start to the first `next` call.
    pub fn init_ms(&self) -> Option<f64> {
        self.runtime
            .lock()
            .unwrap()
            .first_next
            .map(|t| (t - self.started).as_secs_f64() * 1000.0)
    }

    /// Peak resident set size of the process so far (`VmHWM`, Linux), in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }
}

impl Drop for Function {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn logs() -> Stdio {
    if std::env::var_os("STEPLINE_RUNTIME_LOGS").is_some() {
        Stdio::inherit()
    } else {
        Stdio::null()
    }
}

/// A Lambda event from `tests/fixtures/<name>`, with each `${KEY}` replaced by its value.
pub fn fixture(name: &str, vars: &[(&str, &str)]) -> Result<String> {
    let path = crate::workspace_root().join("tests/fixtures").join(name);
    let mut text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    for (key, value) in vars {
        text = text.replace(&format!("${{{key}}}"), value);
    }
    Ok(text)
}

/// An SQS event delivering `body` (JSON-escaped into the fixture) from queue `arn`.
pub fn sqs_event(body: &str, arn: &str) -> Result<String> {
    let escaped = serde_json::to_string(body)?;
    fixture(
        "sqs-event.json",
        &[("BODY", &escaped[1..escaped.len() - 1]), ("QUEUE_ARN", arn)],
    )
}
