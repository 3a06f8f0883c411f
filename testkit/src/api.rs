//! Answers for the in-memory apiservers unit tests hand to `kube::Client::new` (a
//! `tower::service_fn`): written once, so each stand-in only decides the code and the body.

use http::Response;
use kube::client::Body;

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
