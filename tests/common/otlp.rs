//! An in-test OpenTelemetry collector: an OTLP/gRPC trace service built from the
//! official protobufs (opentelemetry-proto) that keeps every span it receives.

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;

/// An OTLP/gRPC trace collector that keeps every span it receives.
#[derive(Clone, Default)]
pub struct Collector {
    spans: Arc<Mutex<Vec<Span>>>,
    pub service_names: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for resource_spans in request.into_inner().resource_spans {
            if let Some(resource) = resource_spans.resource {
                for kv in resource.attributes {
                    if kv.key == "service.name" {
                        self.service_names
                            .lock()
                            .expect("lock")
                            .push(string(kv.value.and_then(|v| v.value)));
                    }
                }
            }
            for scope in resource_spans.scope_spans {
                self.spans.lock().expect("lock").extend(scope.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

impl Collector {
    /// Listens on 127.0.0.1:0; returns the collector and its endpoint URL.
    pub async fn start() -> (Self, String) {
        let collector = Collector::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
        let service = TraceServiceServer::new(collector.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        (collector, endpoint)
    }

    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().expect("lock").clone()
    }
}

/// The text of a string attribute value (or its debug form).
pub fn string(value: Option<Value>) -> String {
    match value {
        Some(Value::StringValue(s)) => s,
        other => format!("{other:?}"),
    }
}
