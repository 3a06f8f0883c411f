//! Runs a binary with exactly the RBAC its rules file grants: a ServiceAccount bound to those
//! rules, and a kubeconfig that impersonates it. Proves the least-privilege lists are enough.

use std::path::{Path, PathBuf};

use k8s_openapi::api::{
    core::v1::ServiceAccount,
    rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject},
};
use kube::api::ObjectMeta;
use serde::Deserialize;

use crate::Cluster;

#[derive(Deserialize)]
struct Rules {
    cluster: Vec<PolicyRule>,
    namespace: Vec<PolicyRule>,
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(Into::into),
        ..Default::default()
    }
}

impl Cluster {
    /// Creates a ServiceAccount in `namespace` with the rules of `rules_file` (cluster rules
    /// cluster-wide, namespace rules in `namespace`), and returns a kubeconfig that acts as it.
    pub async fn as_service_account(
        &self,
        namespace: &str,
        rules_file: &Path,
    ) -> anyhow::Result<PathBuf> {
        let rules: Rules = serde_norway::from_str(&std::fs::read_to_string(rules_file)?)?;
        self.as_service_account_with(namespace, rules.cluster, rules.namespace)
            .await
    }

    /// As [`Cluster::as_service_account`], with the rules given (for rules rendered by the
    /// chart, resourceNames and all).
    pub async fn as_service_account_with(
        &self,
        namespace: &str,
        cluster: Vec<PolicyRule>,
        namespaced: Vec<PolicyRule>,
    ) -> anyhow::Result<PathBuf> {
        let rules = Rules {
            cluster,
            namespace: namespaced,
        };
        let name = crate::unique_name("gk-rbac");
        self.create(&ServiceAccount {
            metadata: meta(&name, Some(namespace)),
            ..Default::default()
        })
        .await?;
        let subject = Subject {
            kind: "ServiceAccount".into(),
            name: name.clone(),
            namespace: Some(namespace.into()),
            ..Default::default()
        };
        self.create(&ClusterRole {
            metadata: meta(&name, None),
            rules: Some(rules.cluster),
            ..Default::default()
        })
        .await?;
        self.create(&ClusterRoleBinding {
            metadata: meta(&name, None),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: name.clone(),
            },
            subjects: Some(vec![subject.clone()]),
        })
        .await?;
        self.create(&Role {
            metadata: meta(&name, Some(namespace)),
            rules: Some(rules.namespace),
        })
        .await?;
        self.create(&RoleBinding {
            metadata: meta(&name, Some(namespace)),
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: name.clone(),
            },
            subjects: Some(vec![subject]),
        })
        .await?;

        // The same kubeconfig, every user impersonating the ServiceAccount.
        let mut kc: serde_norway::Value =
            serde_norway::from_str(&std::fs::read_to_string(&self.kubeconfig)?)?;
        let user = format!("system:serviceaccount:{namespace}:{name}");
        for u in kc["users"].as_sequence_mut().into_iter().flatten() {
            u["user"]["as"] = user.clone().into();
        }
        let path = std::env::temp_dir()
            .join("groundskeeper-tests")
            .join(format!("{name}.kubeconfig"));
        std::fs::create_dir_all(path.parent().unwrap())?;
        std::fs::write(&path, serde_norway::to_string(&kc)?)?;
        Ok(path)
    }
}
