//! The AdmissionReview wire format (`admission.k8s.io/v1`), read into what the webhook judges.
//!
//! Two kinds of request reach it (see the chart's ValidatingWebhookConfiguration): a binding
//! CREATE, whose object is a `Binding` naming the pod and the node (`pods/binding`, as the
//! scheduler binds, or the older `bindings` resource, which binds the same way), and a pod
//! CREATE that already names its node (`spec.nodeName`). Anything else is answered "allowed".

use k8s_openapi::api::core::v1::{Binding, Pod};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Review {
    #[serde(default)]
    request: Option<Request>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Request {
    uid: String,
    #[serde(default)]
    resource: Resource,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    operation: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    object: Option<serde_json::Value>,
}

#[derive(Deserialize, Default)]
struct Resource {
    #[serde(default)]
    group: String,
    #[serde(default)]
    resource: String,
}

/// What a request asks, as the webhook judges it.
#[derive(Debug)]
pub enum Subject {
    /// `pods/binding`: pod `namespace/name` (of UID `uid`, when the binder says) onto `node`.
    Binding {
        namespace: String,
        name: String,
        uid: Option<String>,
        node: String,
    },
    /// A pod created already bound to `node`.
    Pod { pod: Box<Pod>, node: String },
    /// Not something the webhook judges (a pod created without a node, another resource or
    /// operation): allowed. The chart's rules and matchConditions keep these away.
    Other(String),
}

impl Subject {
    /// The metrics label: `binding` or `pod`.
    pub fn label(&self) -> &'static str {
        match self {
            Subject::Binding { .. } => "binding",
            Subject::Pod { .. } | Subject::Other(_) => "pod",
        }
    }
}

/// A request the webhook can not read; answered with HTTP 400, which the apiserver treats as a
/// failed call (failurePolicy decides).
#[derive(Debug, thiserror::Error)]
#[error("not an AdmissionReview the sysctl webhook can judge: {0}")]
pub struct Unreadable(String);

/// The request's UID (the answer must carry it) and what it asks.
pub fn read(body: &[u8]) -> Result<(String, Subject), Unreadable> {
    let review: Review =
        serde_json::from_slice(body).map_err(|e| Unreadable(format!("invalid JSON: {e}")))?;
    let r = review
        .request
        .ok_or_else(|| Unreadable("no request".into()))?;
    let uid = r.uid.clone();
    Ok((uid, subject(r)?))
}

/// Takes the request whole: the object (up to the webhook's body limit) is moved, never copied.
fn subject(r: Request) -> Result<Subject, Unreadable> {
    let sub = r.sub_resource.as_deref().unwrap_or_default();
    // POST .../bindings binds a pod exactly as POST .../pods/NAME/binding does.
    let sub = match (r.resource.resource.as_str(), sub) {
        ("bindings", "") => "binding",
        ("bindings", _) => "other",
        _ => sub,
    };
    let resource = match r.resource.resource.as_str() {
        "bindings" => "pods",
        other => other,
    };
    if !r.resource.group.is_empty() || resource != "pods" || r.operation != "CREATE" {
        return Ok(Subject::Other(format!(
            "{} {}/{} {sub}",
            r.operation, r.resource.group, r.resource.resource
        )));
    }
    let object = r
        .object
        .ok_or_else(|| Unreadable("a CREATE without an object".into()))?;
    match sub {
        "binding" => {
            let b: Binding = serde_json::from_value(object)
                .map_err(|e| Unreadable(format!("the object is not a Binding: {e}")))?;
            let name = b
                .metadata
                .name
                .ok_or_else(|| Unreadable("a Binding without a name".into()))?;
            Ok(Subject::Binding {
                namespace: b.metadata.namespace.or(r.namespace).unwrap_or_default(),
                name,
                uid: b.metadata.uid.filter(|u| !u.is_empty()),
                node: b.target.name.unwrap_or_default(),
            })
        }
        "" => {
            let mut pod: Pod = serde_json::from_value(object)
                .map_err(|e| Unreadable(format!("the object is not a Pod: {e}")))?;
            if pod.metadata.namespace.is_none() {
                pod.metadata.namespace = r.namespace;
            }
            match pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty())
            {
                Some(node) => Ok(Subject::Pod {
                    pod: Box::new(pod),
                    node,
                }),
                None => Ok(Subject::Other("a pod created without a node".into())),
            }
        }
        other => Ok(Subject::Other(format!("pods/{other}"))),
    }
}

/// The webhook's answer to one request.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Answer {
    pub allowed: bool,
    /// Why it was denied: the apiserver returns it to the client after `admission webhook
    /// "<name>" denied the request: `.
    pub message: Option<String>,
    /// Shown to the client (kubectl prints them) when it is allowed all the same.
    pub warnings: Vec<String>,
}

#[derive(Serialize)]
struct Status<'a> {
    code: u16,
    reason: &'a str,
    message: &'a str,
}

/// The AdmissionReview response for request `uid`.
pub fn respond(uid: &str, answer: &Answer) -> serde_json::Value {
    let mut response = json!({"uid": uid, "allowed": answer.allowed});
    if let Some(message) = &answer.message {
        response["status"] = serde_json::to_value(Status {
            code: 403,
            reason: "Forbidden",
            message,
        })
        .expect("a status serializes");
    }
    if !answer.warnings.is_empty() {
        response["warnings"] = json!(answer.warnings);
    }
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    })
}

/// The request's UID and, for a pod CREATE, the pod (its namespace filled in from the
/// request): what the gate webhook reads. Anything else is `None` (answered unchanged).
pub fn read_created_pod(body: &[u8]) -> Result<(String, Option<Box<Pod>>), Unreadable> {
    let review: Review =
        serde_json::from_slice(body).map_err(|e| Unreadable(format!("invalid JSON: {e}")))?;
    let r = review
        .request
        .ok_or_else(|| Unreadable("no request".into()))?;
    let is_pod_create = r.resource.group.is_empty()
        && r.resource.resource == "pods"
        && r.sub_resource.as_deref().unwrap_or_default().is_empty()
        && r.operation == "CREATE";
    if !is_pod_create {
        return Ok((r.uid, None));
    }
    let object = r
        .object
        .ok_or_else(|| Unreadable("a CREATE without an object".into()))?;
    let mut pod: Pod = serde_json::from_value(object)
        .map_err(|e| Unreadable(format!("the object is not a Pod: {e}")))?;
    if pod.metadata.namespace.is_none() {
        pod.metadata.namespace = r.namespace;
    }
    Ok((r.uid, Some(Box::new(pod))))
}

/// The allowed AdmissionReview response for request `uid`, carrying `patch` (a JSON patch,
/// base64 on the wire) when there is one, and `warnings`.
pub fn respond_patched(
    uid: &str,
    patch: Option<&serde_json::Value>,
    warnings: &[String],
) -> serde_json::Value {
    let mut response = json!({"uid": uid, "allowed": true});
    if let Some(patch) = patch {
        let bytes = serde_json::to_vec(patch).expect("a JSON value serializes");
        response["patchType"] = json!("JSONPatch");
        response["patch"] = json!(k8s_openapi::ByteString(bytes));
    }
    if !warnings.is_empty() {
        response["warnings"] = json!(warnings);
    }
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(
        resource: &str,
        sub: Option<&str>,
        operation: &str,
        object: serde_json::Value,
    ) -> Vec<u8> {
        let mut req = json!({
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Binding"},
            "resource": {"group": "", "version": "v1", "resource": resource},
            "operation": operation,
            "namespace": "ns",
            "object": object,
        });
        if let Some(sub) = sub {
            req["subResource"] = json!(sub);
        }
        serde_json::to_vec(&json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req})).unwrap()
    }

    #[test]
    fn a_binding_names_pod_uid_and_node() {
        let body = review(
            "pods",
            Some("binding"),
            "CREATE",
            json!({"apiVersion": "v1", "kind": "Binding",
                   "metadata": {"name": "web-0", "uid": "pod-uid"},
                   "target": {"kind": "Node", "name": "n1"}}),
        );
        let (uid, s) = read(&body).unwrap();
        assert_eq!(uid, "u-1");
        match s {
            Subject::Binding {
                namespace,
                name,
                uid,
                node,
            } => {
                assert_eq!(
                    (
                        namespace.as_str(),
                        name.as_str(),
                        uid.as_deref(),
                        node.as_str()
                    ),
                    ("ns", "web-0", Some("pod-uid"), "n1"),
                    "the namespace comes from the request when the Binding has none"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_older_bindings_resource_is_a_binding_too() {
        let body = review(
            "bindings",
            None,
            "CREATE",
            json!({"metadata": {"name": "web-0"}, "target": {"kind": "Node", "name": "n1"}}),
        );
        assert!(matches!(
            read(&body).unwrap().1,
            Subject::Binding { ref name, ref node, .. } if name == "web-0" && node == "n1"
        ));
    }

    #[test]
    fn a_pod_created_on_a_node_is_judged_from_itself() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                         "spec": {"nodeName": "n1", "containers": []}});
        let (_, s) = read(&review("pods", None, "CREATE", pod)).unwrap();
        let Subject::Pod { pod, node } = s else {
            panic!("not a pod")
        };
        assert_eq!(node, "n1");
        assert_eq!(pod.metadata.namespace.as_deref(), Some("ns"));

        let unbound = json!({"metadata": {"name": "p"}, "spec": {"containers": []}});
        assert!(matches!(
            read(&review("pods", None, "CREATE", unbound)).unwrap().1,
            Subject::Other(_)
        ));
        let any = json!({"metadata": {"name": "p"}});
        for (resource, sub, op) in [
            ("pods", None, "UPDATE"),
            ("pods", Some("status"), "CREATE"),
            ("services", None, "CREATE"),
        ] {
            assert!(
                matches!(
                    read(&review(resource, sub, op, any.clone())).unwrap().1,
                    Subject::Other(_)
                ),
                "{resource} {sub:?} {op}"
            );
        }
    }

    #[test]
    fn unreadable_requests_are_errors_naming_why() {
        for (body, why) in [
            (b"nope".to_vec(), "invalid JSON"),
            (br#"{"kind": "AdmissionReview"}"#.to_vec(), "no request"),
            (
                review("pods", Some("binding"), "CREATE", json!({"target": 1})),
                "not a Binding",
            ),
            (
                review("pods", Some("binding"), "CREATE", json!({"target": {}})),
                "without a name",
            ),
        ] {
            let e = read(&body).unwrap_err().to_string();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn answers_carry_uid_status_and_warnings() {
        let deny = respond(
            "u-1",
            &Answer {
                allowed: false,
                message: Some("forbidden sysctl".into()),
                warnings: vec![],
            },
        );
        assert_eq!(deny["response"]["uid"], "u-1");
        assert_eq!(deny["response"]["allowed"], false);
        assert_eq!(deny["response"]["status"]["code"], 403);
        assert_eq!(deny["response"]["status"]["message"], "forbidden sysctl");
        assert!(deny["response"].get("warnings").is_none());
        let warn = respond(
            "u-2",
            &Answer {
                allowed: true,
                message: None,
                warnings: vec!["audit".into()],
            },
        );
        assert_eq!(warn["response"]["warnings"][0], "audit");
        assert!(warn["response"].get("status").is_none());
        assert_eq!(warn["kind"], "AdmissionReview");
    }

    #[test]
    fn a_created_pod_is_read_and_a_patch_is_answered_in_base64() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": []}});
        let (uid, p) = read_created_pod(&review("pods", None, "CREATE", pod.clone())).unwrap();
        assert_eq!(uid, "u-1");
        assert_eq!(p.unwrap().metadata.namespace.as_deref(), Some("ns"));
        for (resource, sub, op) in [
            ("pods", None, "UPDATE"),
            ("pods", Some("binding"), "CREATE"),
        ] {
            let (_, p) = read_created_pod(&review(resource, sub, op, pod.clone())).unwrap();
            assert!(p.is_none(), "{resource} {sub:?} {op}");
        }
        assert!(read_created_pod(b"{").is_err());

        let patch = json!([{"op": "add", "path": "/a", "value": 1}]);
        let r = respond_patched("u-1", Some(&patch), &[]);
        assert_eq!(r["response"]["allowed"], true);
        assert_eq!(r["response"]["patchType"], "JSONPatch");
        let wire: k8s_openapi::ByteString =
            serde_json::from_value(r["response"]["patch"].clone()).unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&wire.0).unwrap(),
            patch
        );
        let r = respond_patched("u-2", None, &["w".into()]);
        assert!(r["response"].get("patch").is_none());
        assert_eq!(r["response"]["warnings"][0], "w");
    }
}
