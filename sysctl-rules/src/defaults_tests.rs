//! The defaults list and its judgement: tables, bounds, and properties over generated names
//! and hostile strings.

use testkit::rng::Rng;

use crate::defaults::*;
use crate::kernel::KernelVersion;
use crate::kubelet::Kubelet;
use crate::names::{Namespace, namespace_in, normalize};

fn list(s: &str) -> Vec<(String, String)> {
    parse(s)
        .unwrap_or_else(|e| panic!("{s:?}: {e}"))
        .iter()
        .map(|d| (d.name.clone(), d.value.clone()))
        .collect()
}

fn pairs(want: &[(&str, &str)]) -> Vec<(String, String)> {
    want.iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

fn kernel(s: &str) -> KernelVersion {
    s.parse().unwrap()
}

fn v(minor: u64) -> Kubelet {
    Kubelet::known(minor).unwrap()
}

#[test]
fn lists_parse_as_kubelet_lists_them() {
    assert!(parse("").unwrap().is_empty());
    assert!(parse(",,").unwrap().is_empty());
    assert_eq!(
        list("net.core.somaxconn=1024,kernel/shmmax=68719476736,"),
        pairs(&[
            ("net.core.somaxconn", "1024"),
            ("kernel/shmmax", "68719476736")
        ])
    );
    assert_eq!(
        list("net.ipv4.tcp_rmem=4096 87380 6291456,kernel.sem=250 32000 32 128"),
        pairs(&[
            ("net.ipv4.tcp_rmem", "4096 87380 6291456"),
            ("kernel.sem", "250 32000 32 128"),
        ])
    );
    // A value holding commas: each followed by a digit goes on the value.
    assert_eq!(
        list(
            "net.ipv4.ip_local_reserved_ports=30000-30100,31000,32000,user.max_user_namespaces=10"
        ),
        pairs(&[
            (
                "net.ipv4.ip_local_reserved_ports",
                "30000-30100,31000,32000"
            ),
            ("user.max_user_namespaces", "10"),
        ])
    );
    // The first `=` ends the name.
    assert_eq!(list("a.b=c=d"), pairs(&[("a.b", "c=d")]));
    let parsed = parse("net.core.somaxconn=1024,net.ipv4.ip_local_reserved_ports=1,2").unwrap();
    assert_eq!(
        parsed.to_string(),
        "net.core.somaxconn=1024,net.ipv4.ip_local_reserved_ports=1,2"
    );
    assert_eq!(parsed.len(), 2);
}

#[test]
fn bad_lists_are_refused_with_what_is_wrong() {
    for (input, says) in [
        (
            "net.core.somaxconn",
            r#"default pod sysctl "net.core.somaxconn": missing '='"#,
        ),
        ("a=1,,2", r#""2": missing '='"#),
        ("a=1,b", r#""b": missing '='"#),
        ("=1", r#""=1": empty name"#),
        (
            "Net.core.x=1",
            r#""Net.core.x": the name must have at most 253 characters"#,
        ),
        (
            "net.core.*=1",
            "must have at most 253 characters and match regex",
        ),
        (" net.core.x=1", r#"" net.core.x": the name"#),
        ("net.core.x=", r#""net.core.x": empty value"#),
        ("net.core.x=1\n", "control character"),
        (
            "net.core.x=1,net/core/x=2",
            r#""net/core/x" is given twice"#,
        ),
        ("a.b=1,a.b=1", r#""a.b" is given twice"#),
    ] {
        let e = parse(input).unwrap_err().to_string();
        assert!(e.contains(says), "{input:?}: {e}");
    }
}

#[test]
fn lists_are_bounded() {
    let n = |count: usize| {
        (0..count)
            .map(|i| format!("net.core.x{i}=1"))
            .collect::<Vec<_>>()
            .join(",")
    };
    assert_eq!(parse(&n(MAX_DEFAULTS)).unwrap().len(), MAX_DEFAULTS);
    assert_eq!(parse(&n(MAX_DEFAULTS + 1)), Err(ParseError::TooMany));
    let long_name = format!("net.{}", "a".repeat(249));
    assert!(parse(&format!("{long_name}=1")).is_ok());
    assert!(matches!(
        parse(&format!("{long_name}a=1")),
        Err(ParseError::BadName(_))
    ));
    let value = "1".repeat(MAX_VALUE_LENGTH);
    assert!(parse(&format!("net.core.x={value}")).is_ok());
    let e = parse(&format!("net.core.x={value},2")).unwrap_err();
    assert!(e.to_string().contains("longer than 1024"), "{e}");
    let huge = "a".repeat(MAX_INPUT_LENGTH + 1);
    assert_eq!(parse(&huge), Err(ParseError::TooLong(huge.len())));
    // Messages quote at most 64 characters of what they name.
    let e = parse(&"x".repeat(10_000)).unwrap_err().to_string();
    assert!(e.len() < 200, "{e}");
}

/// Arbitrary strings over an alphabet rich in separators, multi-byte and control characters:
/// never a panic; what parses is bounded, every name valid, and prints back to itself.
#[test]
fn hostile_strings_never_panic() {
    let alphabet = [
        'a', 'z', '0', '9', '.', '/', ',', '=', '*', '-', '_', ' ', '\n', '\0', 'ä', '\u{202e}',
        'N', '🦀',
    ];
    let mut parsed = 0;
    for seed in 0..4000u64 {
        let mut rng = Rng(seed);
        let len = rng.below(80);
        let s: String = (0..len).map(|_| rng.pick(&alphabet)).collect();
        let Ok(defaults) = parse(&s) else {
            continue;
        };
        parsed += 1;
        assert!(defaults.len() <= MAX_DEFAULTS, "seed {seed}: {s:?}");
        for d in defaults.iter() {
            assert!(crate::names::is_valid_name(&d.name), "seed {seed}: {s:?}");
            assert!(
                !d.value.is_empty() && !d.value.contains('\n'),
                "seed {seed}"
            );
        }
        assert_eq!(parse(&defaults.to_string()), Ok(defaults), "seed {seed}");
        // Every kubelet judges whatever parsed.
        for k in Kubelet::all() {
            effects(&parse(&s).unwrap(), k, None);
        }
    }
    assert!(parsed > 50, "only {parsed} generated lists parsed");
    for k in Kubelet::all() {
        for s in [
            "",
            "*",
            ".",
            "/",
            "user.",
            "net.",
            "ä.ö",
            "\0",
            "kernel.shm",
            "a/b.c/d",
        ] {
            effect_of(s, k, Some(&kernel("3.10")));
        }
    }
}

/// Names over the table's own segments and generated ones, and the safe sysctls themselves,
/// in dot and slash form.
fn generated_name(rng: &mut Rng) -> String {
    if rng.chance(15) {
        let safe = rng.pick(Kubelet::NEWEST.safe_list()).name;
        return if rng.chance(30) {
            safe.replace('.', "/")
        } else {
            safe.to_string()
        };
    }
    let firsts = ["net", "kernel", "fs", "user", "vm", "users", "ipc", "x"];
    let rest = [
        "ipv4",
        "core",
        "mqueue",
        "msgmax",
        "msg",
        "shm",
        "shmmax",
        "sem",
        "shm_rmid_forced",
        "domainname",
        "hostname",
        "max_user_namespaces",
        "tcp_rmem",
        "tcp_wmem",
        "tcp_notsent_lowat",
        "tcp_slow_start_after_idle",
        "tcp_keepalive_time",
        "ip_local_reserved_ports",
        "ip_local_port_range",
        "somaxconn",
        "msg_max",
        "a-b",
        "0",
    ];
    let mut parts = vec![rng.pick(&firsts).to_string()];
    for _ in 0..rng.below(4) {
        parts.push(rng.pick(&rest).to_string());
    }
    let sep = if rng.chance(20) { "/" } else { "." };
    parts.join(sep)
}

/// The property: on every kubelet, every kernel (known or not) and every generated name, the
/// judgement is the namespace table's: ignored before v1.37, not namespaced exactly where the
/// table has no namespace, otherwise applied in the table's namespace unless that kernel lacks
/// a safe sysctl's gate.
#[test]
fn the_judgement_agrees_with_the_namespace_table() {
    let kernels = [
        None,
        Some("3.10"),
        Some("4.5"),
        Some("4.14.300"),
        Some("4.15"),
        Some("6.1"),
    ];
    let (mut applied, mut unnamespaced, mut gated) = (0, 0, 0);
    for seed in 0..3000u64 {
        let mut rng = Rng(seed);
        let name = generated_name(&mut rng);
        let normal = normalize(&name);
        for k in Kubelet::all() {
            for kv in kernels {
                let kv = kv.map(kernel);
                let got = effect_of(&name, k, kv.as_ref());
                let table = namespace_in(k.namespaces(), &normal);
                let gate = Kubelet::NEWEST
                    .safe_list()
                    .iter()
                    .find(|s| s.name == normal)
                    .and_then(|s| s.min_kernel);
                let lacks = |(a, b)| {
                    kv.as_ref()
                        .is_some_and(|kv| !kv.at_least(&KernelVersion::new(&[a, b])))
                };
                let want = if k.minor() < FIRST_MINOR {
                    Effect::Ignored(k)
                } else if table == Namespace::Unknown {
                    unnamespaced += 1;
                    Effect::NotNamespaced(k)
                } else if let Some(needs) = gate.filter(|g| lacks(*g)) {
                    gated += 1;
                    Effect::KernelTooOld {
                        namespace: table,
                        kernel: kv.clone().unwrap(),
                        needs,
                    }
                } else {
                    applied += 1;
                    Effect::Applied(table)
                };
                assert_eq!(got, want, "seed {seed}: {name:?} on {k}, kernel {kv:?}");
                assert_eq!(
                    got.state() == State::Unavailable,
                    matches!(got, Effect::NotNamespaced(_) | Effect::KernelTooOld { .. })
                );
            }
        }
    }
    testkit::rng::reached(
        &[
            ("applied", applied, 500),
            ("not namespaced", unnamespaced, 500),
            ("kernel-gated", gated, 200),
        ],
        &(applied, unnamespaced, gated),
    );
}

#[test]
fn judgements_of_known_defaults() {
    let old = Some(kernel("4.14.0"));
    for (name, minor, want) in [
        ("net.core.somaxconn", 37, Effect::Applied(Namespace::Net)),
        ("net/core/somaxconn", 38, Effect::Applied(Namespace::Net)),
        ("kernel.shmmax", 37, Effect::Applied(Namespace::Ipc)),
        ("fs.mqueue.msg_max", 37, Effect::Applied(Namespace::Ipc)),
        ("kernel.domainname", 37, Effect::Applied(Namespace::Uts)),
        (
            "user.max_user_namespaces",
            37,
            Effect::Applied(Namespace::User),
        ),
        ("vm.swappiness", 37, Effect::NotNamespaced(v(37))),
        ("kernel.hostname", 38, Effect::NotNamespaced(v(38))),
        ("net.core.somaxconn", 36, Effect::Ignored(v(36))),
        ("vm.swappiness", 33, Effect::Ignored(v(33))),
        (
            "net.ipv4.tcp_rmem",
            37,
            Effect::KernelTooOld {
                namespace: Namespace::Net,
                kernel: kernel("4.14.0"),
                needs: (4, 15),
            },
        ),
        (
            "net.ipv4.tcp_fin_timeout",
            37,
            Effect::Applied(Namespace::Net),
        ),
    ] {
        assert_eq!(
            effect_of(name, v(minor), old.as_ref()),
            want,
            "{name} on v1.{minor}"
        );
    }
    // An unknown kernel tells no gate; a new enough one has it.
    for k in [None, Some(kernel("4.15"))] {
        assert_eq!(
            effect_of("net.ipv4.tcp_rmem", v(37), k.as_ref()),
            Effect::Applied(Namespace::Net)
        );
    }
    // The gate is the kernel's, whatever the kubelet's safe list.
    assert!(matches!(
        effect_of("net.ipv4.tcp_notsent_lowat", v(37), Some(&kernel("4.5"))),
        Effect::KernelTooOld { needs: (4, 6), .. }
    ));
    let defaults = parse("net.core.somaxconn=1,vm.swappiness=10").unwrap();
    let states: Vec<State> = effects(&defaults, v(37), None)
        .iter()
        .map(|(_, j)| j.state())
        .collect();
    assert_eq!(states, [State::Applied, State::Unavailable]);
}

#[test]
fn which_pods_a_default_applies_to() {
    use Namespace::*;
    let host = |network, ipc, users| PodHost {
        network,
        ipc,
        users,
    };
    for (ns, h, want) in [
        (Net, host(false, false, None), true),
        (Net, host(true, false, None), false),
        (Uts, host(true, false, Some(false)), false),
        (Uts, host(false, true, None), true),
        (Ipc, host(false, true, None), false),
        (Ipc, host(true, false, None), true),
        (User, host(false, false, None), false),
        (User, host(false, false, Some(true)), false),
        (User, host(true, true, Some(false)), true),
        (Unknown, host(false, false, Some(false)), false),
    ] {
        assert_eq!(applies_to(ns, h), want, "{ns:?} {h:?}");
    }
    let spec = k8s_openapi::api::core::v1::PodSpec {
        host_network: Some(true),
        host_users: Some(false),
        ..Default::default()
    };
    assert_eq!(PodHost::of(&spec), host(true, false, Some(false)));
    assert_eq!(PodHost::of(&Default::default()), PodHost::default());
}

#[test]
fn judgements_say_why() {
    let say = |j: Effect| j.to_string();
    assert_eq!(
        say(Effect::Applied(Namespace::User)),
        "applied to pods with hostUsers: false that do not set it themselves (User namespace)"
    );
    assert!(say(Effect::Ignored(v(36))).contains("kubelet v1.36 has no defaultPodSysctls"));
    assert!(say(Effect::NotNamespaced(v(37))).contains(
        "not a namespaced sysctl for kubelet v1.37: that kubelet refuses a configuration"
    ));
    assert_eq!(
        say(effect_of(
            "net.ipv4.tcp_wmem",
            v(38),
            Some(&kernel("4.14.0"))
        )),
        "not in the pod's Net namespace on kernel 4.14.0 (from 4.15 on): kubelet fails the \
         sandbox of every pod it applies to (pods without hostNetwork)"
    );
    let states: Vec<&str> = State::ALL.iter().map(|s| s.as_str()).collect();
    assert_eq!(states, ["applied", "ignored", "unavailable"]);
}
