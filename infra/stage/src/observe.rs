//! One SDK interceptor for whatever watches the clients' HTTP calls (the IAM checker, the bench's
//! meter): an [`Observer`] sees each request before it is sent, and each response as it comes.

use aws_sdk_dynamodb::config::interceptors::{
    BeforeDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
    FinalizerInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use stepline::aws::Clients;

use crate::iam::HttpCall;

/// What watches the calls of a set of clients. State kept from a request to its response goes in
/// the attempt's `ConfigBag`.
pub trait Observer: Clone + Send + Sync + std::fmt::Debug + 'static {
    fn name(&self) -> &'static str;
    /// A request about to be sent; an error refuses it (as AWS would).
    fn request(&self, call: HttpCall, bag: &mut ConfigBag) -> Result<(), BoxError>;
    /// A response's status, before its body is read; an error takes the response's place.
    fn response(&self, _status: u16, _bag: &mut ConfigBag) -> Result<(), BoxError> {
        Ok(())
    }
    /// An attempt ended: its response's status and body (`0` and none when none came).
    fn ended(&self, _status: u16, _body: &[u8], _bag: &ConfigBag) {}
}

#[derive(Debug, Clone)]
struct Observing<O>(O);

impl<O: Observer> Intercept for Observing<O> {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        bag: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        let call = HttpCall {
            method: request.method().to_string(),
            uri: request.uri().to_string(),
            headers: request
                .headers()
                .iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
                .collect(),
            body: request.body().bytes().unwrap_or_default().to_vec(),
        };
        self.0.request(call, bag)
    }

    fn read_before_deserialization(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        bag: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        self.0.response(context.response().status().as_u16(), bag)
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        bag: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let (status, body) = context.response().map_or((0, &[][..]), |r| {
            (r.status().as_u16(), r.body().bytes().unwrap_or_default())
        });
        self.0.ended(status, body, bag);
        Ok(())
    }
}

/// `clients`, each with `observer` on every request (after the interceptors they carry already).
/// The one place that lists the services' clients: a new field of `Clients` is one more line here.
pub fn observed_clients(clients: &Clients, observer: impl Observer) -> Clients {
    let interceptor = Observing(observer);
    macro_rules! observed {
        ($client:ident, $sdk:ident) => {
            $sdk::Client::from_conf(
                clients
                    .$client
                    .config()
                    .to_builder()
                    .interceptor(interceptor.clone())
                    .build(),
            )
        };
    }
    Clients {
        dynamodb: observed!(dynamodb, aws_sdk_dynamodb),
        sqs: observed!(sqs, aws_sdk_sqs),
        eventbridge: observed!(eventbridge, aws_sdk_eventbridge),
        s3: observed!(s3, aws_sdk_s3),
        secrets: observed!(secrets, aws_sdk_secretsmanager),
    }
}
