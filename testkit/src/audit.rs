//! The test control plane's audit log (JSON lines; writes only, at Metadata level, one event
//! per request at ResponseComplete), read back so a test can prove who wrote what, and when.

use std::path::Path;

use jiff::Timestamp;
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub stage: String,
    pub verb: String,
    #[serde(default)]
    pub user_agent: String,
    #[serde(default)]
    pub object_ref: ObjectRef,
    #[serde(default)]
    pub response_status: Option<ResponseStatus>,
    /// When the apiserver received the request.
    pub request_received_timestamp: Timestamp,
    /// When it answered (the write committed, or failed).
    pub stage_timestamp: Timestamp,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ObjectRef {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub subresource: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ResponseStatus {
    #[serde(default)]
    pub code: u16,
}

impl Event {
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }

    /// Answered with 2xx.
    pub fn succeeded(&self) -> bool {
        self.response_status
            .as_ref()
            .is_some_and(|s| (200..300).contains(&s.code))
    }

    pub fn code(&self) -> u16 {
        self.response_status.as_ref().map_or(0, |s| s.code)
    }
}

/// Every complete event in the log so far (a line being written is skipped).
pub fn read(path: &Path) -> anyhow::Result<Vec<Event>> {
    let text = std::fs::read_to_string(path)?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<Event>(l).ok())
        .filter(|e| e.stage == "ResponseComplete")
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_an_apiserver_line() {
        let line = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"x","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/n/pods/p","verb":"delete","user":{"username":"u"},"sourceIPs":["127.0.0.1"],"userAgent":"controller-manager/0.1.0 (a)","objectRef":{"resource":"pods","namespace":"n","name":"p","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-11-22T21:00:00.123456Z","stageTimestamp":"2026-11-22T21:00:00.130000Z"}"#;
        let dir = std::env::temp_dir().join(crate::unique_name("audit"));
        std::fs::write(&dir, format!("{line}\n{{\"partial\n")).unwrap();
        let events = read(&dir).unwrap();
        let _ = std::fs::remove_file(&dir);
        assert_eq!(events.len(), 1);
        let e = &events[0];
        assert!(e.is_write() && e.succeeded());
        assert_eq!(e.object_ref.resource, "pods");
        assert_eq!(
            e.stage_timestamp
                .duration_since(e.request_received_timestamp),
            jiff::SignedDuration::from_micros(6544)
        );
    }
}
