//! The HTTP API on loopback, as its Lambda function URLs serve it: each HTTP request becomes a function
//! URL event (payload format 2.0: lower-case headers, cookies apart, the raw and the parsed query
//! string, a body base64-encoded unless it is text), decoded by the Lambda runtime's own request type
//! and handed to the handler of the endpoint that serves the route (submit, operate or administer,
//! each with its function's coordinator); the handler's response goes back as the URL sends it.
//! Nothing authenticates a caller (a function URL checks SigV4): it listens on loopback only.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{ensure, Result};
use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{json, Map, Value};
use stepline::http::lambda_http::{self, Body};
use stepline::http::{audience_of, Audience, Audiences};
use stepline::Coordinator;
use tokio::net::TcpListener;

use crate::LocalStack;

/// The three endpoints, each with the coordinator of the function that serves it.
struct Endpoints {
    submit: Coordinator,
    operate: Coordinator,
    administer: Coordinator,
}

impl Endpoints {
    fn of(&self, audience: Option<Audience>) -> (&Coordinator, Audiences) {
        match audience {
            Some(Audience::Operate) => (&self.operate, Audiences::only(Audience::Operate)),
            Some(Audience::Administer) => (&self.administer, Audiences::only(Audience::Administer)),
            Some(Audience::Submit) | None => (&self.submit, Audiences::only(Audience::Submit)),
        }
    }
}

/// Binds `address` (a loopback one) and serves the stage's API there until the task is dropped.
pub async fn start(local: &LocalStack, address: SocketAddr) -> Result<SocketAddr> {
    loopback(address)?;
    let endpoints = Arc::new(Endpoints {
        submit: local.coordinator(crate::functions::API)?,
        operate: local.coordinator(crate::functions::OPERATOR_API)?,
        administer: local.coordinator(crate::functions::ADMIN_API)?,
    });
    let listener = TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    let app = axum::Router::new()
        .fallback(forward)
        // The handler refuses bodies over its own limit, with its own code.
        .layer(DefaultBodyLimit::disable())
        .with_state(endpoints);
    tokio::spawn(async move {
        let served = app.into_make_service_with_connect_info::<SocketAddr>();
        if let Err(e) = axum::serve(listener, served).await {
            tracing::error!(error = %e, "the local API stopped");
        }
    });
    Ok(bound)
}

/// Refuses an address other machines could reach.
fn loopback(address: SocketAddr) -> Result<()> {
    ensure!(
        address.ip().is_loopback(),
        "the local API authenticates no one: serve it on a loopback address, not {address}"
    );
    Ok(())
}

async fn forward(
    State(endpoints): State<Arc<Endpoints>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let event = function_url_event(&method, &uri, &headers, &body, peer);
    let request = match lambda_http::request::from_str(&event.to_string()) {
        Ok(request) => request,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let (coordinator, served) = endpoints.of(audience_of(&method, uri.path()));
    let response = stepline::http::handle_for(coordinator, served, request).await;
    let (parts, body) = response.into_parts();
    let bytes = match body {
        Body::Empty => Vec::new(),
        Body::Text(text) => text.into_bytes(),
        Body::Binary(bytes) => bytes,
        _ => Vec::new(),
    };
    (parts.status, parts.headers, bytes).into_response()
}

/// Whether a body of this content type is sent as text (otherwise base64), as function URLs decide.
fn is_text(content_type: Option<&str>) -> bool {
    let Some(kind) = content_type.map(|c| c.split(';').next().unwrap_or("").trim().to_lowercase())
    else {
        return true;
    };
    kind.starts_with("text/")
        || kind.ends_with("/json")
        || kind.ends_with("+json")
        || kind.ends_with("/xml")
        || kind.ends_with("+xml")
        || kind == "application/javascript"
        || kind == "application/x-www-form-urlencoded"
}

/// The function URL event (payload format 2.0) for one HTTP request.
pub fn function_url_event(
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
    peer: SocketAddr,
) -> Value {
    let mut shown = Map::new();
    let mut cookies = Vec::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        if name == header::COOKIE {
            cookies.extend(value.split(';').map(|c| c.trim().to_string()));
            continue;
        }
        match shown.get_mut(name.as_str()) {
            Some(Value::String(joined)) => {
                joined.push(',');
                joined.push_str(&value);
            }
            _ => {
                shown.insert(name.as_str().to_string(), Value::String(value));
            }
        }
    }
    let raw_query = uri.query().unwrap_or("");
    let mut parameters = Map::new();
    for (name, value) in form_urlencoded::parse(raw_query.as_bytes()) {
        match parameters.get_mut(name.as_ref()) {
            Some(Value::String(joined)) => {
                joined.push(',');
                joined.push_str(&value);
            }
            _ => {
                parameters.insert(name.into_owned(), Value::String(value.into_owned()));
            }
        }
    }
    let text = is_text(
        headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    );
    let (body, encoded) = match std::str::from_utf8(body) {
        Ok(body) if text => (body.to_string(), false),
        _ => (base64::engine::general_purpose::STANDARD.encode(body), true),
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("localhost");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut event = json!({
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": uri.path(),
        "rawQueryString": raw_query,
        "headers": shown,
        "requestContext": {
            "accountId": "anonymous",
            "apiId": "local",
            "domainName": host,
            "domainPrefix": host.split('.').next().unwrap_or(host),
            "http": {
                "method": method.as_str(),
                "path": uri.path(),
                "protocol": "HTTP/1.1",
                "sourceIp": peer.ip().to_string(),
                "userAgent": headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or(""),
            },
            "requestId": uuid::Uuid::new_v4().to_string(),
            "routeKey": "$default",
            "stage": "$default",
            "timeEpoch": now.as_millis() as u64,
        },
        "isBase64Encoded": encoded,
    });
    if !cookies.is_empty() {
        event["cookies"] = json!(cookies);
    }
    if !parameters.is_empty() {
        event["queryStringParameters"] = Value::Object(parameters);
    }
    if !body.is_empty() || encoded {
        event["body"] = Value::String(body);
    }
    event
}

#[cfg(test)]
mod tests {
    use super::*;
    use stepline::http::lambda_http::RequestExt;

    fn decoded(headers: &[(&str, &str)], uri: &str, body: &[u8]) -> (Value, lambda_http::Request) {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        let peer: SocketAddr = "127.0.0.1:4242".parse().unwrap();
        let event = function_url_event(&Method::POST, &uri.parse().unwrap(), &map, body, peer);
        let request = lambda_http::request::from_str(&event.to_string()).unwrap();
        (event, request)
    }

    #[test]
    fn a_request_becomes_the_event_a_function_url_sends_and_decodes_back() {
        let (event, request) = decoded(
            &[
                ("Content-Type", "application/json"),
                ("X-Twice", "a"),
                ("X-Twice", "b"),
                ("Cookie", "one=1; two=2"),
            ],
            "/executions?pipeline=orders&status=FAILED&status=DLQ&tenant=a%20b",
            br#"{"k": 1}"#,
        );
        assert_eq!(event["version"], "2.0");
        assert_eq!(event["headers"]["x-twice"], "a,b", "{event}");
        assert_eq!(event["cookies"], json!(["one=1", "two=2"]));
        assert!(event["headers"].get("cookie").is_none());
        assert_eq!(event["queryStringParameters"]["status"], "FAILED,DLQ");
        assert_eq!(event["queryStringParameters"]["tenant"], "a b");
        assert_eq!(event["isBase64Encoded"], false);
        assert_eq!(event["requestContext"]["http"]["sourceIp"], "127.0.0.1");

        assert_eq!(request.method(), Method::POST);
        assert_eq!(request.uri().path(), "/executions");
        assert_eq!(
            request.uri().query(),
            Some("pipeline=orders&status=FAILED&status=DLQ&tenant=a%20b")
        );
        assert_eq!(request.body().as_ref(), br#"{"k": 1}"#);
        assert!(request.query_string_parameters_ref().is_some());
    }

    #[test]
    fn only_a_loopback_address_is_served() {
        assert!(loopback("127.0.0.1:9070".parse().unwrap()).is_ok());
        assert!(loopback("[::1]:9070".parse().unwrap()).is_ok());
        for reachable in ["0.0.0.0:9070", "192.168.1.4:9070", "[::]:9070"] {
            assert!(loopback(reachable.parse().unwrap()).is_err(), "{reachable}");
        }
    }

    #[test]
    fn a_body_that_is_not_text_goes_base64_and_arrives_as_its_bytes() {
        let bytes = [0u8, 159, 146, 150];
        let (event, request) = decoded(
            &[("Content-Type", "application/octet-stream")],
            "/x",
            &bytes,
        );
        assert_eq!(event["isBase64Encoded"], true);
        assert_eq!(request.body().as_ref(), bytes);
        let (event, request) = decoded(&[], "/x", b"");
        assert!(event.get("body").is_none());
        assert!(request.body().is_empty());
    }
}
