//! Kubelet's `defaultPodSysctls` (v1.37 on, KEP-5996): the list, and each default judged for a
//! node's kubelet and kernel.
//!
//! Kubelet sets each default on every pod sandbox that has its own namespace of the sysctl's
//! kind and does not set the sysctl itself: `net.*` not with `hostNetwork`, IPC not with
//! `hostIPC`, UTS (`kernel.domainname`) not with `hostNetwork`, User (`user.*`) only with
//! `hostUsers: false` (unset is the host's user namespace). A default kubelet can not apply
//! either keeps it from starting (not namespaced for that kubelet) or fails the sandbox of every
//! pod it applies to (the kernel does not have it in the pod's namespace). Pure: the node-agent
//! reports what this says; nothing here reads a node.

use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::core::v1::PodSpec;

use super::kernel::KernelVersion;
use super::kubelet::{Kubelet, quoted};
use super::names::{MAX_LENGTH, NAME_REGEX, Namespace, is_valid_name, normalize};

/// The first kubelet minor version with `defaultPodSysctls`.
pub const FIRST_MINOR: u64 = 37;
/// At most this many defaults: each is a metric series and may be an Event.
pub const MAX_DEFAULTS: usize = 64;
/// A value is at most this long (a sysctl value is a line of a few numbers or words).
pub const MAX_VALUE_LENGTH: usize = 1024;
/// The whole list is at most this long, checked before it is split.
pub const MAX_INPUT_LENGTH: usize = MAX_DEFAULTS * (MAX_LENGTH + 1 + MAX_VALUE_LENGTH + 1);

/// One default as given: the name in dot or slash form, and its value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DefaultSysctl {
    pub name: String,
    pub value: String,
}

impl fmt::Display for DefaultSysctl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.name, self.value)
    }
}

/// A node's defaults, in the order given, each name once (compared normalized).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DefaultPodSysctls(Vec<DefaultSysctl>);

impl DefaultPodSysctls {
    pub fn iter(&self) -> std::slice::Iter<'_, DefaultSysctl> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// `name=value,name=value`, as parsed.
impl fmt::Display for DefaultPodSysctls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

/// Why a list of defaults can not be read. Input is quoted, cut at 64 characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("default pod sysctls: the list is {0} bytes long, at most {MAX_INPUT_LENGTH} are read")]
    TooLong(usize),
    #[error("default pod sysctls: more than {MAX_DEFAULTS}")]
    TooMany,
    #[error("default pod sysctl {0}: missing '=' (expected name=value)")]
    MissingEquals(String),
    #[error("default pod sysctl {0}: empty name (expected name=value)")]
    EmptyName(String),
    #[error(
        "default pod sysctl {0}: the name must have at most 253 characters and match regex \
         {NAME_REGEX}"
    )]
    BadName(String),
    #[error("default pod sysctl {name}: {why}")]
    BadValue { name: String, why: String },
    #[error("default pod sysctl {0} is given twice")]
    Duplicate(String),
}

/// Reads `name=value` items separated by commas, as kubelet's configuration lists them. An
/// empty item is none (`""`, a trailing comma). A value may itself hold commas where each is
/// followed by a digit (`net.ipv4.ip_local_reserved_ports=30000-30100,31000`): an item without
/// `=` that starts with a digit goes on the value before it. Bounded: the input, the count, each
/// name and value; hostile input is an error, never a panic.
pub fn parse(s: &str) -> Result<DefaultPodSysctls, ParseError> {
    if s.len() > MAX_INPUT_LENGTH {
        return Err(ParseError::TooLong(s.len()));
    }
    let mut out: Vec<DefaultSysctl> = Vec::new();
    // Whether the item before this one was a default whose value may go on.
    let mut open = false;
    for item in s.split(',') {
        if item.is_empty() {
            open = false;
            continue;
        }
        let Some((name, value)) = item.split_once('=') else {
            match out.last_mut() {
                Some(last) if open && item.starts_with(|c: char| c.is_ascii_digit()) => {
                    last.value.push(',');
                    last.value.push_str(item);
                    check_value(&last.name, &last.value)?;
                    continue;
                }
                _ => return Err(ParseError::MissingEquals(quoted(item))),
            }
        };
        if name.is_empty() {
            return Err(ParseError::EmptyName(quoted(item)));
        }
        if !is_valid_name(name) {
            return Err(ParseError::BadName(quoted(name)));
        }
        check_value(name, value)?;
        let normalized = normalize(name);
        if out.iter().any(|d| normalize(&d.name) == normalized) {
            return Err(ParseError::Duplicate(quoted(name)));
        }
        if out.len() == MAX_DEFAULTS {
            return Err(ParseError::TooMany);
        }
        out.push(DefaultSysctl {
            name: name.to_string(),
            value: value.to_string(),
        });
        open = true;
    }
    Ok(DefaultPodSysctls(out))
}

fn check_value(name: &str, value: &str) -> Result<(), ParseError> {
    let why = if value.is_empty() {
        "empty value"
    } else if value.len() > MAX_VALUE_LENGTH {
        "the value is longer than 1024 bytes"
    } else if value.chars().any(char::is_control) {
        "the value holds a control character"
    } else {
        return Ok(());
    };
    Err(ParseError::BadValue {
        name: quoted(name),
        why: why.into(),
    })
}

impl FromStr for DefaultPodSysctls {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse(s)
    }
}

/// What of a pod's namespaces it shares with the host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodHost {
    pub network: bool,
    pub ipc: bool,
    /// `hostUsers`: unset (None) is the host's user namespace.
    pub users: Option<bool>,
}

impl PodHost {
    pub fn of(spec: &PodSpec) -> Self {
        PodHost {
            network: spec.host_network == Some(true),
            ipc: spec.host_ipc == Some(true),
            users: spec.host_users,
        }
    }
}

/// Whether kubelet sets a default of `namespace` on a pod sharing `host` with the host (and
/// not setting that sysctl itself).
pub fn applies_to(namespace: Namespace, host: PodHost) -> bool {
    match namespace {
        Namespace::Net | Namespace::Uts => !host.network,
        Namespace::Ipc => !host.ipc,
        Namespace::User => host.users == Some(false),
        Namespace::Unknown => false,
    }
}

/// The pods a default of `namespace` applies to, for messages.
pub fn pods(namespace: Namespace) -> &'static str {
    match namespace {
        Namespace::Net | Namespace::Uts => "pods without hostNetwork",
        Namespace::Ipc => "pods without hostIPC",
        Namespace::User => "pods with hostUsers: false",
        Namespace::Unknown => "no pod",
    }
}

/// What a node's kubelet does with one default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Set on every pod of [`pods`] of this namespace that does not set it itself.
    Applied(Namespace),
    /// This kubelet has no `defaultPodSysctls`: it sets no default.
    Ignored(Kubelet),
    /// Not namespaced for this kubelet: it refuses a configuration with it as a default.
    NotNamespaced(Kubelet),
    /// Namespaced for the kubelet, but this kernel does not have it in the pod's namespace
    /// before `needs`: every sandbox it applies to fails.
    KernelTooOld {
        namespace: Namespace,
        kernel: KernelVersion,
        needs: (u64, u64),
    },
}

/// The three states of a judgement, as the metric's `state` label says them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    Applied,
    Ignored,
    Unavailable,
}

impl State {
    pub const ALL: [State; 3] = [State::Applied, State::Ignored, State::Unavailable];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Applied => "applied",
            State::Ignored => "ignored",
            State::Unavailable => "unavailable",
        }
    }
}

impl Effect {
    pub fn state(&self) -> State {
        match self {
            Effect::Applied(_) => State::Applied,
            Effect::Ignored(_) => State::Ignored,
            Effect::NotNamespaced(_) | Effect::KernelTooOld { .. } => State::Unavailable,
        }
    }
}

/// Why, in a sentence's second half: what kubelet does with the default and to which pods.
impl fmt::Display for Effect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Effect::Applied(ns) => write!(
                f,
                "applied to {} that do not set it themselves ({ns} namespace)",
                pods(*ns)
            ),
            Effect::Ignored(k) => write!(
                f,
                "not applied: kubelet {k} has no defaultPodSysctls (kubelet v1.{FIRST_MINOR} adds it)"
            ),
            Effect::NotNamespaced(k) => write!(
                f,
                "not a namespaced sysctl for kubelet {k}: that kubelet refuses a configuration \
                 setting it as a default (it does not start), and no pod sandbox can take it"
            ),
            Effect::KernelTooOld {
                namespace,
                kernel,
                needs: (major, minor),
            } => write!(
                f,
                "not in the pod's {namespace} namespace on kernel {kernel} (from {major}.{minor} \
                 on): kubelet fails the sandbox of every pod it applies to ({})",
                pods(*namespace)
            ),
        }
    }
}

/// One default's judgement on a node whose kubelet has the rules of `kubelet`, running `kernel`
/// (None: unknown, so no kernel gate can be told). Kernel gates are known for the safe sysctls
/// only (the newest kubelet's list: a gate is the kernel's, whatever the kubelet).
pub fn effect_of(name: &str, kubelet: Kubelet, kernel: Option<&KernelVersion>) -> Effect {
    if kubelet.minor() < FIRST_MINOR {
        return Effect::Ignored(kubelet);
    }
    let name = normalize(name);
    let namespace = kubelet.namespace_of(&name);
    if namespace == Namespace::Unknown {
        return Effect::NotNamespaced(kubelet);
    }
    let gate = Kubelet::NEWEST
        .safe_list()
        .iter()
        .find(|s| s.name == name)
        .and_then(|s| s.min_kernel);
    match (gate, kernel) {
        (Some((major, minor)), Some(k)) if !k.at_least(&KernelVersion::new(&[major, minor])) => {
            Effect::KernelTooOld {
                namespace,
                kernel: k.clone(),
                needs: (major, minor),
            }
        }
        _ => Effect::Applied(namespace),
    }
}

/// Every default of `defaults` judged, in order.
pub fn effects<'a>(
    defaults: &'a DefaultPodSysctls,
    kubelet: Kubelet,
    kernel: Option<&KernelVersion>,
) -> Vec<(&'a DefaultSysctl, Effect)> {
    defaults
        .iter()
        .map(|d| (d, effect_of(&d.name, kubelet, kernel)))
        .collect()
}
