//! The AdmissionReview wire format (`admission.k8s.io/v1`), read into what the webhook judges.
//!
//! Two kinds of request reach it (see the chart's ValidatingWebhookConfiguration): a binding
//! CREATE, whose object is a `Binding` naming the pod and the node (`pods/binding`, as the
//! scheduler binds, or the older `bindings` resource, which binds the same way), and a pod
//! CREATE that already names its node (`spec.nodeName`). Anything else is answered "allowed".

//!
//! The wire types are kube's (`kube::core::admission`); what is ours is the reading of a request
//! into a [`Subject`] and the clear, bounded refusal of a body that is not one.

use k8s_openapi::api::core::v1::{Binding, Pod};
use kube::core::{
    DynamicObject, Status,
    admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation},
};

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

/// The allowed answer to the request (it carries the request's UID, which the answer must) and
/// what the request asks.
pub fn read(body: &[u8]) -> Result<(AdmissionResponse, Subject), Unreadable> {
    let r = request(body)?;
    Ok((AdmissionResponse::from(&r), subject(r)?))
}

fn request(body: &[u8]) -> Result<AdmissionRequest<DynamicObject>, Unreadable> {
    let review: AdmissionReview<DynamicObject> = serde_json::from_slice(body)
        .map_err(|e| Unreadable(format!("not an AdmissionReview: {e}")))?;
    review
        .try_into()
        .map_err(|_| Unreadable("no request".into()))
}

/// The object of a CREATE as `K`: the one copy of it the webhook makes.
fn object<K>(r: &mut AdmissionRequest<DynamicObject>, what: &str) -> Result<K, Unreadable>
where
    K: kube::Resource + serde::de::DeserializeOwned,
{
    r.object
        .take()
        .ok_or_else(|| Unreadable("a CREATE without an object".into()))?
        .try_parse()
        .map_err(|e| Unreadable(format!("the object is not a {what}: {e}")))
}

/// Takes the request whole: the object (up to the webhook's body limit) is parsed once.
fn subject(mut r: AdmissionRequest<DynamicObject>) -> Result<Subject, Unreadable> {
    let sub = r.sub_resource.as_deref().unwrap_or_default();
    // POST .../bindings binds a pod exactly as POST .../pods/NAME/binding does.
    let sub = match (r.resource.resource.as_str(), sub) {
        ("bindings", "") => "binding",
        ("bindings", _) => "other",
        _ => sub,
    }
    .to_string();
    let resource = match r.resource.resource.as_str() {
        "bindings" => "pods",
        other => other,
    };
    if !r.resource.group.is_empty() || resource != "pods" || r.operation != Operation::Create {
        return Ok(Subject::Other(format!(
            "{:?} {}/{} {sub}",
            r.operation, r.resource.group, r.resource.resource
        )));
    }
    match sub.as_str() {
        "binding" => {
            let b: Binding = object(&mut r, "Binding")?;
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
            let mut pod: Pod = object(&mut r, "Pod")?;
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

/// The AdmissionReview answering the request `allowed` was made from: a denial carries a 403
/// `Forbidden` status with the message, which the apiserver returns to the client.
pub fn respond(allowed: AdmissionResponse, answer: &Answer) -> String {
    let mut response = match &answer.message {
        Some(message) if !answer.allowed => {
            let mut denied = allowed.deny(message);
            denied.result = Status::failure(message, "Forbidden").with_code(403);
            denied
        }
        _ if !answer.allowed => allowed.deny(""),
        _ => allowed,
    };
    if !answer.warnings.is_empty() {
        response.warnings = Some(answer.warnings.clone());
    }
    serialize(response)
}

fn serialize(response: AdmissionResponse) -> String {
    serde_json::to_string(&response.into_review()).expect("an AdmissionReview serializes")
}

/// The allowed answer and, for a pod CREATE, the pod (its namespace filled in from the
/// request): what the gate webhook reads. Anything else is `None` (answered unchanged).
pub fn read_created_pod(body: &[u8]) -> Result<(AdmissionResponse, Option<Box<Pod>>), Unreadable> {
    let mut r = request(body)?;
    let allowed = AdmissionResponse::from(&r);
    let is_pod_create = r.resource.group.is_empty()
        && r.resource.resource == "pods"
        && r.sub_resource.as_deref().unwrap_or_default().is_empty()
        && r.operation == Operation::Create;
    if !is_pod_create {
        return Ok((allowed, None));
    }
    let mut pod: Pod = object(&mut r, "Pod")?;
    if pod.metadata.namespace.is_none() {
        pod.metadata.namespace = r.namespace;
    }
    Ok((allowed, Some(Box::new(pod))))
}

/// The allowed AdmissionReview carrying `patch` (a JSON patch, base64 on the wire) when there
/// is one, and `warnings`.
pub fn respond_patched(
    allowed: AdmissionResponse,
    patch: Option<&serde_json::Value>,
    warnings: &[String],
) -> Result<String, Unreadable> {
    let mut response = match patch {
        Some(p) => {
            let p: json_patch::Patch = serde_json::from_value(p.clone())
                .map_err(|e| Unreadable(format!("the gate's patch is not a JSON patch: {e}")))?;
            allowed
                .with_patch(p)
                .map_err(|e| Unreadable(format!("the gate's patch does not serialize: {e}")))?
        }
        None => allowed,
    };
    if !warnings.is_empty() {
        response.warnings = Some(warnings.to_vec());
    }
    Ok(serialize(response))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
            "userInfo": {"username": "system:kube-scheduler"},
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
        assert_eq!(uid.uid, "u-1");
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
            (b"nope".to_vec(), "not an AdmissionReview"),
            (b"{}".to_vec(), "not an AdmissionReview"),
            (
                br#"{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}"#.to_vec(),
                "no request",
            ),
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

    /// The allowed answer to a request of UID `uid`, as `read` makes it.
    fn allowed(uid: &str) -> AdmissionResponse {
        let mut body: serde_json::Value =
            serde_json::from_slice(&review("pods", None, "UPDATE", json!({"metadata": {}})))
                .unwrap();
        body["request"]["uid"] = json!(uid);
        read(&serde_json::to_vec(&body).unwrap()).unwrap().0
    }

    fn wire(s: String) -> serde_json::Value {
        serde_json::from_str(&s).unwrap()
    }

    #[test]
    fn answers_carry_uid_status_and_warnings() {
        let deny = wire(respond(
            allowed("u-1"),
            &Answer {
                allowed: false,
                message: Some("forbidden sysctl".into()),
                warnings: vec![],
            },
        ));
        assert_eq!(deny["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(deny["kind"], "AdmissionReview");
        assert_eq!(deny["response"]["uid"], "u-1");
        assert_eq!(deny["response"]["allowed"], false);
        assert_eq!(deny["response"]["status"]["code"], 403);
        assert_eq!(deny["response"]["status"]["reason"], "Forbidden");
        assert_eq!(deny["response"]["status"]["message"], "forbidden sysctl");
        assert!(deny["response"].get("warnings").is_none());
        let warn = wire(respond(
            allowed("u-2"),
            &Answer {
                allowed: true,
                message: None,
                warnings: vec!["audit".into()],
            },
        ));
        assert_eq!(warn["response"]["uid"], "u-2");
        assert_eq!(warn["response"]["allowed"], true);
        assert_eq!(warn["response"]["warnings"][0], "audit");
        assert_eq!(warn["kind"], "AdmissionReview");
    }

    #[test]
    fn a_created_pod_is_read_and_a_patch_is_answered_with_its_type() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": []}});
        let (uid, p) = read_created_pod(&review("pods", None, "CREATE", pod.clone())).unwrap();
        assert_eq!(uid.uid, "u-1");
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
        let r = wire(respond_patched(allowed("u-1"), Some(&patch), &[]).unwrap());
        assert_eq!(r["response"]["uid"], "u-1");
        assert_eq!(r["response"]["allowed"], true);
        assert_eq!(r["response"]["patchType"], "JSONPatch");
        // kube's AdmissionResponse writes the patch's bytes as a JSON array, which the
        // apiserver's decoder reads into its []byte as it reads base64 (the gate's cluster tests
        // have the apiserver apply it).
        let bytes: Vec<u8> = serde_json::from_value(r["response"]["patch"].clone()).unwrap();
        assert_eq!(
            serde_json::from_slice::<serde_json::Value>(&bytes).unwrap(),
            patch
        );
        let r = wire(respond_patched(allowed("u-2"), None, &["w".into()]).unwrap());
        assert!(r["response"].get("patch").is_none());
        assert!(r["response"].get("patchType").is_none());
        assert_eq!(r["response"]["warnings"][0], "w");
        assert!(
            respond_patched(allowed("u-3"), Some(&json!({"not": "a patch"})), &[]).is_err(),
            "a patch that is not a JSON patch is an error, never an answer without it"
        );
    }
}
