//! In-memory apiservers for unit tests of the layers that call the API: the answer every
//! stand-in builds (`reply`), and `Mock`, a scripted one that records what it was asked.
//! A call sequence is tested here; a behaviour is always also tested on a real apiserver.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use http::{Request, Response};
use kube::{Client, client::Body};
use serde_json::{Value, json};

/// The apiserver's answer: `code`, with `body` as JSON.
pub fn reply(code: u16, body: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(
            serde_json::to_vec(body).expect("JSON value serializes"),
        ))
        .expect("status code and header are valid")
}

#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub uri: String,
    pub content_type: String,
    pub body: Value,
}

/// An apiserver stand-in: answers each request with the next scripted status code (200 when
/// the script runs out) and records what it was asked.
#[derive(Clone, Default)]
pub struct Mock {
    pub seen: Arc<Mutex<Vec<Seen>>>,
    pub script: Arc<Mutex<VecDeque<u16>>>,
    /// Fixed answers for `METHOD /path`, taking precedence over the script.
    pub routes: Arc<Mutex<Vec<(String, u16)>>>,
    pub in_flight: Arc<AtomicUsize>,
    /// When set, every request hangs (a frozen connection) instead of being answered.
    pub hang: Arc<std::sync::atomic::AtomicBool>,
    pub max_in_flight: Arc<AtomicUsize>,
}

impl Mock {
    pub fn answering(codes: &[u16]) -> Self {
        let m = Mock::default();
        m.script.lock().unwrap().extend(codes);
        m
    }

    pub fn route(self, call: &str, code: u16) -> Self {
        self.routes.lock().unwrap().push((call.to_string(), code));
        self
    }

    pub fn client(&self) -> Client {
        let m = self.clone();
        let svc = tower::service_fn(move |req: Request<Body>| {
            let m = m.clone();
            async move {
                let now = m.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                m.max_in_flight.fetch_max(now, Ordering::SeqCst);
                let (parts, body) = req.into_parts();
                let bytes = body.collect_bytes().await.unwrap();
                if m.hang.load(Ordering::SeqCst) {
                    tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
                }
                // Let other requests start, so the in-flight peak reflects real overlap.
                for _ in 0..20 {
                    tokio::task::yield_now().await;
                }
                m.seen.lock().unwrap().push(Seen {
                    method: parts.method.to_string(),
                    uri: parts.uri.to_string(),
                    content_type: parts
                        .headers
                        .get("content-type")
                        .map(|v| v.to_str().unwrap().to_string())
                        .unwrap_or_default(),
                    body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                });
                let call = format!("{} {}", parts.method, parts.uri.path());
                let routed = m
                    .routes
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|(r, _)| *r == call)
                    .map(|(_, c)| *c);
                let code =
                    routed.unwrap_or_else(|| m.script.lock().unwrap().pop_front().unwrap_or(200));
                let body = match code {
                    200 => json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "p", "namespace": "ns", "uid": "u"}}),
                    // What a status patch with another pod's metadata.uid gets back.
                    422 => json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": "Pod \"p\" is invalid: metadata.uid: Invalid value: \"u\": field is immutable",
                        "reason": "Invalid", "code": 422,
                        "details": {"name": "p", "kind": "Pod", "causes": [{
                            "reason": "FieldValueInvalid", "field": "metadata.uid",
                            "message": "Invalid value: \"u\": field is immutable"}]}}),
                    // Any other invalid patch.
                    421 => json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": "invalid", "reason": "Invalid", "code": 422,
                        "details": {"name": "p", "kind": "Pod", "causes": [{
                            "reason": "FieldValueInvalid", "field": "status.phase"}]}}),
                    _ => json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "message": "scripted", "reason": "Scripted", "code": code}),
                };
                let code = if code == 421 { 422 } else { code };
                m.in_flight.fetch_sub(1, Ordering::SeqCst);
                Ok::<_, std::convert::Infallible>(reply(code, &body))
            }
        });
        Client::new(svc, "default")
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn calls(&self) -> Vec<String> {
        self.seen()
            .iter()
            .map(|s| format!("{} {}", s.method, s.uri.split('?').next().unwrap()))
            .collect()
    }
}
