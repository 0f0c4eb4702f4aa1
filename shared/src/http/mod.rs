//! The HTTP API of Stepline (a Lambda function URL, or an API Gateway HTTP API on its `$default` stage;
//! payload format 2.0): submit executions, read their status and result, cancel and re-drive them, list
//! and complete the interactions of an await unit, and register and activate releases.
//!
//! [`handle`] is a plain async function from a `lambda_http::Request` to a response, so the Lambda
//! function (`lambda::serve_http`) and the tests call the same code. An inbound adapter: it decodes,
//! calls the coordinator's use cases and encodes; the status of every error comes from the code
//! catalogue (`domain::Code`). Bodies are JSON with camelCase fields; every error is
//! `{"error": {"code": "...", "message": "..."}}` with a stable code (see `openapi.yaml` at the
//! repository root for every route, body, status and code).
//!
//! The API is protected by IAM (`AuthType: AWS_IAM` on each function URL). Its routes fall to three
//! [`Audience`]s, each deployed as a function URL of its own that serves only its routes (and the
//! reads): whoever may call the submit URL cannot cancel, re-drive, complete interactions or touch
//! releases, and IAM on each URL (`lambda:InvokeFunctionUrl` on its function) decides who is which.

pub use lambda_http;

use lambda_http::http::{header, HeaderValue, Method, StatusCode};
use lambda_http::{Body, Request, Response};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::coordinator::{
    CancelRequest, Coordinator, CoordinatorError, ListRequest, RedriveRequest, SubmitRequest,
    MAX_LIMIT,
};
use crate::domain::release::Release;
use crate::domain::{Code, Execution, Status, StepError, Timestamp, Verdict};
use crate::envelope::{InteractionMessage, INTERACTION_KIND};
use crate::ports::{Registration, StoreError};

/// Request bodies larger than this are refused (`413 BODY_TOO_LARGE`): an execution's input is stored
/// in its DynamoDB item, which is capped at 400 KB.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// The most executions one `POST /executions:batch` submits.
pub const MAX_BATCH_ITEMS: usize = 100;

// ------------------------------------------------------------------------------------------ bodies

mod audiences;
mod bodies;
mod errors;

pub use audiences::{Audience, Audiences};
pub use bodies::*;
pub use errors::{ApiError, ErrorDetail};

/// The routes, with their (raw, still percent-encoded) path parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route<'a> {
    Executions,
    /// `POST /executions:batch`: many submissions, each on its own.
    SubmitBatch,
    /// `GET /executions`: the listing (`POST` submits).
    ListExecutions,
    History(&'a str),
    Execution(&'a str),
    ExecutionResult(&'a str),
    Cancel(&'a str),
    Redrive(&'a str),
    Interactions(&'a str),
    Interaction(&'a str, &'a str),
    Releases,
    Activations(&'a str),
    PipelineReleases(&'a str),
    ActiveRelease(&'a str),
}

impl<'a> Route<'a> {
    fn parse(path: &'a str) -> Option<Self> {
        let path = path.strip_prefix('/')?;
        let path = path.strip_suffix('/').unwrap_or(path);
        let segments: Vec<&str> = path.split('/').collect();
        Some(match segments.as_slice() {
            ["executions"] => Route::Executions,
            ["executions:batch"] => Route::SubmitBatch,
            ["executions", id] => Route::Execution(id),
            ["executions", id, "result"] => Route::ExecutionResult(id),
            ["executions", id, "history"] => Route::History(id),
            ["executions", id, "cancel"] => Route::Cancel(id),
            ["executions", id, "redrive"] => Route::Redrive(id),
            ["executions", id, "interactions"] => Route::Interactions(id),
            ["executions", id, "interactions", interaction] => Route::Interaction(id, interaction),
            ["releases"] => Route::Releases,
            ["pipelines", pipeline, "activations"] => Route::Activations(pipeline),
            ["pipelines", pipeline, "releases"] => Route::PipelineReleases(pipeline),
            ["pipelines", pipeline, "active"] => Route::ActiveRelease(pipeline),
            _ => return None,
        })
    }

    /// Who the route is for; reads other than the interactions (which carry resume tokens) are
    /// served to every audience.
    fn audience(&self) -> Option<Audience> {
        match self {
            Route::Executions | Route::SubmitBatch => Some(Audience::Submit),
            Route::Cancel(_)
            | Route::Redrive(_)
            | Route::Interactions(_)
            | Route::Interaction(..) => Some(Audience::Operate),
            Route::Releases | Route::Activations(_) => Some(Audience::Administer),
            Route::ListExecutions
            | Route::Execution(_)
            | Route::ExecutionResult(_)
            | Route::History(_)
            | Route::PipelineReleases(_)
            | Route::ActiveRelease(_) => None,
        }
    }

    /// Each route takes exactly one method.
    fn method(&self) -> &'static Method {
        match self {
            Route::Execution(_)
            | Route::ListExecutions
            | Route::History(_)
            | Route::ExecutionResult(_)
            | Route::Interactions(_)
            | Route::PipelineReleases(_)
            | Route::ActiveRelease(_) => &Method::GET,
            Route::Executions
            | Route::SubmitBatch
            | Route::Cancel(_)
            | Route::Redrive(_)
            | Route::Interaction(..)
            | Route::Releases
            | Route::Activations(_) => &Method::POST,
        }
    }
}

/// A successful response: status and JSON body (and a `Location`, for created executions).
struct Reply {
    status: StatusCode,
    body: Result<Value, serde_json::Error>,
    location: Option<String>,
}

impl Reply {
    fn new(status: StatusCode, body: &impl Serialize) -> Self {
        Self {
            status,
            body: serde_json::to_value(body),
            location: None,
        }
    }

    fn ok(body: &impl Serialize) -> Self {
        Self::new(StatusCode::OK, body)
    }
}

/// Routes one request, every route served. Never fails: every error becomes its JSON error response.
pub async fn handle(coordinator: &Coordinator, request: Request) -> Response<Body> {
    handle_for(coordinator, Audiences::ALL, request).await
}

/// Routes one request on an endpoint that serves `served`: a route for another audience is refused
/// (`403 NOT_SERVED`) before anything is read or written.
pub async fn handle_for(
    coordinator: &Coordinator,
    served: Audiences,
    request: Request,
) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = match route(coordinator, served, &request).await {
        Ok(Reply {
            status,
            body: Ok(body),
            location,
        }) => {
            let mut response = json_response(status, &body);
            if let Some(value) = location.and_then(|l| HeaderValue::from_str(&l).ok()) {
                response.headers_mut().insert(header::LOCATION, value);
            }
            response
        }
        Ok(Reply { body: Err(e), .. }) => failed(&method, &path, ApiError::Internal(e.to_string())),
        Err(error) => failed(&method, &path, error),
    };
    if response.status().is_success() {
        tracing::info!(%method, %path, status = response.status().as_u16(), "request served");
    }
    response
}

/// Logs a refused (4xx) or failed (5xx) request and renders its error.
fn failed(method: &Method, path: &str, error: ApiError) -> Response<Body> {
    let status = error.status().as_u16();
    if error.status().is_server_error() {
        tracing::warn!(%method, path, status, code = %error.code(), error = %error, "request failed");
    } else {
        tracing::info!(%method, path, status, code = %error.code(), error = %error, "request refused");
    }
    error.into_response()
}

/// Whom a request is for, by its method and path (`None`: a read every endpoint serves, or no route):
/// a gateway in front of several endpoints picks the one to call by it.
pub fn audience_of(method: &Method, path: &str) -> Option<Audience> {
    match Route::parse(path)? {
        Route::Executions if method == Method::GET => None,
        route => route.audience(),
    }
}

async fn route(
    coordinator: &Coordinator,
    served: Audiences,
    request: &Request,
) -> Result<Reply, ApiError> {
    let path = request.uri().path();
    let mut route = Route::parse(path).ok_or_else(|| ApiError::NoRoute(path.to_string()))?;
    if route == Route::Executions && request.method() == Method::GET {
        route = Route::ListExecutions;
    }
    if request.method() != route.method() {
        let allowed = match route {
            // One resource, two routes: submit and list.
            Route::Executions | Route::ListExecutions => "GET, POST",
            _ => route.method().as_str(),
        };
        return Err(ApiError::MethodNotAllowed {
            method: request.method().clone(),
            path: path.to_string(),
            allowed,
        });
    }
    if let Some(wanted) = route.audience().filter(|a| !served.serves(*a)) {
        return Err(ApiError::NotServed {
            method: request.method().clone(),
            path: path.to_string(),
            wanted,
            served,
        });
    }
    match route {
        Route::Executions => submit(coordinator, parse_body(request)?).await,
        Route::SubmitBatch => submit_batch(coordinator, parse_body(request)?).await,
        Route::Execution(id) => status(coordinator, execution_id(id)?).await,
        Route::ListExecutions => {
            let listing = list_request(request.uri().query().unwrap_or(""))?;
            Ok(Reply::ok(&coordinator.list(listing).await?))
        }
        Route::History(id) => Ok(Reply::ok(&coordinator.history(execution_id(id)?).await?)),
        Route::ExecutionResult(id) => result(coordinator, execution_id(id)?).await,
        Route::Cancel(id) => {
            let id = execution_id(id)?;
            cancel(coordinator, id, parse_body(request)?).await
        }
        Route::Redrive(id) => {
            let id = execution_id(id)?;
            redrive(coordinator, id, parse_body(request)?).await
        }
        Route::Interactions(id) => interactions(coordinator, execution_id(id)?).await,
        Route::Interaction(id, interaction) => {
            let id = execution_id(id)?;
            let interaction = name(interaction)?;
            complete(coordinator, id, interaction, parse_body(request)?).await
        }
        Route::Releases => register(coordinator, parse_body(request)?).await,
        Route::Activations(pipeline) => {
            let pipeline = name(pipeline)?;
            activate(coordinator, &pipeline, parse_body(request)?).await
        }
        Route::PipelineReleases(pipeline) => {
            let releases = coordinator.registry().list(&name(pipeline)?).await?;
            Ok(Reply::ok(&releases))
        }
        Route::ActiveRelease(pipeline) => Ok(Reply::ok(
            &coordinator.active_release(&name(pipeline)?).await?,
        )),
    }
}

// ---------------------------------------------------------------------------------------- handlers

async fn submit(coordinator: &Coordinator, body: SubmitBody) -> Result<Reply, ApiError> {
    let submitted = coordinator.submit(body.into_request()).await?;
    let status = if submitted.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let mut reply = Reply::new(
        status,
        &SubmitResponse {
            execution_id: submitted.execution,
            duplicate: submitted.duplicate,
            version: submitted.version,
        },
    );
    reply.location = Some(format!("/executions/{}", submitted.execution));
    Ok(reply)
}

/// Submits each item of a batch on its own: an item that is malformed or refused is reported in its
/// place, with its code, and the others go on.
async fn submit_batch(coordinator: &Coordinator, body: SubmitBatchBody) -> Result<Reply, ApiError> {
    if body.executions.len() > MAX_BATCH_ITEMS {
        return Err(ApiError::InvalidBody(format!(
            "{} executions in one batch: at most {MAX_BATCH_ITEMS}",
            body.executions.len()
        )));
    }
    let mut results: Vec<Option<BatchItem>> = Vec::with_capacity(body.executions.len());
    let mut requests = Vec::new();
    let mut places = Vec::new();
    for (index, item) in body.executions.into_iter().enumerate() {
        match serde_json::from_value::<SubmitBody>(item) {
            Ok(body) => {
                places.push(index);
                requests.push(body.into_request());
                results.push(None);
            }
            Err(e) => results.push(Some(BatchItem::refused(
                index,
                ApiError::InvalidBody(e.to_string()),
            ))),
        }
    }
    for (index, submitted) in places
        .into_iter()
        .zip(coordinator.submit_many(requests).await)
    {
        results[index] = Some(match submitted {
            Ok(submitted) => BatchItem::Submitted {
                index,
                execution_id: submitted.execution,
                duplicate: submitted.duplicate,
                version: submitted.version,
            },
            Err(e) => BatchItem::refused(index, e.into()),
        });
    }
    let results: Vec<BatchItem> = results.into_iter().flatten().collect();
    let refused = results
        .iter()
        .filter(|r| matches!(r, BatchItem::Refused { .. }))
        .count();
    Ok(Reply::ok(&SubmitBatchResponse {
        submitted: results.len() - refused,
        refused,
        results,
    }))
}

async fn status(coordinator: &Coordinator, id: Uuid) -> Result<Reply, ApiError> {
    let record = coordinator.get(id).await?;
    // The step id is a convenience: a record whose release cannot be read is still reported.
    let step_id = match coordinator
        .definition(&record.pipeline_id, &record.release_version)
        .await
    {
        Ok(definition) => definition.step(record.step).map(|s| s.id.clone()),
        Err(e) => {
            tracing::warn!(execution_id = %id, code = %e.code(), error = %e, "no definition for the status view");
            None
        }
    };
    Ok(Reply::ok(&view(record, step_id)))
}

fn view(record: Execution, step_id: Option<String>) -> ExecutionView {
    ExecutionView {
        execution_id: record.id,
        tenant: record.tenant,
        pipeline_id: record.pipeline_id,
        release_version: record.release_version,
        contract_version: record.contract_version,
        status: record.status,
        step: record.step,
        step_id,
        attempt: record.attempt,
        version: record.version,
        created_at: record.created_at,
        updated_at: record.updated_at,
        error: record.error,
    }
}

async fn result(coordinator: &Coordinator, id: Uuid) -> Result<Reply, ApiError> {
    let record = coordinator.get(id).await?;
    match record.status {
        Status::Succeeded => Ok(Reply::ok(&ResultView {
            execution_id: record.id,
            status: record.status,
            result: record
                .result
                .map(|payload| payload.value().clone())
                .unwrap_or_default(),
        })),
        status if status.is_terminal() => Err(ApiError::NotSucceeded(status)),
        status => Err(ApiError::NotFinished(status)),
    }
}

async fn cancel(coordinator: &Coordinator, id: Uuid, body: CancelBody) -> Result<Reply, ApiError> {
    let request = CancelRequest {
        execution_id: id,
        reason: body.reason,
    };
    Ok(Reply::ok(&coordinator.cancel(request).await?))
}

async fn redrive(
    coordinator: &Coordinator,
    id: Uuid,
    body: RedriveBody,
) -> Result<Reply, ApiError> {
    let request = RedriveRequest {
        execution_id: id,
        expected_version: body.expected_version,
        reason: body.reason,
        release_version: body.release_version,
    };
    Ok(Reply::ok(&coordinator.redrive(request).await?))
}

/// The interactions of the await unit the execution is waiting on (none when it is not waiting).
async fn interactions(coordinator: &Coordinator, id: Uuid) -> Result<Reply, ApiError> {
    let record = coordinator.get(id).await?;
    let pending: Vec<InteractionView> = match &record.await_unit {
        Some(unit) if !unit.resolved && record.status == Status::WaitingExternal => unit
            .interactions
            .iter()
            .map(|i| InteractionView {
                interaction_id: i.id.clone(),
                idempotency_key: i.idempotency_key.clone(),
                token: i.token.clone(),
                deadline: unit.deadline,
                completed: i.completion.is_some(),
            })
            .collect(),
        _ => Vec::new(),
    };
    Ok(Reply::ok(&pending))
}

async fn complete(
    coordinator: &Coordinator,
    id: Uuid,
    interaction: String,
    body: CompleteBody,
) -> Result<Reply, ApiError> {
    let message = InteractionMessage {
        kind: INTERACTION_KIND.to_string(),
        execution_id: id,
        interaction: interaction.clone(),
        token: body.token,
        verdict: body.verdict,
        payload: body.payload,
        unit: None,
    };
    // Commits and carries out what the commit decided (the next step's launch, a dead letter).
    let applied = coordinator.complete_interaction(message).await?;
    let duplicate = !applied.committed();
    let record = applied.record();
    Ok(Reply::ok(&CompletionResponse {
        execution_id: record.id,
        interaction_id: interaction,
        status: record.status,
        version: record.version,
        duplicate,
    }))
}

async fn register(coordinator: &Coordinator, release: Release) -> Result<Reply, ApiError> {
    let (status, registration) = match coordinator.register_release(&release).await? {
        Registration::Created => (StatusCode::CREATED, "CREATED"),
        Registration::Unchanged => (StatusCode::OK, "UNCHANGED"),
    };
    Ok(Reply::new(
        status,
        &RegistrationResponse {
            pipeline_id: release.pipeline_id,
            release_version: release.release_version,
            contract_version: release.contract_version,
            registration: registration.to_string(),
        },
    ))
}

async fn activate(
    coordinator: &Coordinator,
    pipeline: &str,
    body: ActivateBody,
) -> Result<Reply, ApiError> {
    let activation = coordinator
        .activate_release(pipeline, &body.release_version, &body.reason)
        .await?;
    Ok(Reply::new(StatusCode::CREATED, &activation))
}

// ----------------------------------------------------------------------------------------- helpers

fn parse_body<T: DeserializeOwned>(request: &Request) -> Result<T, ApiError> {
    let bytes = request.body().as_ref();
    if bytes.len() > MAX_BODY_BYTES {
        return Err(ApiError::BodyTooLarge {
            bytes: bytes.len(),
            limit: MAX_BODY_BYTES,
        });
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::InvalidBody(e.to_string()))
}

/// The listing's query parameters: `pipeline` (required), `status` (comma-separated or repeated),
/// `tenant`, `from` and `to` (epoch ms, `to` exclusive), `limit` (default 50) and `after` (a page's
/// `next`).
pub fn list_request(query: &str) -> Result<ListRequest, ApiError> {
    let invalid = |what: String| ApiError::Coordinator(CoordinatorError::Invalid(what));
    let mut request = ListRequest {
        limit: 50,
        ..ListRequest::default()
    };
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = decode(&value.replace('+', " "))
            .ok_or_else(|| invalid(format!("query parameter {key} is not encoded")))?;
        let number = |v: &str| {
            v.parse::<i64>()
                .map_err(|_| invalid(format!("{key} must be a number, not {v:?}")))
        };
        match key {
            "pipeline" | "pipelineId" => request.pipeline_id = value,
            "status" => {
                // Exactly as the spec's pattern: upper-case names, commas between them.
                for status in value.split(',').filter(|_| !value.is_empty()) {
                    let parsed = serde_json::from_value(Value::String(status.to_string()))
                        .map_err(|_| invalid(format!("no status {status:?}")))?;
                    request.statuses.push(parsed);
                }
            }
            // An empty optional parameter is one not given.
            "tenant" => request.tenant = Some(value).filter(|v| !v.is_empty()),
            "from" => request.from = Some(Timestamp::from_millis(number(&value)?)),
            "to" => request.to = Some(Timestamp::from_millis(number(&value)?)),
            "limit" => {
                request.limit = usize::try_from(number(&value)?)
                    .ok()
                    .filter(|n| (1..=MAX_LIMIT).contains(n))
                    .ok_or_else(|| {
                        invalid(format!("limit is from 1 to {MAX_LIMIT}, not {value}"))
                    })?
            }
            "after" => request.after = Some(value).filter(|v| !v.is_empty()),
            other => return Err(invalid(format!("unknown query parameter {other:?}"))),
        }
    }
    if request.pipeline_id.is_empty() {
        return Err(invalid("the pipeline query parameter is required".into()));
    }
    Ok(request)
}

/// An execution id path parameter.
fn execution_id(raw: &str) -> Result<Uuid, ApiError> {
    decode(raw)
        .and_then(|text| Uuid::parse_str(&text).ok())
        .ok_or_else(|| ApiError::InvalidId(raw.to_string()))
}

/// A pipeline or interaction id path parameter: percent-decoded, not empty.
fn name(raw: &str) -> Result<String, ApiError> {
    decode(raw)
        .filter(|text| !text.is_empty())
        .ok_or_else(|| ApiError::InvalidId(raw.to_string()))
}

/// Percent-decodes a path segment (`None` if an escape is malformed or the result is not UTF-8).
fn decode(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn json_response(status: StatusCode, body: &impl Serialize) -> Response<Body> {
    // Serializing a `Value` or the error body cannot fail.
    let text = serde_json::to_string(body).unwrap_or_else(|_| {
        r#"{"error":{"code":"INTERNAL","message":"the response could not be encoded"}}"#.into()
    });
    let mut response = Response::new(Body::from(text));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_parse_with_their_parameters() {
        assert_eq!(Route::parse("/executions"), Some(Route::Executions));
        assert_eq!(Route::parse("/executions/"), Some(Route::Executions));
        assert_eq!(
            Route::parse("/executions/abc/interactions/manager"),
            Some(Route::Interaction("abc", "manager"))
        );
        assert_eq!(
            Route::parse("/pipelines/orders/active"),
            Some(Route::ActiveRelease("orders"))
        );
        assert_eq!(
            Route::parse("/executions/x/history"),
            Some(Route::History("x"))
        );
        assert_eq!(Route::parse("/executions/a/b"), None);
        assert_eq!(Route::parse("executions"), None);
        assert_eq!(Route::parse("/"), None);
    }

    #[test]
    fn an_endpoint_told_nothing_serves_nothing() {
        let refused = Audiences::configured(None).unwrap_err();
        assert!(refused.contains("API_AUDIENCES"), "{refused}");
    }

    #[test]
    fn audiences_parse_and_each_route_has_its_own() {
        assert_eq!(Audiences::parse("all"), Ok(Audiences::ALL));
        assert_eq!(
            Audiences::parse("submit, operate,administer"),
            Ok(Audiences::ALL)
        );
        let submit = Audiences::parse("submit").unwrap();
        assert!(submit.serves(Audience::Submit) && !submit.serves(Audience::Operate));
        assert_eq!(submit, Audiences::only(Audience::Submit));
        assert_eq!(submit.to_string(), "submit");
        assert!(Audiences::parse("").is_err());
        assert!(Audiences::parse("admin").is_err());
        assert_eq!(
            Audiences::configured(Some("operate")),
            Ok(Audiences::only(Audience::Operate))
        );
        assert_eq!(Route::Executions.audience(), Some(Audience::Submit));
        assert_eq!(Route::Releases.audience(), Some(Audience::Administer));
        assert_eq!(
            Route::Activations("p").audience(),
            Some(Audience::Administer)
        );
        assert_eq!(Route::Redrive("x").audience(), Some(Audience::Operate));
        assert_eq!(Route::Interactions("x").audience(), Some(Audience::Operate));
        assert_eq!(Route::Execution("x").audience(), None);
    }

    #[test]
    fn path_segments_are_percent_decoded() {
        assert_eq!(decode("a%20b").as_deref(), Some("a b"));
        assert_eq!(decode("%e2%82%AC").as_deref(), Some("€"));
        assert_eq!(decode("%2"), None);
        assert_eq!(decode("%+1"), None);
        assert_eq!(decode("%ff"), None);
        assert!(name("").is_err());
        assert!(execution_id("not-a-uuid").is_err());
        let id = Uuid::new_v4();
        assert_eq!(execution_id(&id.to_string()).unwrap(), id);
    }

    #[test]
    fn the_listing_reads_its_query_parameters() {
        let r = list_request(
            "pipeline=orders&status=FAILED,DLQ&tenant=a%20b&from=1&to=9&limit=200&after=x.y",
        )
        .unwrap();
        assert_eq!(r.pipeline_id, "orders");
        assert_eq!(r.statuses, [Status::Failed, Status::Dlq]);
        assert_eq!(r.tenant.as_deref(), Some("a b"));
        assert_eq!(
            (r.from, r.to, r.limit),
            (
                Some(Timestamp::from_millis(1)),
                Some(Timestamp::from_millis(9)),
                MAX_LIMIT
            )
        );
        assert_eq!(r.after.as_deref(), Some("x.y"));
        assert_eq!(list_request("pipeline=orders").unwrap().limit, 50);
        let blank = list_request("pipeline=orders&tenant=&after=").unwrap();
        assert_eq!((blank.tenant, blank.after), (None, None));
        for bad in [
            "status=FAILED",
            "pipeline=o&status=NOPE",
            "pipeline=o&colour=red",
            "pipeline=o&from=soon",
            "pipeline=o&limit=0",
            "pipeline=o&limit=-89667",
            "pipeline=o&limit=201",
            "pipeline=o&status=dlq",
            "pipeline=o&status=FAILED,,DLQ",
        ] {
            let error = list_request(bad).unwrap_err();
            assert_eq!(error.code(), Code::InvalidRequest, "{bad}");
        }
    }

    #[test]
    fn openapi_documents_every_route() {
        let spec = include_str!("../../../openapi.yaml");
        for path in [
            "/executions:",
            "/executions:batch:",
            "/executions/{executionId}:",
            "/executions/{executionId}/result:",
            "/executions/{executionId}/history:",
            "/executions/{executionId}/cancel:",
            "/executions/{executionId}/redrive:",
            "/executions/{executionId}/interactions:",
            "/executions/{executionId}/interactions/{interactionId}:",
            "/releases:",
            "/pipelines/{pipelineId}/activations:",
            "/pipelines/{pipelineId}/releases:",
            "/pipelines/{pipelineId}/active:",
        ] {
            assert!(spec.contains(&format!("\n  {path}\n")), "{path}");
        }
    }
}
