//! The HTTP API of Stepline (a Lambda function URL, or an API Gateway HTTP API on its `$default` stage;
//! payload format 2.0): submit executions, read their status and result, cancel and re-drive them, list
//! and complete the interactions of an await unit, and register and activate releases.
//!
//! [`handle`] is a plain async function from a `lambda_http::Request` to a response, so the Lambda binary
//! (`main.rs`) and the tests call the same code. Bodies are JSON with camelCase fields; every error is
//! `{"error": {"code": "...", "message": "..."}}` with a stable code (see `openapi.yaml` at the
//! repository root for every route, body, status and code).
//!
//! The API is protected by IAM (`AuthType: AWS_IAM` on the function URL): whoever may call it may act
//! on every execution, which is why `GET /executions/{id}/interactions` returns resume tokens.

pub use lambda_http;

use lambda_http::http::{header, HeaderValue, Method, StatusCode};
use lambda_http::{Body, Request, Response};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use stepline::domain::{Execution, Status, StepError, Verdict};
use stepline::envelope::{InteractionMessage, INTERACTION_KIND};
use stepline::handlers::{self, CancelRequest, RedriveRequest};
use stepline::ports::{Registration, StoreError};
use stepline::release::Release;
use stepline::{Applied, Coordinator, CoordinatorError, SubmitRequest};
use uuid::Uuid;

/// Request bodies larger than this are refused (`413 BODY_TOO_LARGE`): an execution's input is stored
/// in its DynamoDB item, which is capped at 400 KB.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// Why a request was refused. Each variant has a stable code and an HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("no route for {0}")]
    NoRoute(String),
    #[error("{method} is not allowed on {path} (allowed: {allowed})")]
    MethodNotAllowed {
        method: Method,
        path: String,
        allowed: Method,
    },
    #[error("malformed id {0:?}")]
    InvalidId(String),
    #[error("{0}")]
    InvalidBody(String),
    #[error("the body has {bytes} bytes, more than the {limit} allowed")]
    BodyTooLarge { bytes: usize, limit: usize },
    #[error("inconsistent release descriptor: {0}")]
    InvalidRelease(String),
    #[error("pipeline {pipeline_id} release {release_version} is already registered with another descriptor")]
    ReleaseConflict {
        pipeline_id: String,
        release_version: String,
    },
    #[error("concurrent activations of pipeline {0} kept winning the append; try again")]
    ActivationContention(String),
    #[error("execution is {0}: it has no result yet")]
    NotFinished(Status),
    #[error("execution ended {0}: it has no result")]
    NotSucceeded(Status),
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
    #[error("the response could not be encoded: {0}")]
    Internal(String),
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        ApiError::Coordinator(err.into())
    }
}

impl ApiError {
    /// Stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::NoRoute(_) => "NO_ROUTE",
            ApiError::MethodNotAllowed { .. } => "METHOD_NOT_ALLOWED",
            ApiError::InvalidId(_) => "INVALID_ID",
            ApiError::InvalidBody(_) => "INVALID_BODY",
            ApiError::BodyTooLarge { .. } => "BODY_TOO_LARGE",
            ApiError::InvalidRelease(_) => "INVALID_RELEASE",
            ApiError::ReleaseConflict { .. } => "RELEASE_CONFLICT",
            ApiError::ActivationContention(_) => "CONTENTION",
            ApiError::NotFinished(_) => "NOT_FINISHED",
            ApiError::NotSucceeded(_) => "NOT_SUCCEEDED",
            ApiError::Coordinator(e) => e.code(),
            ApiError::Internal(_) => "INTERNAL",
        }
    }

    /// HTTP status of the error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::NoRoute(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::InvalidId(_) | ApiError::InvalidBody(_) | ApiError::InvalidRelease(_) => {
                StatusCode::BAD_REQUEST
            }
            ApiError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::ReleaseConflict { .. }
            | ApiError::NotFinished(_)
            | ApiError::NotSucceeded(_) => StatusCode::CONFLICT,
            ApiError::ActivationContention(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Coordinator(e) => coordinator_status(e.code()),
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn into_response(self) -> Response<Body> {
        let status = self.status();
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code(),
                message: self.to_string(),
            },
        };
        let mut response = json_response(status, &body);
        let headers = response.headers_mut();
        if let ApiError::MethodNotAllowed { allowed, .. } = &self {
            if let Ok(value) = HeaderValue::from_str(allowed.as_str()) {
                headers.insert(header::ALLOW, value);
            }
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// HTTP status of a coordinator error code.
fn coordinator_status(code: &str) -> StatusCode {
    match code {
        "INVALID_REQUEST" => StatusCode::BAD_REQUEST,
        "INVALID_TOKEN" => StatusCode::FORBIDDEN,
        "NOT_FOUND" | "UNKNOWN_INTERACTION" | "UNKNOWN_RELEASE" | "NO_ACTIVE_RELEASE" => {
            StatusCode::NOT_FOUND
        }
        "VERSION_CONFLICT"
        | "INTERACTION_CONFLICT"
        | "RECEIPT_CONFLICT"
        | "ALREADY_TERMINAL"
        | "NOT_REDRIVABLE"
        | "NOT_WAITING"
        | "AWAIT_EXPIRED"
        | "UNKNOWN_CORRELATION" => StatusCode::CONFLICT,
        "STORE_UNAVAILABLE" | "CONTENTION" => StatusCode::SERVICE_UNAVAILABLE,
        // CORRUPT_RECORD, and anything new.
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[derive(Serialize)]
struct ErrorBody {
    error: ErrorDetail,
}

#[derive(Serialize)]
struct ErrorDetail {
    code: &'static str,
    message: String,
}

// ------------------------------------------------------------------------------------------ bodies

/// `POST /executions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubmitBody {
    pub pipeline_id: String,
    pub tenant: String,
    pub input: Value,
    /// The same key (same tenant and pipeline) returns the first execution.
    #[serde(default)]
    pub idempotency_key: Option<String>,
    /// Defaults to the pipeline's active release.
    #[serde(default)]
    pub release_version: Option<String>,
}

/// `POST /executions/{id}/cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CancelBody {
    pub reason: String,
}

/// `POST /executions/{id}/redrive`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RedriveBody {
    pub expected_version: u64,
    pub reason: String,
}

/// `POST /executions/{id}/interactions/{interactionId}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CompleteBody {
    pub token: String,
    pub verdict: Verdict,
    #[serde(default)]
    pub payload: Value,
}

/// `POST /pipelines/{pipelineId}/activations`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ActivateBody {
    pub release_version: String,
    pub reason: String,
}

// --------------------------------------------------------------------------------------- responses

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubmitResponse {
    pub execution_id: Uuid,
    pub duplicate: bool,
    pub version: u64,
}

/// `GET /executions/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionView {
    pub execution_id: Uuid,
    pub tenant: String,
    pub pipeline_id: String,
    pub release_version: String,
    pub contract_version: String,
    pub status: Status,
    /// Index of the current step.
    pub step: u32,
    /// Id of the current step (absent past the last step or if the release cannot be read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_id: Option<String>,
    pub attempt: u32,
    pub version: u64,
    /// Epoch milliseconds.
    pub created_at: i64,
    pub updated_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StepError>,
}

/// `GET /executions/{id}/result`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResultView {
    pub execution_id: Uuid,
    pub status: Status,
    pub result: Value,
}

/// Cancel and re-drive responses: the execution after the change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionState {
    pub execution_id: Uuid,
    pub status: Status,
    pub version: u64,
}

/// `GET /executions/{id}/interactions` (one entry per interaction of the pending await unit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InteractionView {
    pub interaction_id: String,
    pub idempotency_key: String,
    /// The resume token a completion must present.
    pub token: String,
    /// Epoch milliseconds; past it the await step fails with `AWAIT_TIMEOUT`.
    pub deadline: i64,
    pub completed: bool,
}

/// `POST /executions/{id}/interactions/{interactionId}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CompletionResponse {
    pub execution_id: Uuid,
    pub interaction_id: String,
    pub status: Status,
    pub version: u64,
    /// The same answer was already recorded: nothing changed.
    pub duplicate: bool,
}

/// `POST /releases`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegistrationResponse {
    pub pipeline_id: String,
    pub release_version: String,
    pub contract_version: String,
    /// `CREATED` or `UNCHANGED` (the identical descriptor was already registered).
    pub registration: String,
}

// ------------------------------------------------------------------------------------------ routes

/// The routes, with their (raw, still percent-encoded) path parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route<'a> {
    Executions,
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
            ["executions", id] => Route::Execution(id),
            ["executions", id, "result"] => Route::ExecutionResult(id),
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

    /// Each route takes exactly one method.
    fn method(&self) -> Method {
        match self {
            Route::Execution(_)
            | Route::ExecutionResult(_)
            | Route::Interactions(_)
            | Route::PipelineReleases(_)
            | Route::ActiveRelease(_) => Method::GET,
            Route::Executions
            | Route::Cancel(_)
            | Route::Redrive(_)
            | Route::Interaction(..)
            | Route::Releases
            | Route::Activations(_) => Method::POST,
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

/// Routes one request. Never fails: every error becomes its JSON error response.
pub async fn handle(coordinator: &Coordinator, request: Request) -> Response<Body> {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = match route(coordinator, &request).await {
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
        tracing::warn!(%method, path, status, code = error.code(), error = %error, "request failed");
    } else {
        tracing::info!(%method, path, status, code = error.code(), error = %error, "request refused");
    }
    error.into_response()
}

async fn route(coordinator: &Coordinator, request: &Request) -> Result<Reply, ApiError> {
    let path = request.uri().path();
    let route = Route::parse(path).ok_or_else(|| ApiError::NoRoute(path.to_string()))?;
    let allowed = route.method();
    if request.method() != allowed {
        return Err(ApiError::MethodNotAllowed {
            method: request.method().clone(),
            path: path.to_string(),
            allowed,
        });
    }
    match route {
        Route::Executions => submit(coordinator, parse_body(request)?).await,
        Route::Execution(id) => status(coordinator, execution_id(id)?).await,
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
        Route::ActiveRelease(pipeline) => {
            let pipeline = name(pipeline)?;
            let active = coordinator
                .registry()
                .active(&pipeline)
                .await?
                .ok_or(CoordinatorError::NoActiveRelease(pipeline))?;
            Ok(Reply::ok(&active))
        }
    }
}

// ---------------------------------------------------------------------------------------- handlers

async fn submit(coordinator: &Coordinator, body: SubmitBody) -> Result<Reply, ApiError> {
    let submitted = coordinator
        .submit(SubmitRequest {
            pipeline_id: body.pipeline_id,
            release_version: body.release_version,
            tenant: body.tenant,
            input: body.input,
            idempotency_key: body.idempotency_key,
            parent: None,
        })
        .await?;
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

async fn status(coordinator: &Coordinator, id: Uuid) -> Result<Reply, ApiError> {
    let record = coordinator.get(id).await?;
    // The step id is a convenience: a record whose release cannot be read is still reported.
    let step_id = match coordinator
        .definition(&record.pipeline_id, &record.release_version)
        .await
    {
        Ok(definition) => definition.step(record.step).map(|s| s.id.clone()),
        Err(e) => {
            tracing::warn!(execution_id = %id, code = e.code(), error = %e, "no definition for the status view");
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
    require_reason(&body.reason, "a cancellation")?;
    let response = handlers::cancel(
        coordinator,
        CancelRequest {
            execution_id: id,
            reason: body.reason,
        },
    )
    .await?;
    Ok(Reply::ok(&ExecutionState {
        execution_id: response.execution_id,
        status: response.status,
        version: response.version,
    }))
}

async fn redrive(
    coordinator: &Coordinator,
    id: Uuid,
    body: RedriveBody,
) -> Result<Reply, ApiError> {
    let response = handlers::redrive(
        coordinator,
        RedriveRequest {
            execution_id: id,
            expected_version: body.expected_version,
            reason: body.reason,
        },
    )
    .await?;
    Ok(Reply::ok(&ExecutionState {
        execution_id: response.execution_id,
        status: response.status,
        version: response.version,
    }))
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
    };
    // Commits and carries out what the commit decided (the next step's launch, a dead letter).
    let applied = handlers::complete_interaction(coordinator, message).await?;
    let duplicate = matches!(applied, Applied::Skipped { .. });
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
    release.validate().map_err(ApiError::InvalidRelease)?;
    let registration = match coordinator.registry().register(&release).await {
        Ok(registration) => registration,
        Err(StoreError::Conflict) => {
            return Err(ApiError::ReleaseConflict {
                pipeline_id: release.pipeline_id,
                release_version: release.release_version,
            })
        }
        Err(e) => return Err(e.into()),
    };
    let (status, registration) = match registration {
        Registration::Created => (StatusCode::CREATED, "CREATED"),
        Registration::Unchanged => (StatusCode::OK, "UNCHANGED"),
    };
    tracing::info!(pipeline = %release.pipeline_id, release = %release.release_version, registration, "release registered");
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
    require_reason(&body.reason, "an activation")?;
    let activation = coordinator
        .registry()
        .activate(
            pipeline,
            &body.release_version,
            coordinator.now(),
            &body.reason,
        )
        .await
        .map_err(|e| match e {
            StoreError::Missing(_) => CoordinatorError::UnknownRelease {
                pipeline_id: pipeline.to_string(),
                release_version: body.release_version.clone(),
            }
            .into(),
            // The registry re-reads and retries lost appends itself; still losing is contention.
            StoreError::Conflict => ApiError::ActivationContention(pipeline.to_string()),
            other => other.into(),
        })?;
    tracing::info!(pipeline, release = %activation.release_version, sequence = activation.sequence, "release activated");
    Ok(Reply::new(StatusCode::CREATED, &activation))
}

// ----------------------------------------------------------------------------------------- helpers

fn require_reason(reason: &str, what: &str) -> Result<(), ApiError> {
    if reason.trim().is_empty() {
        return Err(CoordinatorError::Invalid(format!("{what} needs a reason")).into());
    }
    Ok(())
}

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
        assert_eq!(Route::parse("/executions/a/b"), None);
        assert_eq!(Route::parse("executions"), None);
        assert_eq!(Route::parse("/"), None);
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
    fn openapi_documents_every_route_and_code() {
        let spec = include_str!("../../../openapi.yaml");
        for path in [
            "/executions:",
            "/executions/{executionId}:",
            "/executions/{executionId}/result:",
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
        let status = Status::Queued;
        let errors = [
            ApiError::NoRoute(String::new()),
            ApiError::MethodNotAllowed {
                method: Method::GET,
                path: String::new(),
                allowed: Method::POST,
            },
            ApiError::InvalidId(String::new()),
            ApiError::InvalidBody(String::new()),
            ApiError::BodyTooLarge { bytes: 0, limit: 0 },
            ApiError::InvalidRelease(String::new()),
            ApiError::ReleaseConflict {
                pipeline_id: String::new(),
                release_version: String::new(),
            },
            ApiError::ActivationContention(String::new()),
            ApiError::NotFinished(status),
            ApiError::NotSucceeded(status),
            ApiError::Internal(String::new()),
        ];
        let codes = errors.iter().map(ApiError::code).chain([
            "NOT_FOUND",
            "UNKNOWN_INTERACTION",
            "UNKNOWN_RELEASE",
            "NO_ACTIVE_RELEASE",
            "INVALID_REQUEST",
            "INVALID_TOKEN",
            "VERSION_CONFLICT",
            "INTERACTION_CONFLICT",
            "RECEIPT_CONFLICT",
            "UNKNOWN_CORRELATION",
            "ALREADY_TERMINAL",
            "NOT_REDRIVABLE",
            "NOT_WAITING",
            "AWAIT_EXPIRED",
            "STORE_UNAVAILABLE",
            "CONTENTION",
            "CORRUPT_RECORD",
        ]);
        for code in codes {
            assert!(
                spec.contains(&format!("- {code}\n")),
                "{code} in the Error enum"
            );
        }
    }

    #[test]
    fn every_coordinator_code_has_its_status() {
        for (code, status) in [
            ("NOT_FOUND", 404),
            ("UNKNOWN_INTERACTION", 404),
            ("UNKNOWN_RELEASE", 404),
            ("NO_ACTIVE_RELEASE", 404),
            ("INVALID_REQUEST", 400),
            ("INVALID_TOKEN", 403),
            ("VERSION_CONFLICT", 409),
            ("INTERACTION_CONFLICT", 409),
            ("RECEIPT_CONFLICT", 409),
            ("ALREADY_TERMINAL", 409),
            ("NOT_REDRIVABLE", 409),
            ("NOT_WAITING", 409),
            ("AWAIT_EXPIRED", 409),
            ("STORE_UNAVAILABLE", 503),
            ("CONTENTION", 503),
            ("CORRUPT_RECORD", 500),
        ] {
            assert_eq!(coordinator_status(code).as_u16(), status, "{code}");
        }
    }
}
