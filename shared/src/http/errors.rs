//! Why a request was refused: each refusal a stable code, an HTTP status, and the body it is
//! answered with.

use super::*;

/// Why a request was refused. Each variant has a stable code and an HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("no route for {0}")]
    NoRoute(String),
    #[error("{method} {path} is for {wanted}: this endpoint serves {served}")]
    NotServed {
        method: Method,
        path: String,
        wanted: Audience,
        served: Audiences,
    },
    #[error("{method} is not allowed on {path} (allowed: {allowed})")]
    MethodNotAllowed {
        method: Method,
        path: String,
        /// The resource's methods, as the `Allow` header lists them.
        allowed: &'static str,
    },
    #[error("malformed id {0:?}")]
    InvalidId(String),
    #[error("{0}")]
    InvalidBody(String),
    #[error("the body has {bytes} bytes, more than the {limit} allowed")]
    BodyTooLarge { bytes: usize, limit: usize },
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
    /// Its code and message, as a response shows them.
    pub fn detail(&self) -> ErrorDetail {
        ErrorDetail {
            code: self.code(),
            message: self.to_string(),
        }
    }

    /// Stable error code.
    pub fn code(&self) -> Code {
        match self {
            ApiError::NoRoute(_) => Code::NoRoute,
            ApiError::NotServed { .. } => Code::NotServed,
            ApiError::MethodNotAllowed { .. } => Code::MethodNotAllowed,
            ApiError::InvalidId(_) => Code::InvalidId,
            ApiError::InvalidBody(_) => Code::InvalidBody,
            ApiError::BodyTooLarge { .. } => Code::BodyTooLarge,
            ApiError::NotFinished(_) => Code::NotFinished,
            ApiError::NotSucceeded(_) => Code::NotSucceeded,
            ApiError::Coordinator(e) => e.code(),
            ApiError::Internal(_) => Code::Internal,
        }
    }

    /// HTTP status of the error: the catalogue's, for its code.
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.code().http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    pub(super) fn into_response(self) -> Response<Body> {
        let status = self.status();
        let body = ErrorBody {
            error: self.detail(),
        };
        let mut response = json_response(status, &body);
        let headers = response.headers_mut();
        if let ApiError::MethodNotAllowed { allowed, .. } = &self {
            if let Ok(value) = HeaderValue::from_str(allowed) {
                headers.insert(header::ALLOW, value);
            }
        }
        if status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

#[derive(Serialize)]
struct ErrorBody {
    error: ErrorDetail,
}

/// A refusal's stable code and message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorDetail {
    pub code: Code,
    pub message: String,
}
