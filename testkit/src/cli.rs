//! Flag parsing for unit tests, written once: a component's `Args` parsed on their own (so a
//! component's tests need not know the binary's `Cli`), or a whole binary's `Cli`.

use clap::{Args, Parser};

#[derive(Parser)]
#[command(name = "test")]
struct Only<A: Args> {
    #[command(flatten)]
    args: A,
}

/// `flags` parsed as `A` alone; the error is clap's message.
pub fn args<A: Args>(flags: &[&str]) -> Result<A, String> {
    Only::<A>::try_parse_from(std::iter::once("test").chain(flags.iter().copied()))
        .map(|o| o.args)
        .map_err(|e| e.to_string())
}

/// `flags` parsed as the binary's whole command line.
pub fn cli<P: Parser>(flags: &[&str]) -> Result<P, String> {
    P::try_parse_from(std::iter::once("test").chain(flags.iter().copied()))
        .map_err(|e| e.to_string())
}

/// Runs the binary `bin` with `args` (and `NODE_NAME` set, which the node-agent needs before
/// it reads its other flags) and asserts that it refuses them the way an admin can act on:
/// exit 2, one line on stderr, no panic. Returns that line.
pub fn refused(bin: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(bin)
        .args(args)
        .env("NODE_NAME", "n1")
        .output()
        .unwrap_or_else(|e| panic!("run {bin}: {e}"));
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    err
}

/// `XArgs::from_flags(&["--flag=value"])` in a component's tests: [`args`] as a method.
pub trait Flags: Sized {
    fn from_flags(flags: &[&str]) -> Result<Self, String>;
}

impl<A: Args> Flags for A {
    fn from_flags(flags: &[&str]) -> Result<Self, String> {
        args(flags)
    }
}

/// `Cli::from_command_line(&["--flag", "sub"])`: [`cli`] as a method.
pub trait CommandLine: Sized {
    fn from_command_line(flags: &[&str]) -> Result<Self, String>;
}

impl<P: Parser> CommandLine for P {
    fn from_command_line(flags: &[&str]) -> Result<Self, String> {
        cli(flags)
    }
}

/// Variables a flag may fall back to without the `GROUNDSKEEPER_` prefix: the ones the pod spec
/// sets from the downward API, under the names every manifest uses.
pub const UNPREFIXED_ENV: &[&str] = &["POD_NAME", "POD_NAMESPACE", "NODE_NAME"];

/// Every argument of `cmd` and its subcommands, as `(command path, argument id)`.
pub fn all_arguments(cmd: &clap::Command) -> Vec<(String, clap::Arg)> {
    fn walk(cmd: &clap::Command, path: String, out: &mut Vec<(String, clap::Arg)>) {
        for a in cmd.get_arguments() {
            out.push((path.clone(), a.clone()));
        }
        for sub in cmd.get_subcommands() {
            walk(sub, format!("{path} {}", sub.get_name()), out);
        }
    }
    let mut out = Vec::new();
    walk(cmd, cmd.get_name().to_string(), &mut out);
    out
}

/// Flags of `cmd` (and its subcommands) whose env fallback is neither `GROUNDSKEEPER_`-prefixed
/// nor in [`UNPREFIXED_ENV`]: an unrelated variable of that name in a pod's or shell's
/// environment would silently set them.
pub fn unprefixed_env(cmd: &clap::Command) -> Vec<String> {
    all_arguments(cmd)
        .into_iter()
        .filter_map(|(path, a)| {
            let env = a.get_env()?.to_string_lossy().into_owned();
            (!env.starts_with("GROUNDSKEEPER_") && !UNPREFIXED_ENV.contains(&env.as_str()))
                .then(|| format!("{path} --{}: {env}", a.get_id()))
        })
        .collect()
}

/// The top-level flags of `cmd` that `--help` shows under no component's heading (other than
/// --help and --version).
pub fn ungrouped_flags(cmd: &clap::Command) -> Vec<String> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_help_heading().is_none())
        .map(|a| a.get_id().to_string())
        .filter(|id| id != "help" && id != "version")
        .collect()
}
