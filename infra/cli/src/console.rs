//! `stepline console`: a web console served on 127.0.0.1 with the operator's own credentials. Pages are
//! rendered on the server; a few lines of script refresh an execution's page while it runs. Nothing
//! is fetched from elsewhere, so it works offline and against the emulator alike.
//!
//! Routes: `/` (executions, with filters), `/executions/<id>` (the pipeline drawn and coloured by
//! state, the attempts on a timeline, inputs and outputs, answers, cancel and re-drive),
//! `/executions/<id>/live` (the part of that page that changes), `/dlq` (dead letters, replay with a
//! dry run).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};
use stepline::domain::history::describe;
use stepline::domain::{Status, Timestamp, Verdict};
use stepline::envelope::{InteractionMessage, INTERACTION_KIND};
use stepline::handlers::{self, CancelRequest, DeadLetterQueues, OperatorRequest, RedriveRequest};
use stepline::{Coordinator, HistoryView, ListRequest};
use stepline_stage::Stage;
use tokio::net::TcpListener;
use uuid::Uuid;

use crate::{dead_letter_queues, peek, FilterArgs};

struct Console {
    stage: Stage,
    api: Coordinator,
    port: u16,
}

pub async fn serve(stage: Stage, api: Coordinator, port: u16) -> Result<()> {
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .with_context(|| format!("listening on 127.0.0.1:{port}"))?;
    let port = listener.local_addr()?.port();
    println!("console listening on http://127.0.0.1:{port}/");
    use std::io::Write as _;
    std::io::stdout().flush()?;
    let console = Arc::new(Console { stage, api, port });
    // Every request goes to `Console::respond`, which routes it itself; bodies over 1 MiB are refused.
    let app = Router::new()
        .fallback(respond)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(console);
    axum::serve(listener, app)
        .await
        .context("serving the console")
}

/// The largest request body the console reads (its forms are a few fields).
const BODY_LIMIT: usize = 1 << 20;

async fn respond(
    State(console): State<Arc<Console>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    console.respond(method, uri, headers, body).await
}

/// A request as the console needs it.
struct Request {
    /// Whether the request may be served: it names this console as its host (no other name can be
    /// made to resolve to it, as DNS rebinding would), and a POST comes from the console's own pages
    /// (another site's page cannot make the browser approve or cancel anything).
    allowed: bool,
    method: String,
    path: String,
    query: HashMap<String, String>,
    form: HashMap<String, String>,
}

/// A response: status, content type and body, or a redirect.
enum Page {
    Html(u16, String),
    Fragment(String),
    Redirect(String),
}

impl Console {
    async fn respond(&self, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
        // Each header as text (a value that is not ASCII is compared as it reads, never skipped).
        let header = |name: &str| {
            headers
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).trim().to_string())
        };
        let (host, origin) = (header("host"), header("origin"));
        let (referer, fetch_site) = (header("referer"), header("sec-fetch-site"));
        let request = Request {
            allowed: allowed(
                self.port,
                method.as_str(),
                host.as_deref(),
                origin.as_deref(),
                referer.as_deref(),
                fetch_site.as_deref(),
            ),
            method: method.as_str().to_string(),
            path: uri.path().to_string(),
            query: form_fields(uri.query().unwrap_or("")),
            form: form_fields(&String::from_utf8_lossy(&body)),
        };
        let page = match self.route(&request).await {
            Ok(page) => page,
            Err(e) => {
                // A refusal keeps its stable code and status; anything else is the console's failure.
                let (status, code) = match e.downcast_ref::<stepline::CoordinatorError>() {
                    Some(refused) => (refused.code().http_status(), refused.code().as_str()),
                    None if e.downcast_ref::<uuid::Error>().is_some() => (404, "NOT_FOUND"),
                    None => (500, "INTERNAL"),
                };
                let text = format!("{code}: {e:#}");
                let body = format!("<p class=\"error\" id=\"error\">{}</p>", esc(&text));
                Page::Html(status, layout("Error", &body))
            }
        };
        let (status, kind, body, location) = match page {
            Page::Html(status, body) => (status, "text/html; charset=utf-8", body, None),
            Page::Fragment(body) => (200, "text/html; charset=utf-8", body, None),
            Page::Redirect(to) => (303, "text/plain", String::new(), Some(to)),
        };
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (
            status,
            [
                (header::CONTENT_TYPE, kind),
                (header::CACHE_CONTROL, "no-store"),
            ],
            body,
        )
            .into_response();
        if let Some(location) = location.and_then(|to| HeaderValue::try_from(to).ok()) {
            response.headers_mut().insert(header::LOCATION, location);
        }
        response
    }

    async fn route(&self, r: &Request) -> Result<Page> {
        if !r.allowed {
            return Ok(Page::Html(
                403,
                layout("Refused", "<p class=\"error\">Not from this console.</p>"),
            ));
        }
        let segments: Vec<&str> = r.path.trim_matches('/').split('/').collect();
        Ok(match (r.method.as_str(), segments.as_slice()) {
            ("GET", [""]) => Page::Html(200, self.executions(r).await?),
            ("GET", ["executions", id]) => Page::Html(200, self.execution(id.parse()?).await?),
            ("GET", ["executions", id, "live"]) => {
                Page::Fragment(live(&self.api.history(id.parse()?).await?, &self.api).await)
            }
            ("POST", ["executions", id, "interactions", name]) => {
                self.answer(id.parse()?, name, r).await?
            }
            ("POST", ["executions", id, "cancel"]) => {
                let id: Uuid = id.parse()?;
                let reason = r.form.get("reason").cloned().unwrap_or_default();
                handlers::cancel(
                    &self.api,
                    CancelRequest {
                        execution_id: id,
                        reason: non_empty(reason, "cancelled from the console"),
                    },
                )
                .await?;
                Page::Redirect(format!("/executions/{id}"))
            }
            ("POST", ["executions", id, "redrive"]) => {
                let id: Uuid = id.parse()?;
                let version = self.api.get(id).await?.version;
                let reason = r.form.get("reason").cloned().unwrap_or_default();
                handlers::redrive(
                    &self.api,
                    RedriveRequest {
                        execution_id: id,
                        expected_version: version,
                        reason: non_empty(reason, "re-driven from the console"),
                        release_version: field(&r.form, "release"),
                    },
                )
                .await?;
                Page::Redirect(format!("/executions/{id}"))
            }
            ("GET", ["dlq"]) => Page::Html(200, self.dead_letters(r, None).await?),
            ("POST", ["dlq", "replay"]) => {
                let filter = FilterArgs {
                    pipeline: field(&r.form, "pipeline"),
                    tenant: field(&r.form, "tenant"),
                    error_code: field(&r.form, "errorCode"),
                    release: field(&r.form, "release"),
                    step: field(&r.form, "step"),
                    from: None,
                    to: None,
                    dry_run: r.form.contains_key("dryRun"),
                    max: 100,
                    rate: None,
                    reason: non_empty(
                        r.form.get("reason").cloned().unwrap_or_default(),
                        "replayed from the console",
                    ),
                };
                let report = self.replay(filter, field(&r.form, "onto")).await?;
                Page::Html(200, self.dead_letters(r, Some(report)).await?)
            }
            _ => Page::Html(404, layout("Not found", "<p>No such page.</p>")),
        })
    }

    async fn executions(&self, r: &Request) -> Result<String> {
        let pipeline = r.query.get("pipeline").cloned().unwrap_or_default();
        let status = r.query.get("status").cloned().unwrap_or_default();
        let tenant = r.query.get("tenant").cloned().unwrap_or_default();
        let mut html = format!(
            "<form class=\"filters\" method=\"get\" action=\"/\">\
             <label>Pipeline <input name=\"pipeline\" id=\"filter-pipeline\" value=\"{}\" required></label>\
             <label>Status <select name=\"status\" id=\"filter-status\"><option value=\"\">any</option>{}</select></label>\
             <label>Tenant <input name=\"tenant\" value=\"{}\"></label>\
             <button type=\"submit\">List</button></form>",
            esc(&pipeline),
            STATUSES
                .iter()
                .map(|s| format!(
                    "<option{}>{s}</option>",
                    if *s == status { " selected" } else { "" }
                ))
                .collect::<String>(),
            esc(&tenant)
        );
        if pipeline.is_empty() {
            html.push_str("<p>Name a pipeline to list its executions, newest first.</p>");
            return Ok(layout("Executions", &html));
        }
        let statuses = match status.as_str() {
            "" => Vec::new(),
            s => vec![serde_json::from_value(Value::String(s.into()))?],
        };
        let page = self
            .api
            .list(ListRequest {
                pipeline_id: pipeline.clone(),
                statuses,
                tenant: Some(tenant.clone()).filter(|t| !t.is_empty()),
                limit: 50,
                after: r.query.get("after").cloned(),
                ..ListRequest::default()
            })
            .await?;
        html.push_str("<table id=\"executions\"><tr><th>Execution</th><th>Status</th><th>Step</th><th>Tenant</th><th>Release</th><th>Created</th><th>Updated</th><th>Error</th></tr>");
        for e in &page.executions {
            let _ = write!(
                html,
                "<tr><td><a href=\"/executions/{id}\">{id}</a></td><td><span class=\"badge s-{status}\">{status}</span></td>\
                 <td>{} (attempt {})</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                e.step + 1,
                e.attempt,
                esc(&e.tenant),
                esc(&e.release_version),
                e.created_at.utc(),
                e.updated_at.utc(),
                esc(e.error_code.as_deref().unwrap_or("")),
                id = e.execution_id,
                status = e.status,
            );
        }
        html.push_str("</table>");
        if page.executions.is_empty() {
            html.push_str("<p>No executions in the last week match.</p>");
        }
        if let Some(next) = &page.next {
            let _ = write!(
                html,
                "<p><a id=\"next\" href=\"/?pipeline={}&status={}&tenant={}&after={}\">Older</a></p>",
                enc(&pipeline),
                enc(&status),
                enc(&tenant),
                enc(next)
            );
        }
        Ok(layout("Executions", &html))
    }

    async fn execution(&self, id: Uuid) -> Result<String> {
        let history = self.api.history(id).await?;
        let body = format!(
            "<p><a href=\"/?pipeline={pipeline}\">&larr; {pipeline_text}</a></p>\
             <h1>Execution <code>{id}</code></h1>\
             <div id=\"live\" data-terminal=\"{terminal}\">{live}</div>\
             <script>{LIVE_SCRIPT}</script>",
            pipeline = enc(&history.execution.pipeline_id),
            pipeline_text = esc(&history.execution.pipeline_id),
            terminal = history.execution.status.is_terminal(),
            live = live(&history, &self.api).await,
        );
        Ok(layout(&format!("Execution {id}"), &body))
    }

    async fn answer(&self, id: Uuid, name: &str, r: &Request) -> Result<Page> {
        let record = self.api.get(id).await?;
        let interaction = record
            .await_unit
            .as_ref()
            .and_then(|u| u.interactions.iter().find(|i| i.id == name))
            .with_context(|| format!("execution {id} has no interaction {name:?}"))?;
        let verdict = match r.form.get("verdict").map(String::as_str) {
            Some("REJECTED") => Verdict::Rejected,
            _ => Verdict::Approved,
        };
        let text = r.form.get("payload").map(|p| p.trim()).unwrap_or("");
        let payload: Value = match text {
            "" => json!({}),
            text => serde_json::from_str(text).context("the payload is not JSON")?,
        };
        handlers::complete_interaction(
            &self.api,
            InteractionMessage {
                kind: INTERACTION_KIND.into(),
                execution_id: id,
                interaction: interaction.id.clone(),
                token: interaction.token.clone(),
                verdict,
                payload,
                unit: None,
            },
        )
        .await?;
        Ok(Page::Redirect(format!("/executions/{id}")))
    }

    async fn replay(&self, filter: FilterArgs, onto: Option<String>) -> Result<Value> {
        let dlqs = dead_letter_queues(&self.stage)?;
        let request = OperatorRequest::Replay(filter.request(onto));
        let response = handlers::operator(&self.api, &dlqs, request).await?;
        Ok(serde_json::to_value(response)?)
    }

    async fn dead_letters(&self, r: &Request, report: Option<Value>) -> Result<String> {
        let queues = dead_letter_queues(&self.stage)?;
        let which = r
            .query
            .get("queue")
            .map(String::as_str)
            .unwrap_or("execution");
        let reader = crate::dlq_reader(&queues, which)?;
        let messages = peek(reader, 20).await?;
        let mut html = String::new();
        if let Some(report) = report {
            let _ = write!(
                html,
                "<h2>Replay</h2><pre id=\"replay-report\">{}</pre>",
                esc(&serde_json::to_string_pretty(&report)?)
            );
        }
        html.push_str("<p>Queues: ");
        for q in DeadLetterQueues::NAMES {
            let _ = write!(html, "<a href=\"/dlq?queue={q}\">{q}</a> ");
        }
        let _ = write!(
            html,
            "</p><h2>{} dead letters ({} shown, left in place)</h2><table id=\"dead-letters\"><tr><th>Sent</th><th>Attributes</th><th>Body</th></tr>",
            esc(which),
            messages.len()
        );
        for m in &messages {
            let sent = m["sentAt"]
                .as_i64()
                .map(|ms| Timestamp::from_millis(ms).utc())
                .unwrap_or_default();
            let _ = write!(
                html,
                "<tr><td>{sent}</td><td><pre>{}</pre></td><td><pre>{}</pre></td></tr>",
                esc(&serde_json::to_string_pretty(&m["attributes"])?),
                esc(&serde_json::to_string_pretty(&m["body"])?)
            );
        }
        html.push_str(
            "</table><h2>Replay the execution DLQ</h2>\
             <form method=\"post\" action=\"/dlq/replay\" class=\"filters\">\
             <label>Pipeline <input name=\"pipeline\"></label>\
             <label>Tenant <input name=\"tenant\"></label>\
             <label>Error code <input name=\"errorCode\"></label>\
             <label>Failed on release <input name=\"release\"></label>\
             <label>At step <input name=\"step\"></label>\
             <label>Onto release <input name=\"onto\"></label>\
             <label>Reason <input name=\"reason\" value=\"replayed from the console\"></label>\
             <label><input type=\"checkbox\" name=\"dryRun\" checked> dry run</label>\
             <button type=\"submit\" id=\"replay\">Replay</button></form>",
        );
        Ok(layout("Dead letters", &html))
    }
}

const STATUSES: [&str; 8] = [
    "QUEUED",
    "RUNNING",
    "WAITING_EXTERNAL",
    "WAIT_RETRY",
    "SUCCEEDED",
    "FAILED",
    "DLQ",
    "CANCELLED",
];

/// Refreshes `#live` every second until the execution ends.
const LIVE_SCRIPT: &str = "(function(){const live=document.getElementById('live');\
async function tick(){if(live.dataset.terminal==='true'){return;}\
try{const r=await fetch(location.pathname+'/live',{cache:'no-store'});\
if(r.ok){const html=await r.text();const focused=live.contains(document.activeElement);\
if(!focused){live.innerHTML=html;const s=document.getElementById('status');\
if(s){live.dataset.terminal=s.dataset.terminal;}}}}catch(e){}setTimeout(tick,1000);}\
setTimeout(tick,1000);})();";

/// The part of an execution's page that changes while it runs.
async fn live(h: &HistoryView, api: &Coordinator) -> String {
    let e = &h.execution;
    let mut html = format!(
        "<p>Status <span id=\"status\" class=\"badge s-{status}\" data-terminal=\"{terminal}\">{status}</span> \
         pipeline <b>{}</b> release <b>{}</b> tenant <b>{}</b> created {} updated {}</p>",
        esc(&e.pipeline_id),
        esc(&e.release_version),
        esc(&e.tenant),
        e.created_at.utc(),
        e.updated_at.utc(),
        status = e.status,
        terminal = e.status.is_terminal(),
    );
    html.push_str(&graph(h));
    if let Some(error) = &h.error {
        let _ = write!(
            html,
            "<p class=\"error\">{}: {}</p>",
            esc(&error.code),
            esc(&error.message)
        );
    }
    html.push_str(&interactions(h, api).await);
    html.push_str(&operations(h));
    html.push_str(&timeline(h));
    html.push_str(&values(h));
    html.push_str("<h2>History</h2><ol id=\"history\">");
    let name = |k: u32| match h.steps.get(k as usize) {
        Some(step) => step.id.clone(),
        None => (k + 1).to_string(),
    };
    for entry in &h.entries {
        let _ = write!(
            html,
            "<li><time>{}</time> {}{}</li>",
            entry.at.utc(),
            esc(&describe(&entry.what, name)),
            entry
                .launch_id
                .map(|l| format!(" <code>{l}</code>"))
                .unwrap_or_default()
        );
    }
    html.push_str("</ol>");
    if !h.missing_chunks.is_empty() {
        let _ = write!(
            html,
            "<p class=\"error\">Journal chunks not found: {:?}</p>",
            h.missing_chunks
        );
    }
    html
}

/// The pipeline as a row of boxes, coloured by state.
fn graph(h: &HistoryView) -> String {
    const W: usize = 150;
    const GAP: usize = 40;
    let width = h.steps.len().max(1) * (W + GAP);
    let mut svg = format!(
        "<svg id=\"graph\" width=\"{width}\" height=\"90\" viewBox=\"0 0 {width} 90\" role=\"img\" aria-label=\"pipeline steps\">"
    );
    for (i, step) in h.steps.iter().enumerate() {
        let x = i * (W + GAP) + 4;
        if i > 0 {
            let _ = write!(
                svg,
                "<line x1=\"{}\" y1=\"45\" x2=\"{}\" y2=\"45\" class=\"edge\"/><polygon points=\"{},40 {},45 {},50\" class=\"arrow\"/>",
                x - GAP,
                x - 6,
                x - 8,
                x - 1,
                x - 8
            );
        }
        let kind = serde_json::to_value(step.kind)
            .ok()
            .and_then(|k| k.as_str().map(str::to_string))
            .unwrap_or_default();
        let _ = write!(
            svg,
            "<g class=\"step\" data-step=\"{id}\" data-state=\"{state}\"><title>{id}: {state}</title>\
             <rect x=\"{x}\" y=\"15\" width=\"{W}\" height=\"60\" rx=\"8\" class=\"st-{state}\"/>\
             <text x=\"{tx}\" y=\"40\" class=\"name\">{n}. {id}</text>\
             <text x=\"{tx}\" y=\"60\" class=\"state\">{state} · {kind}</text></g>",
            id = esc(&step.id),
            state = step.state,
            tx = x + 10,
            n = step.index + 1,
            kind = esc(&kind.to_lowercase()),
        );
    }
    svg.push_str("</svg>");
    svg
}

/// Forms to answer the open interactions of a waiting await step.
async fn interactions(h: &HistoryView, api: &Coordinator) -> String {
    if h.execution.status != Status::WaitingExternal {
        return String::new();
    }
    let Ok(record) = api.get(h.execution.execution_id).await else {
        return String::new();
    };
    let Some(unit) = record.await_unit.as_ref().filter(|u| !u.resolved) else {
        return String::new();
    };
    let id = h.execution.execution_id;
    let mut html = String::from("<h2>Waiting on</h2>");
    for i in unit.interactions.iter().filter(|i| i.completion.is_none()) {
        let name = esc(&i.id);
        let _ = write!(
            html,
            "<form class=\"answer\" method=\"post\" action=\"/executions/{id}/interactions/{}\">\
             <b>{name}</b> <textarea name=\"payload\" id=\"payload-{name}\" rows=\"1\" cols=\"40\">{{}}</textarea>\
             <button id=\"approve-{name}\" type=\"submit\" name=\"verdict\" value=\"APPROVED\">Approve</button>\
             <button id=\"reject-{name}\" type=\"submit\" name=\"verdict\" value=\"REJECTED\">Reject</button></form>",
            enc(&i.id),
        );
    }
    if unit.fan_out.is_some() {
        html.push_str("<p>A fan-out: its children answer it as they end.</p>");
    }
    html
}

/// Cancel (while it runs) and re-drive (once it failed).
fn operations(h: &HistoryView) -> String {
    let e = &h.execution;
    let id = e.execution_id;
    match e.status {
        Status::Failed | Status::Dlq => format!(
            "<form method=\"post\" action=\"/executions/{id}/redrive\" class=\"op\">\
             <input name=\"reason\" placeholder=\"why re-drive\" required> \
             <input name=\"release\" placeholder=\"onto release (optional)\"> <button id=\"redrive\" type=\"submit\">Re-drive</button></form>"
        ),
        s if !s.is_terminal() => format!(
            "<form method=\"post\" action=\"/executions/{id}/cancel\" class=\"op\">\
             <input name=\"reason\" placeholder=\"why cancel\" required> <button id=\"cancel\" type=\"submit\">Cancel</button></form>"
        ),
        _ => String::new(),
    }
}

/// Every attempt as a bar between the execution's start and its last entry.
fn timeline(h: &HistoryView) -> String {
    let start = h.execution.created_at;
    let end = h
        .entries
        .iter()
        .map(|e| e.at)
        .chain(h.attempts.iter().filter_map(|a| a.ended_at))
        .max()
        .unwrap_or(start)
        .max(h.execution.updated_at);
    let span = end.since(start).as_millis().max(1) as f64;
    let name = |k: u32| {
        h.steps
            .get(k as usize)
            .map(|s| s.id.clone())
            .unwrap_or_else(|| (k + 1).to_string())
    };
    let mut html = String::from(
        "<h2>Attempts</h2><table id=\"attempts\"><tr><th>Step</th><th>Attempt</th><th>Outcome</th><th>Duration</th><th>Heartbeats</th><th>Launch id</th><th class=\"bar\">Timeline</th></tr>",
    );
    for a in &h.attempts {
        let until = a.ended_at.unwrap_or(end);
        let left = a.started_at.since(start).as_millis() as f64 / span * 100.0;
        let width = (until.since(a.started_at).as_millis() as f64 / span * 100.0).max(0.8);
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td><span class=\"badge o-{o}\">{o}</span>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td>\
             <td class=\"bar\"><div class=\"track\"><div class=\"o-{o}\" style=\"margin-left:{left:.1}%;width:{width:.1}%\"></div></div></td></tr>",
            esc(&name(a.step)),
            a.attempt,
            a.code.as_ref().map(|c| format!(" {}", esc(c))).unwrap_or_default(),
            a.duration_ms.map(|d| format!("{d} ms")).unwrap_or_else(|| "…".into()),
            a.heartbeats,
            a.launch_id,
            o = a.outcome,
        );
    }
    html.push_str("</table>");
    html
}

/// Inputs and outputs: the execution's input, each step's output (the next one's input), the result.
fn values(h: &HistoryView) -> String {
    let mut html = String::from("<h2>Inputs and outputs</h2><dl id=\"values\">");
    let show = |v: &Option<Value>, bytes: usize| match v {
        Some(v) => format!(
            "<pre>{}</pre>",
            esc(&serde_json::to_string_pretty(v).unwrap_or_default())
        ),
        None => format!("<p>{bytes} bytes (too large to keep in the history)</p>"),
    };
    for entry in &h.entries {
        match &entry.what {
            stepline::domain::history::What::Started { input, bytes, .. } => {
                let _ = write!(html, "<dt>input</dt><dd>{}</dd>", show(input, *bytes));
            }
            stepline::domain::history::What::StepSucceeded {
                step,
                attempt,
                output,
                bytes,
            } => {
                let name = h
                    .steps
                    .get(*step as usize)
                    .map(|s| s.id.clone())
                    .unwrap_or_default();
                let _ = write!(
                    html,
                    "<dt>{} output (attempt {attempt})</dt><dd>{}</dd>",
                    esc(&name),
                    show(output, *bytes)
                );
            }
            _ => {}
        }
    }
    if !h.input.is_null() && !h.execution.status.is_terminal() {
        let _ = write!(
            html,
            "<dt>current step's input</dt><dd><pre>{}</pre></dd>",
            esc(&serde_json::to_string_pretty(&h.input).unwrap_or_default())
        );
    }
    if let Some(result) = &h.result {
        let _ = write!(
            html,
            "<dt>result</dt><dd><pre id=\"result\">{}</pre></dd>",
            esc(&serde_json::to_string_pretty(result).unwrap_or_default())
        );
    }
    html.push_str("</dl>");
    html
}

fn layout(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{} · Stepline</title><style>{STYLE}</style></head>\
         <body><header><a href=\"/\"><b>Stepline</b></a> <a href=\"/\">Executions</a> <a href=\"/dlq\">Dead letters</a></header><main>{body}</main></body></html>",
        esc(title)
    )
}

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}\
header{background:#1d2330;padding:10px 20px}header a{color:#fff;margin-right:18px;text-decoration:none}\
main{padding:16px 24px}h1{font-size:20px}h2{font-size:16px;margin-top:22px}code{font-size:12px}\
table{border-collapse:collapse;background:#fff;width:100%}th,td{border-bottom:1px solid #e3e6ea;padding:5px 8px;text-align:left;vertical-align:top}\
pre{margin:0;white-space:pre-wrap;font-size:12px}.filters label{margin-right:12px}.error{color:#b3261e}\
.badge{padding:1px 7px;border-radius:9px;background:#e3e6ea;font-size:12px;font-weight:600}\
.s-SUCCEEDED,.o-SUCCEEDED{background:#c8e6c9}.s-FAILED,.s-DLQ,.o-FAILED{background:#ffcdd2}.s-RUNNING,.o-RUNNING{background:#bbdefb}\
.s-WAITING_EXTERNAL,.o-WAITING{background:#ffe082}.s-WAIT_RETRY{background:#ffcc80}.s-CANCELLED,.o-ABANDONED{background:#cfd8dc}\
#graph{background:#fff;border:1px solid #e3e6ea;border-radius:8px;margin:8px 0}#graph .edge{stroke:#90a4ae;stroke-width:2}#graph .arrow{fill:#90a4ae}\
#graph .name{font-weight:600;font-size:13px}#graph .state{font-size:11px}#graph rect{stroke:#607d8b}\
.st-SUCCEEDED{fill:#a5d6a7}.st-RUNNING{fill:#90caf9}.st-WAITING{fill:#ffd54f}.st-RETRYING{fill:#ffb74d}.st-FAILED{fill:#ef9a9a}\
.st-CANCELLED{fill:#b0bec5}.st-PENDING{fill:#eceff1}.st-QUEUED{fill:#e1f5fe}\
.answer,.op{margin:8px 0}.answer textarea{vertical-align:middle;font-family:monospace}\
.bar{width:35%}.track{background:#eceff1;height:12px;border-radius:6px}.track div{height:12px;border-radius:6px;min-width:3px}\
dl dt{font-weight:600;margin-top:8px}dl dd{margin:2px 0 0 16px}ol#history{font-size:13px}";

/// Whether a request may be served by the console on `port`: its `Host` is the console's, the
/// browser does not say it comes from another site (`Sec-Fetch-Site`: a cross-site image or link to a
/// page that acts, such as the dead letters' which receives them), and a POST comes from the
/// console's own pages (its `Origin`, or else its `Referer`, is the console's).
fn allowed(
    port: u16,
    method: &str,
    host: Option<&str>,
    origin: Option<&str>,
    referer: Option<&str>,
    fetch_site: Option<&str>,
) -> bool {
    let ours = |h: &str| h == format!("127.0.0.1:{port}") || h == format!("localhost:{port}");
    let Some(host) = host.filter(|h| ours(h)) else {
        return false;
    };
    if fetch_site.is_some_and(|site| !matches!(site, "same-origin" | "none")) {
        return false;
    }
    if method == "GET" {
        return true;
    }
    let own = format!("http://{host}");
    match (origin, referer) {
        (Some(origin), _) => origin == own,
        (None, Some(referer)) => referer == own || referer.starts_with(&format!("{own}/")),
        (None, None) => false,
    }
}

fn non_empty(text: String, default: &str) -> String {
    if text.trim().is_empty() {
        default.to_string()
    } else {
        text
    }
}

fn field(form: &HashMap<String, String>, name: &str) -> Option<String> {
    form.get(name).filter(|v| !v.trim().is_empty()).cloned()
}

/// `a=1&b=x+y` as a map, decoded as browsers encode forms (`application/x-www-form-urlencoded`).
fn form_fields(text: &str) -> HashMap<String, String> {
    form_urlencoded::parse(text.as_bytes())
        .into_owned()
        .collect()
}

/// Percent-encodes a query value.
fn enc(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// Escapes text for HTML.
fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests;
