//! The web console (`stepline console`), driven in a real browser (headless Chromium over the W3C
//! WebDriver protocol) against a stage the local stack runs on the emulator: the executions list shows
//! a waiting execution, its page shows the status and the step graph, and approving it by typing a
//! payload and clicking the button runs it to its end, which the page shows as it happens.

mod support;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use fantoccini::elements::Element;
use fantoccini::error::CmdError;
use fantoccini::Locator;
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{json, Value};
use stepline::domain::Status;
use support::{running_stage, stepline_json, submit};

const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const CHROMIUM: &str = "/usr/bin/chromium";
/// How long a command on an element is retried while the live update replaces the element.
const ELEMENT_DEADLINE: Duration = Duration::from_secs(10);
const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0D, 0x0A, 0x1A, 0x0A];

/// Child processes, killed (and reaped) when the test ends, however it ends.
#[derive(Default)]
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A fresh directory under the system's temporary directory, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(prefix: &str) -> Result<Scratch> {
        let dir = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A port nobody listens on (right now).
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Where the screenshots go: `<workspace>/target/console/`.
fn screenshots_dir() -> Result<PathBuf> {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .join("target")
        .join("console");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Starts `stepline --stage <stage> console --port <port>` and waits until it says it listens.
fn start_console(stage: &str, port: u16, processes: &mut Processes) -> Result<()> {
    let port_arg = port.to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stepline"))
        .args(["--stage", stage, "console", "--port", port_arg.as_str()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting `stepline console`")?;
    let out = child
        .stdout
        .take()
        .context("the console's stdout is not piped")?;
    processes.0.push(child);

    // Read on for as long as the console runs, so that it never blocks on a full pipe.
    let (lines, received) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            let _ = lines.send(line);
        }
    });

    let expected = format!("console listening on http://127.0.0.1:{port}/");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    loop {
        match received.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) if line.contains("console listening on") => {
                ensure!(
                    line.trim() == expected,
                    "the console announced {line:?}, expected {expected:?}"
                );
                return Ok(());
            }
            Ok(line) => seen.push(line),
            Err(RecvTimeoutError::Timeout) => {
                bail!("the console did not say it listens within 30 s; it printed {seen:?}")
            }
            Err(RecvTimeoutError::Disconnected) => {
                bail!("the console exited before it listened; it printed {seen:?}")
            }
        }
    }
}

/// Starts chromedriver on a free port and waits until it is ready; its address (`127.0.0.1:<port>`).
fn start_chromedriver(processes: &mut Processes) -> Result<String> {
    for binary in [CHROMEDRIVER, CHROMIUM] {
        ensure!(
            Path::new(binary).exists(),
            "{binary} is missing: install Debian's chromium and chromium-driver"
        );
    }
    let port = free_port()?;
    let child = Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {CHROMEDRIVER}"))?;
    processes.0.push(child);

    let base = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match webdriver(&base, "GET", "/status", None) {
            Ok(status) if status["ready"] == true => return Ok(base),
            outcome => {
                ensure!(
                    Instant::now() < deadline,
                    "chromedriver was not ready within 30 s: {outcome:?}"
                );
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// An HTTP response: its status code and body.
struct Response {
    status: u16,
    body: Vec<u8>,
}

/// The largest body read from chromedriver (its status).
const WEBDRIVER_BODY_LIMIT: u64 = 1 << 20;

/// The test's HTTP client: every status comes back as a response (a WebDriver error and the console's
/// refusals are answers to check), and no redirect is followed (the console's 303 is one to check).
fn agent() -> &'static ureq::Agent {
    static AGENT: OnceLock<ureq::Agent> = OnceLock::new();
    AGENT.get_or_init(|| {
        ureq::Agent::new_with_config(
            ureq::Agent::config_builder()
                .http_status_as_error(false)
                .max_redirects(0)
                .timeout_per_read(Some(Duration::from_secs(90)))
                .timeout_per_write(Some(Duration::from_secs(30)))
                .build(),
        )
    })
}

/// Sends `method path` to `addr` (`host:port`), accepting `accept`, with `origin` as its Origin
/// and `body` (its content type and text) as its body, if any; the response or what failed.
fn send(
    addr: &str,
    method: &str,
    path: &str,
    accept: &str,
    origin: Option<String>,
    body: Option<(&str, String)>,
) -> Result<Result<ureq::http::Response<ureq::Body>, ureq::Error>> {
    let mut request = ureq::http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("Accept", accept);
    if let Some(origin) = origin {
        request = request.header("Origin", origin);
    }
    Ok(match body {
        Some((content_type, body)) => {
            agent().run(request.header("Content-Type", content_type).body(body)?)
        }
        None => agent().run(request.body(())?),
    })
}

/// One HTTP request to `addr` (`host:port`): `body`, if any, goes as JSON.
fn http(addr: &str, method: &str, path: &str, body: Option<&Value>) -> Result<Response> {
    let body = body.map(|body| ("application/json; charset=utf-8", body.to_string()));
    let response = send(addr, method, path, "application/json", None, body)?;
    let mut response = response.with_context(|| format!("{method} {path}: requesting {addr}"))?;
    let body = response
        .body_mut()
        .with_config()
        .limit(WEBDRIVER_BODY_LIMIT)
        .read_to_vec()
        .with_context(|| format!("{method} {path}: reading the response from {addr}"))?;
    Ok(Response {
        status: response.status().as_u16(),
        body,
    })
}

/// One WebDriver command; the reply's `value`, or an error naming the command.
fn webdriver(addr: &str, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
    let response = http(addr, method, path, body)?;
    let mut reply: Value = if response.body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&response.body).with_context(|| {
            format!(
                "WebDriver {method} {path}: the reply (HTTP {}) is not JSON: {}",
                response.status,
                String::from_utf8_lossy(&response.body)
            )
        })?
    };
    let value = reply
        .get_mut("value")
        .map(|value| value.take())
        .unwrap_or(Value::Null);
    if response.status != 200 {
        let error = value["error"].as_str().unwrap_or("unknown error");
        let message = value["message"].as_str().unwrap_or_default();
        bail!(
            "WebDriver {method} {path} failed (HTTP {}): {error}: {message}",
            response.status
        );
    }
    Ok(value)
}

/// Retries `attempt` while it fails because the element it uses was replaced (the live update
/// replaces the page's elements every second), until a deadline.
async fn retrying<T>(
    what: &str,
    mut attempt: impl AsyncFnMut() -> Result<T, CmdError>,
) -> Result<T> {
    let deadline = Instant::now() + ELEMENT_DEADLINE;
    loop {
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(error) => {
                let replaced = error.is_stale_element_reference() || error.is_no_such_element();
                if !replaced || Instant::now() >= deadline {
                    return Err(anyhow::Error::new(error).context(what.to_string()));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A browser session on chromedriver (the session ends, the browser closed, when `quit` is called or
/// the driver is dropped).
struct Driver {
    client: fantoccini::Client,
}

impl Driver {
    /// A new headless Chromium session on chromedriver at `base` (`127.0.0.1:<port>`) whose profile
    /// lives in `profile`.
    async fn start(base: &str, profile: &Path) -> Result<Driver> {
        let mut capabilities = fantoccini::wd::Capabilities::new();
        capabilities.insert("browserName".into(), json!("chrome"));
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": CHROMIUM,
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--no-first-run",
                    "--disable-dev-shm-usage",
                    "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.display()),
                ],
            }),
        );
        let client = fantoccini::ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://{base}"))
            .await
            .context("starting a headless Chromium session")?;
        Ok(Driver { client })
    }

    async fn open(&self, url: &str) -> Result<()> {
        self.client
            .goto(url)
            .await
            .with_context(|| format!("opening {url}"))
    }

    async fn source(&self) -> Result<String> {
        Ok(self.client.source().await?)
    }

    /// The element `css` selects now (use it at once: the live update replaces it).
    async fn element(&self, css: &str) -> Result<Element, CmdError> {
        self.client.find(Locator::Css(css)).await
    }

    /// The rendered text of the element `css` selects, trimmed.
    async fn text(&self, css: &str) -> Result<String> {
        retrying(&format!("reading the text of {css}"), async || {
            let text = self.element(css).await?.text().await?;
            Ok(text.trim().to_string())
        })
        .await
    }

    /// An attribute of the element `css` selects (`None` if it has none).
    async fn attribute(&self, css: &str, name: &str) -> Result<Option<String>> {
        retrying(&format!("reading {name} of {css}"), async || {
            self.element(css).await?.attr(name).await
        })
        .await
    }

    /// Replaces the text of the field `field` by `text` and clicks `button`, as one step: should the
    /// live update replace the form on the way, it is all done again on the fresh form.
    async fn fill_and_click(&self, field: &str, text: &str, button: &str) -> Result<()> {
        retrying(
            &format!("typing into {field} and clicking {button}"),
            async || {
                let input = self.element(field).await?;
                input.clear().await?;
                input.send_keys(text).await?;
                self.element(button).await?.click().await
            },
        )
        .await
    }

    /// Saves a screenshot of the page to `path`; the PNG bytes.
    async fn screenshot(&self, path: &Path) -> Result<Vec<u8>> {
        let png = self
            .client
            .screenshot()
            .await
            .context("taking a screenshot")?;
        std::fs::write(path, &png).with_context(|| format!("writing {}", path.display()))?;
        Ok(png)
    }

    /// Ends the session (closes the browser).
    async fn quit(self) -> Result<()> {
        self.client.close().await.context("ending the session")
    }
}

/// Opens the console in the browser, checks the list and the waiting execution `id`, approves it by
/// typing a payload and clicking, and follows the page until it shows the execution SUCCEEDED.
async fn approve_in_the_browser(stage: &str, id: &str) -> Result<()> {
    let shots = screenshots_dir()?;
    // Declared first, dropped last: the browser, chromedriver and the console are gone by then.
    let profile = Scratch::new("stepline-console-chromium")?;
    let mut processes = Processes::default();

    // The console and chromedriver are started with blocking calls inside `block_in_place`: the
    // runtime's worker threads keep running the workers meanwhile.
    let port = free_port()?;
    tokio::task::block_in_place(|| start_console(stage, port, &mut processes))?;
    let console = format!("http://127.0.0.1:{port}");
    let chromedriver = tokio::task::block_in_place(|| start_chromedriver(&mut processes))?;
    let driver = Driver::start(&chromedriver, &profile.0).await?;
    // The session ends before chromedriver does, however the steps end.
    let outcome = approve(&driver, &console, id, &shots).await;
    let quit = driver.quit().await;
    outcome.and(quit)
}

/// The browser's part of `approve_in_the_browser`.
async fn approve(driver: &Driver, console: &str, id: &str, shots: &Path) -> Result<()> {
    // The executions list links to the execution.
    let list = format!("{console}/?pipeline={}", restaurant_approval::PIPELINE_ID);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        driver.open(&list).await?;
        if driver.source().await?.contains(id) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the executions list at {list} never showed execution {id}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    driver.screenshot(&shots.join("executions.png")).await?;

    // The execution page: waiting on the manager's approval.
    driver.open(&format!("{console}/executions/{id}")).await?;
    let status = driver.text("#status").await?;
    ensure!(
        status == "WAITING_EXTERNAL",
        "the page shows status {status:?}, expected WAITING_EXTERNAL"
    );
    let approve = r#"g[data-step="approve"]"#;
    let state = driver.attribute(approve, "data-state").await?;
    ensure!(
        state.as_deref() == Some("WAITING"),
        "the graph shows the approve step as {state:?}, expected WAITING"
    );
    driver
        .screenshot(&shots.join("execution-waiting.png"))
        .await?;

    // Approve, as the manager would.
    driver
        .fill_and_click("#payload-manager", r#"{"by":"ana"}"#, "#approve-manager")
        .await?;

    // The page follows the execution to its end.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut shown = String::new();
    let mut last_error: Option<String> = None;
    while shown != "SUCCEEDED" {
        ensure!(
            shown != "FAILED",
            "the page shows the execution FAILED after the approval"
        );
        ensure!(
            Instant::now() < deadline,
            "the page did not show SUCCEEDED within 60 s of the approval (last shown: {shown:?}, \
             last error: {last_error:?})"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        match driver.text("#status").await {
            Ok(text) => shown = text,
            Err(error) => last_error = Some(format!("{error:#}")),
        }
    }
    let state = driver.attribute(approve, "data-state").await?;
    ensure!(
        state.as_deref() == Some("SUCCEEDED"),
        "the graph shows the approve step as {state:?} once the execution SUCCEEDED"
    );

    let path = shots.join("execution-succeeded.png");
    driver.screenshot(&path).await?;
    let png = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    ensure!(
        png.starts_with(&PNG_SIGNATURE),
        "{} is not a PNG",
        path.display()
    );
    ensure!(
        png.len() > 10 * 1024,
        "{} is only {} bytes: an empty page?",
        path.display(),
        png.len()
    );

    Ok(())
}

/// Submits the restaurant example's sample order `n` with the CLI; its id, as printed and parsed.
fn submit_restaurant_order(stage: &str, n: usize) -> Result<(String, uuid::Uuid)> {
    let id = submit(
        stage,
        restaurant_approval::PIPELINE_ID,
        &restaurant_approval::sample_order(n),
    )?;
    let execution = id.parse()?;
    Ok((id, execution))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_an_execution_and_approves_it_by_a_click_in_a_real_browser() -> Result<()>
{
    stepline_local::full_tier_only!("drives a real browser");
    stepline_local::needs_emulator!();
    let (stage, api, _running) = running_stage("console").await?;
    let (id, execution) = submit_restaurant_order(&stage, 0)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = api.get(execution).await?.status;
        if status == Status::WaitingExternal {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "execution {id} never waited for approval (still {status:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    approve_in_the_browser(&stage, &id).await?;

    let record = api.get(execution).await?;
    ensure!(
        record.status == Status::Succeeded,
        "the page showed SUCCEEDED but the coordinator has {:?}",
        record.status
    );
    let result = stepline_json(&stage, &["result", &id])?;
    let message = result["result"]["message"].as_str().unwrap_or_default();
    ensure!(
        message.contains("approved by ana"),
        "the result does not name the approver typed in the form: {result}"
    );
    Ok(())
}

/// A response of the console: its status code, headers (names lower-cased) and body.
struct ConsoleResponse {
    status: u16,
    headers: std::collections::HashMap<String, String>,
    body: String,
}

/// One request to the console on `port`, as its own pages would send it: `Host` names the console,
/// `form` goes as a URL-encoded body, and `origin` adds the console's `Origin` (without it, a POST
/// carries neither `Origin` nor `Referer`).
fn console_request(
    port: u16,
    method: &str,
    path: &str,
    form: Option<&str>,
    origin: bool,
) -> Result<ConsoleResponse> {
    let addr = format!("127.0.0.1:{port}");
    let origin = origin.then(|| format!("http://{addr}"));
    let form = form.map(|form| ("application/x-www-form-urlencoded", form.to_string()));
    let response = send(&addr, method, path, "text/html", origin, form)?;
    let mut response =
        response.with_context(|| format!("{method} {path}: requesting the console at {addr}"))?;
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_ascii_lowercase(),
                String::from_utf8_lossy(value.as_bytes()).trim().to_string(),
            )
        })
        .collect();
    let body = response
        .body_mut()
        .read_to_string()
        .with_context(|| format!("{method} {path}: reading the response"))?;
    Ok(ConsoleResponse {
        status: response.status().as_u16(),
        headers,
        body,
    })
}

/// GETs `path` from the console until the page (HTTP 200) contains `needle`; the page.
fn console_page_until(port: u16, path: &str, needle: &str, within: Duration) -> Result<String> {
    let deadline = Instant::now() + within;
    loop {
        let page = console_request(port, "GET", path, None, false)?;
        ensure!(
            page.status == 200,
            "GET {path}: HTTP {}, expected 200: {}",
            page.status,
            page.body
        );
        if page.body.contains(needle) {
            return Ok(page.body);
        }
        ensure!(
            Instant::now() < deadline,
            "GET {path} did not show {needle:?} within {within:?}; the last page: {}",
            page.body
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The (HTML-escaped) text of the replay report on a dead letters page, if it shows one.
fn replay_report(page: &str) -> Option<&str> {
    const OPEN: &str = "<pre id=\"replay-report\">";
    let start = page.find(OPEN)? + OPEN.len();
    let end = start + page[start..].find("</pre>")?;
    Some(&page[start..end])
}

/// Polls the record of `execution` until `done` holds of it; the record.
async fn record_until(
    api: &::stepline::Coordinator,
    execution: uuid::Uuid,
    what: &str,
    within: Duration,
    done: impl Fn(&::stepline::domain::Execution) -> bool,
) -> Result<::stepline::domain::Execution> {
    let deadline = Instant::now() + within;
    loop {
        let record = api.get(execution).await?;
        if done(&record) {
            return Ok(record);
        }
        ensure!(
            Instant::now() < deadline,
            "execution {execution} did not {what} within {within:?} (status {:?}, dead letter {:?}, \
             re-drives {:?})",
            record.status,
            record.dead_letter,
            record.redrives
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Checks that `execution` is still FAILED and never re-driven after `what`.
async fn still_failed(
    api: &::stepline::Coordinator,
    execution: uuid::Uuid,
    what: &str,
) -> Result<()> {
    let record = api.get(execution).await?;
    ensure!(
        record.status == Status::Failed && record.redrives.is_empty(),
        "{what} touched execution {execution}: status {:?}, re-drives {:?}",
        record.status,
        record.redrives
    );
    Ok(())
}

/// Posts `form` to `path` from the console's own origin (the `what` action of a page's button),
/// which must answer with a redirect (303) to `page`.
fn post_to_the_page(port: u16, what: &str, path: &str, form: &str, page: &str) -> Result<()> {
    let answer = console_request(port, "POST", path, Some(form), true)?;
    ensure!(
        answer.status == 303,
        "the {what} got HTTP {}, expected 303: {}",
        answer.status,
        answer.body
    );
    let location = answer.headers.get("location").map(String::as_str);
    ensure!(
        location == Some(page),
        "the {what} redirected to {location:?}, expected {page:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_lists_cancels_re_drives_and_replays_dead_letters_with_a_dry_run() -> Result<()>
{
    stepline_local::needs_emulator!();
    let (stage, api, _running) = running_stage("console-ops").await?;
    let minute = Duration::from_secs(60);

    // An order without lines: its `validate` step fails for good (non-retryable INVALID_ORDER).
    let id = submit(&stage, "orders", &json!({"orderId": "empty", "lines": []}))?;
    let execution: uuid::Uuid = id.parse()?;
    let record = record_until(&api, execution, "end", minute, |r| r.status.is_terminal()).await?;
    ensure!(
        record.status == Status::Failed,
        "execution {id} ended {:?}, expected FAILED",
        record.status
    );
    record_until(
        &api,
        execution,
        "send its envelope to the execution DLQ",
        minute,
        |r| r.dead_letter.as_ref().is_some_and(|mark| mark.sent),
    )
    .await?;

    // The console is started and asked with blocking calls inside `block_in_place`: the runtime's
    // worker threads keep running the workers meanwhile.
    let mut processes = Processes::default();
    let port = free_port()?;
    tokio::task::block_in_place(|| start_console(&stage, port, &mut processes))?;
    let half_minute = Duration::from_secs(30);

    // The executions list, filtered to the failed orders, shows it.
    tokio::task::block_in_place(|| {
        console_page_until(port, "/?pipeline=orders&status=FAILED", &id, half_minute)
    })?;

    // The dead letters page shows its envelope (left in place).
    let dead_letters =
        tokio::task::block_in_place(|| console_page_until(port, "/dlq", &id, half_minute))?;
    ensure!(
        dead_letters.contains("<table id=\"dead-letters\">"),
        "the dead letters page has no table of dead letters: {dead_letters}"
    );

    // A dry-run replay reports the execution as matched and leaves it alone.
    let report = tokio::task::block_in_place(|| -> Result<String> {
        let deadline = Instant::now() + half_minute;
        loop {
            let page = console_request(
                port,
                "POST",
                "/dlq/replay",
                Some("pipeline=orders&reason=check&dryRun=on"),
                true,
            )?;
            ensure!(
                page.status == 200,
                "POST /dlq/replay (dry run): HTTP {}, expected 200: {}",
                page.status,
                page.body
            );
            let report = replay_report(&page.body)
                .with_context(|| format!("the replay answered without a report: {}", page.body))?
                .to_string();
            if report.contains(&id) {
                return Ok(report);
            }
            ensure!(
                Instant::now() < deadline,
                "the dry-run replay did not match execution {id} within {half_minute:?}; the last \
                 report: {report}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    })?;
    ensure!(
        report.contains("&quot;dryRun&quot;: true"),
        "the replay report does not say it was a dry run: {report}"
    );
    ensure!(
        report.contains("&quot;replayed&quot;: 0"),
        "the dry run replayed something: {report}"
    );
    still_failed(&api, execution, "the dry run").await?;

    // A re-drive from elsewhere than the console's own pages is refused and does nothing.
    let redrive = format!("/executions/{id}/redrive");
    let refused = tokio::task::block_in_place(|| {
        console_request(port, "POST", &redrive, Some("reason=again"), false)
    })?;
    ensure!(
        refused.status == 403,
        "a re-drive without Origin or Referer got HTTP {}, expected 403: {}",
        refused.status,
        refused.body
    );
    still_failed(&api, execution, "the refused re-drive").await?;

    // From the console's own origin, it re-drives the execution, which fails again (same input).
    let page_path = format!("/executions/{id}");
    tokio::task::block_in_place(|| {
        post_to_the_page(port, "re-drive", &redrive, "reason=again", &page_path)
    })?;
    let record = record_until(
        &api,
        execution,
        "end again after the re-drive",
        minute,
        |r| r.redrives.len() == 1 && r.status.is_terminal(),
    )
    .await?;
    ensure!(
        record.status == Status::Failed,
        "the re-driven execution {id} ended {:?}, expected FAILED (its input is still invalid)",
        record.status
    );
    ensure!(
        record.redrives[0].reason == "again" && record.redrives[0].from_status == Status::Failed,
        "the re-drive note is {:?}, expected one from FAILED for \"again\"",
        record.redrives[0]
    );

    // The execution's page tells the re-drive in its history.
    let page = tokio::task::block_in_place(|| {
        console_page_until(
            port,
            &page_path,
            "re-driven from FAILED: again",
            half_minute,
        )
    })?;
    ensure!(
        page.contains("s-FAILED"),
        "the page of the re-driven execution does not show it FAILED: {page}"
    );

    // A waiting restaurant order is cancelled from the console.
    let (waiting_id, waiting) = submit_restaurant_order(&stage, 3)?;
    let record = record_until(&api, waiting, "wait for approval", minute, |r| {
        r.status == Status::WaitingExternal || r.status.is_terminal()
    })
    .await?;
    ensure!(
        record.status == Status::WaitingExternal,
        "execution {waiting_id} is {:?}, expected WAITING_EXTERNAL",
        record.status
    );
    let cancel = format!("/executions/{waiting_id}/cancel");
    let waiting_page = format!("/executions/{waiting_id}");
    tokio::task::block_in_place(|| {
        post_to_the_page(port, "cancel", &cancel, "reason=closed", &waiting_page)
    })?;
    let record = record_until(&api, waiting, "end after the cancel", minute, |r| {
        r.status.is_terminal()
    })
    .await?;
    ensure!(
        record.status == Status::Cancelled,
        "execution {waiting_id} ended {:?} after the cancel, expected CANCELLED",
        record.status
    );

    // Stops the console.
    drop(processes);
    Ok(())
}
