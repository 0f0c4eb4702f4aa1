//! A Lambda Runtime API served on loopback, so the real function binaries run here as they run on
//! Lambda: the binary long-polls `next`, answers with `response` or `error`, or reports `init/error`.
//! Used by the binary tests and the cold-start benchmark (init time = process start to first `next`).

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::Value;
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
    let app = Router::new()
        .route("/2018-06-01/runtime/invocation/next", get(next))
        .route(
            "/2018-06-01/runtime/invocation/{id}/response",
            post(response),
        )
        .route("/2018-06-01/runtime/invocation/{id}/error", post(error))
        .route("/2018-06-01/runtime/init/error", post(init_error))
        // The binaries send what they send: no limit on an answer's size.
        .layer(DefaultBodyLimit::disable())
        .with_state(runtime);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(port)
}

type Shared = State<Arc<Mutex<Runtime>>>;

/// Long-poll: hands out the next event, or waits for one.
async fn next(State(runtime): Shared) -> Response {
    let (id, event) = loop {
        let next = {
            let mut rt = runtime.lock().unwrap();
            rt.first_next.get_or_insert_with(Instant::now);
            rt.events.pop_front()
        };
        if let Some(next) = next {
            break next;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let deadline = (now_ms() + 60_000).to_string();
    (
        [
            ("content-type", "application/json"),
            ("lambda-runtime-aws-request-id", id.as_str()),
            ("lambda-runtime-deadline-ms", deadline.as_str()),
            (
                "lambda-runtime-invoked-function-arn",
                "arn:aws:lambda:us-east-1:123456789012:function:test",
            ),
            (
                "lambda-runtime-trace-id",
                "Root=1-5bef4de7-ad49b0e87f6ef6c87fc2e700;Parent=9a9197af755a6419;Sampled=1",
            ),
        ],
        event,
    )
        .into_response()
}

/// The binary's answer to invocation `id`.
async fn response(State(runtime): Shared, UrlPath(id): UrlPath<String>, body: Bytes) -> StatusCode {
    answer(&runtime, id, true, &body)
}

/// The binary's report that invocation `id` failed.
async fn error(State(runtime): Shared, UrlPath(id): UrlPath<String>, body: Bytes) -> StatusCode {
    answer(&runtime, id, false, &body)
}

fn answer(runtime: &Mutex<Runtime>, id: String, ok: bool, body: &[u8]) -> StatusCode {
    let body = String::from_utf8_lossy(body).into_owned();
    runtime.lock().unwrap().answers.insert(id, (ok, body));
    StatusCode::ACCEPTED
}

/// The binary's report that it failed to initialise.
async fn init_error(State(runtime): Shared, body: Bytes) -> StatusCode {
    runtime.lock().unwrap().init_error = Some(String::from_utf8_lossy(&body).into_owned());
    StatusCode::ACCEPTED
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
