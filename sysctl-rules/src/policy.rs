//! What this node allows, merged from every source, and what each policy's status should say.
//!
//! The sources: the kernel-gated safe list, the agent's `--allowed-unsafe-sysctls` flag and
//! every SysctlPolicy that selects the node.
//!
//! Mode when policies disagree: the strictest wins. Any selecting policy in Enforce makes the
//! node Enforce; the node is Audit only when every selecting policy is Audit. With no selecting
//! policy the node is in the agent's default mode (`--sysctl-default-mode`, Audit unless set):
//! installing the agent alone must change nothing for workloads, so enforcing takes an
//! explicit choice, a policy or the flag.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::core::{Selector, SelectorExt};

use super::allowlist::{Allowlist, PatternError, check_pattern_in};
use super::crd::{CONDITION_VALID, Mode, SysctlPolicy, SysctlPolicySpec, SysctlPolicyStatus};
use super::hash::stable_hash;
use super::names::NamespaceTable;

/// The allowlist and mode in force on this node, and where they came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePolicy {
    pub allowlist: Allowlist,
    pub mode: Mode,
    /// Names of the policies that select this node, sorted.
    pub policies: Vec<String>,
    /// Every accepted pattern, in merge order (safe list, flag, policies by name).
    pub patterns: Vec<String>,
    /// Someone chose this node's policy: a SysctlPolicy selects it, or the default mode is
    /// Enforce. Only then are started pods reported.
    pub chosen: bool,
    /// Identifies this result across processes: a stable hash of the mode, the patterns and
    /// the selecting policies' names and generations. Reports are made once per revision.
    pub revision: u64,
}

/// Whether a policy's selector picks a node with these labels. Absent or empty selects all; a
/// selector that can not be parsed selects nothing (and the policy's status says why).
pub fn selects(selector: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    match selector {
        None => true,
        Some(s) => Selector::try_from(s.clone()).is_ok_and(|sel| sel.matches(labels)),
    }
}

/// Merges the sources for a kubelet of v1.33 to v1.36 (see [`merge_in`]).
pub fn merge(
    safe: &[&str],
    flag: &[String],
    default_mode: Mode,
    policies: &[&SysctlPolicy],
    node_labels: &BTreeMap<String, String>,
) -> NodePolicy {
    merge_in(
        NamespaceTable::IpcNet,
        safe,
        flag,
        default_mode,
        policies,
        node_labels,
    )
}

/// Merges the sources for a kubelet classifying by `table`. A pattern it does not know as
/// namespaced is skipped, from a policy or the flag (the flag accepts what the newest known
/// kubelet does, but an older kubelet would not start with it, so on its node it allows
/// nothing); skipping a pattern never widens.
pub fn merge_in(
    table: NamespaceTable,
    safe: &[&str],
    flag: &[String],
    default_mode: Mode,
    policies: &[&SysctlPolicy],
    node_labels: &BTreeMap<String, String>,
) -> NodePolicy {
    let mut selected: Vec<&SysctlPolicy> = policies
        .iter()
        .copied()
        .filter(|p| selects(p.spec.node_selector.as_ref(), node_labels))
        .collect();
    selected.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));

    let mut allowlist = Allowlist::default();
    let mut patterns = Vec::new();
    let candidates = safe
        .iter()
        .map(|s| s.to_string())
        .chain(flag.iter().cloned())
        .chain(
            selected
                .iter()
                .flat_map(|p| p.spec.allowed_unsafe_sysctls.iter().cloned()),
        );
    for pattern in candidates {
        if let Ok(entry) = check_pattern_in(table, &pattern) {
            allowlist.insert(entry);
            if !patterns.contains(&pattern) {
                patterns.push(pattern);
            }
        }
    }
    let mode = if selected.is_empty() {
        default_mode
    } else if selected.iter().any(|p| p.spec.mode == Mode::Enforce) {
        Mode::Enforce
    } else {
        Mode::Audit
    };
    let generations: Vec<String> = selected
        .iter()
        .map(|p| {
            format!(
                "{}={}",
                p.metadata.name.as_deref().unwrap_or_default(),
                p.metadata.generation.unwrap_or_default()
            )
        })
        .collect();
    let mode_name = mode.to_string();
    let mut parts: Vec<&str> = vec![&mode_name];
    parts.extend(patterns.iter().map(String::as_str));
    parts.push("");
    parts.extend(generations.iter().map(String::as_str));
    let revision = stable_hash(&parts);
    NodePolicy {
        allowlist,
        mode,
        policies: selected
            .iter()
            .map(|p| p.metadata.name.clone().unwrap_or_default())
            .collect(),
        chosen: !selected.is_empty() || default_mode == Mode::Enforce,
        patterns,
        revision,
    }
}

/// The `Valid` condition a spec earns, without timestamps: (status, reason, message). ReportedKubelet by
/// the newest known kubelet's namespace table, the same on every node whatever its kubelet (so
/// agents on nodes of different versions write the same status); a pattern only a newer kubelet
/// knows allows nothing on an older one's node.
pub fn validity(spec: &SysctlPolicySpec) -> (&'static str, &'static str, String) {
    let errors: Vec<PatternError> = spec
        .allowed_unsafe_sysctls
        .iter()
        .filter_map(|p| check_pattern_in(NamespaceTable::NEWEST, p).err())
        .collect();
    let selector_error = spec
        .node_selector
        .as_ref()
        .and_then(|s| Selector::try_from(s.clone()).err())
        .map(|e| format!("nodeSelector selects no node: {e}"));
    match (errors.is_empty(), selector_error) {
        (true, None) => (
            "True",
            "PatternsValid",
            format!(
                "all {} patterns are valid and namespaced",
                spec.allowed_unsafe_sysctls.len()
            ),
        ),
        (true, Some(sel)) => ("False", "InvalidNodeSelector", sel),
        (false, sel) => {
            let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
            let mut message = format!("ignored invalid patterns: {}", list.join("; "));
            if let Some(sel) = sel {
                message.push_str("; ");
                message.push_str(&sel);
            }
            ("False", "InvalidPatterns", message)
        }
    }
}

/// The status this policy should have, or None when the current one already says it. Every
/// agent computes the same content from the spec alone, so concurrent writers agree; the
/// transition time is kept while the condition's status is unchanged.
pub fn desired_status(policy: &SysctlPolicy, now: Time) -> Option<SysctlPolicyStatus> {
    let generation = policy.metadata.generation;
    let (status, reason, message) = validity(&policy.spec);
    let current = policy.status.as_ref();
    let existing = current.and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION_VALID));
    if let (Some(cur), Some(c)) = (current, existing)
        && cur.observed_generation == generation
        && c.status == status
        && c.reason == reason
        && c.message == message
        && c.observed_generation == generation
    {
        return None;
    }
    let last_transition_time = match existing {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => now,
    };
    Some(SysctlPolicyStatus {
        conditions: vec![Condition {
            type_: CONDITION_VALID.into(),
            status: status.into(),
            reason: reason.into(),
            message,
            observed_generation: generation,
            last_transition_time,
        }],
        observed_generation: generation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn policy(
        name: &str,
        patterns: &[&str],
        selector: Option<LabelSelector>,
        mode: Mode,
    ) -> SysctlPolicy {
        let mut p = SysctlPolicy::new(
            name,
            SysctlPolicySpec {
                allowed_unsafe_sysctls: patterns.iter().map(|s| s.to_string()).collect(),
                node_selector: selector,
                mode,
            },
        );
        p.metadata.generation = Some(3);
        p
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn match_labels(pairs: &[(&str, &str)]) -> Option<LabelSelector> {
        Some(LabelSelector {
            match_labels: Some(labels(pairs)),
            ..Default::default()
        })
    }

    #[test]
    fn selectors_absent_empty_labels_and_expressions() {
        let node = labels(&[("pool", "db"), ("zone", "a")]);
        assert!(selects(None, &node));
        assert!(selects(Some(&LabelSelector::default()), &node));
        assert!(selects(match_labels(&[("pool", "db")]).as_ref(), &node));
        assert!(!selects(match_labels(&[("pool", "web")]).as_ref(), &node));
        let expr = |op: &str, values: Option<Vec<&str>>| LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "zone".into(),
                operator: op.into(),
                values: values.map(|v| v.into_iter().map(String::from).collect()),
            }]),
            ..Default::default()
        };
        assert!(selects(Some(&expr("In", Some(vec!["a", "b"]))), &node));
        assert!(!selects(Some(&expr("NotIn", Some(vec!["a"]))), &node));
        assert!(selects(Some(&expr("Exists", None)), &node));
        assert!(!selects(Some(&expr("DoesNotExist", None)), &node));
        assert!(
            !selects(Some(&expr("Sometimes", None)), &node),
            "unparseable selects nothing"
        );
        assert!(!selects(Some(&expr("In", None)), &node));
    }

    #[test]
    fn merge_unions_safe_flag_and_selecting_policies() {
        let node = labels(&[("pool", "db")]);
        let db = policy(
            "b-db",
            &["kernel.msg*", "vm.swappiness", "Bad*Pattern"],
            match_labels(&[("pool", "db")]),
            Mode::Enforce,
        );
        let web = policy(
            "a-web",
            &["kernel.sem"],
            match_labels(&[("pool", "web")]),
            Mode::Enforce,
        );
        let all = policy("a-all", &["net.core.somaxconn"], None, Mode::Enforce);
        let merged = merge(
            &["kernel.shm_rmid_forced"],
            &["fs.mqueue.*".to_string()],
            Mode::Audit,
            &[&db, &web, &all],
            &node,
        );
        assert_eq!(merged.policies, vec!["a-all", "b-db"]);
        assert_eq!(
            merged.patterns,
            vec![
                "kernel.shm_rmid_forced",
                "fs.mqueue.*",
                "net.core.somaxconn",
                "kernel.msg*"
            ]
        );
        assert_eq!(merged.mode, Mode::Enforce);
        for ok in [
            "kernel.shm_rmid_forced",
            "fs.mqueue.msg_max",
            "net.core.somaxconn",
            "kernel.msgmax",
        ] {
            assert_eq!(merged.allowlist.validate(ok, false, false), Ok(()), "{ok}");
        }
        for no in ["kernel.sem", "vm.swappiness", "net.core.rmem_max"] {
            assert!(merged.allowlist.validate(no, false, false).is_err(), "{no}");
        }
    }

    /// A pattern only v1.37 knows as namespaced allows something on a v1.37 node only.
    #[test]
    fn patterns_count_only_where_the_kubelet_knows_their_namespace() {
        let node = labels(&[]);
        let flag = ["kernel.domainname".to_string()];
        let user = policy("u", &["user.*"], None, Mode::Enforce);
        let merged = |t| merge_in(t, &[], &flag, Mode::Audit, &[&user], &node);
        let (old, new) = (
            merged(NamespaceTable::IpcNet),
            merged(NamespaceTable::NEWEST),
        );
        assert!(old.patterns.is_empty(), "{:?}", old.patterns);
        assert_eq!(new.patterns, ["kernel.domainname", "user.*"]);
        assert_ne!(old.revision, new.revision);
        assert!(
            old.allowlist
                .validate("user.max_user_namespaces", false, false)
                .is_err()
        );
        assert_eq!(
            new.allowlist
                .validate("user.max_user_namespaces", false, false),
            Ok(())
        );
    }

    #[test]
    fn strictest_mode_wins() {
        let node = labels(&[]);
        let audit = policy("audit", &[], None, Mode::Audit);
        let audit2 = policy("audit2", &[], None, Mode::Audit);
        let enforce = policy("enforce", &[], None, Mode::Enforce);
        let elsewhere = policy("elsewhere", &[], match_labels(&[("x", "y")]), Mode::Enforce);
        let mode = |ps: &[&SysctlPolicy]| merge(&[], &[], Mode::Audit, ps, &node).mode;
        assert_eq!(
            mode(&[]),
            Mode::Audit,
            "no policy: the default mode, Audit unless the flag says otherwise"
        );
        assert_eq!(
            merge(&[], &[], Mode::Enforce, &[], &node).mode,
            Mode::Enforce,
            "--sysctl-default-mode=enforce"
        );
        assert_eq!(
            merge(&[], &[], Mode::Enforce, &[&audit], &node).mode,
            Mode::Audit,
            "a selecting policy decides, not the default"
        );
        assert_eq!(
            merge(&[], &[], Mode::Audit, &[&elsewhere], &node).mode,
            Mode::Audit,
            "an Enforce policy for other nodes does not make this one enforce"
        );
        assert_eq!(mode(&[&audit]), Mode::Audit);
        assert_eq!(mode(&[&audit, &audit2]), Mode::Audit);
        assert_eq!(mode(&[&audit, &enforce]), Mode::Enforce);
        assert_eq!(mode(&[&enforce, &audit]), Mode::Enforce);
        assert_eq!(
            mode(&[&audit, &elsewhere]),
            Mode::Audit,
            "a policy for other nodes does not count"
        );
    }

    #[test]
    fn revision_moves_with_mode_patterns_and_generations_only() {
        let node = labels(&[]);
        let mut p = policy("p", &["kernel.msg*"], None, Mode::Enforce);
        let rev = |p: &SysctlPolicy, flag: &[String]| {
            merge(&["kernel.shm_rmid_forced"], flag, Mode::Audit, &[p], &node).revision
        };
        let r0 = rev(&p, &[]);
        assert_eq!(r0, rev(&p, &[]), "same inputs, same revision");
        assert_ne!(r0, rev(&p, &["net.*".to_string()]), "flag pattern added");
        p.metadata.generation = Some(4);
        let r1 = rev(&p, &[]);
        assert_ne!(r0, r1, "policy generation moved");
        p.spec.mode = Mode::Audit;
        assert_ne!(r1, rev(&p, &[]), "mode changed");
        assert!(merge(&[], &[], Mode::Audit, &[&p], &node).chosen);
        assert!(merge(&[], &[], Mode::Enforce, &[], &node).chosen);
        assert!(!merge(&[], &[], Mode::Audit, &[], &node).chosen);
        let none = merge(&[], &[], Mode::Audit, &[], &node).revision;
        assert_ne!(none, merge(&[], &[], Mode::Enforce, &[], &node).revision);
    }

    #[test]
    fn validity_names_bad_patterns() {
        let ok = policy("p", &["net.*", "kernel/msg*"], None, Mode::Enforce);
        assert_eq!(validity(&ok.spec).0, "True");
        // Valid for a v1.37 kubelet, whatever kubelet the writing agent's node runs.
        let newer = policy("p", &["kernel.domainname", "user.*"], None, Mode::Enforce);
        assert_eq!(validity(&newer.spec).0, "True");
        let bad = policy("p", &["net.*", "vm.swappiness", "a*b"], None, Mode::Enforce);
        let (status, reason, message) = validity(&bad.spec);
        assert_eq!((status, reason), ("False", "InvalidPatterns"));
        assert!(
            message.contains(r#"the sysctls "vm.swappiness" are not known to be namespaced"#),
            "{message}"
        );
        assert!(
            message.contains(r#"sysctl "a*b" must have at most 253 characters"#),
            "{message}"
        );
        assert!(!message.contains("net.*"), "{message}");
        let sel = policy(
            "p",
            &[],
            Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "k".into(),
                    operator: "Bogus".into(),
                    values: None,
                }]),
                ..Default::default()
            }),
            Mode::Enforce,
        );
        assert_eq!(validity(&sel.spec).1, "InvalidNodeSelector");
    }

    #[test]
    fn status_is_written_only_when_it_changes() {
        let t0 = Time(jiff::Timestamp::from_second(1_000).unwrap());
        let t1 = Time(jiff::Timestamp::from_second(2_000).unwrap());
        let mut p = policy("p", &["vm.swappiness"], None, Mode::Enforce);
        let first = desired_status(&p, t0.clone()).expect("no status yet");
        assert_eq!(first.observed_generation, Some(3));
        assert_eq!(first.conditions[0].status, "False");
        p.status = Some(first.clone());
        assert_eq!(
            desired_status(&p, t1.clone()),
            None,
            "same content: no write"
        );

        // A new generation with the same verdict keeps the transition time.
        p.metadata.generation = Some(4);
        let second = desired_status(&p, t1.clone()).expect("generation moved");
        assert_eq!(second.conditions[0].last_transition_time, t0);
        assert_eq!(second.observed_generation, Some(4));

        // Fixing the pattern flips the condition and its transition time.
        p.status = Some(second);
        p.spec.allowed_unsafe_sysctls = vec!["net.*".into()];
        p.metadata.generation = Some(5);
        let third = desired_status(&p, t1.clone()).unwrap();
        assert_eq!(third.conditions[0].status, "True");
        assert_eq!(third.conditions[0].last_transition_time, t1);
    }
}
