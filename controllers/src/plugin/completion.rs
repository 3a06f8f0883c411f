//! Shell completion: `completion bash|zsh|fish` prints a script (clap_complete's) that
//! completes the `kubectl-groundskeeper` executable; `__complete WORDS...` answers kubectl's own
//! plugin completion (kubectl 1.26+ runs `kubectl_complete-groundskeeper` with the words after
//! `kubectl groundskeeper`, the last one being completed, and reads cobra's format: one
//! candidate a line, then `:DIRECTIVE`).

use clap::{Arg, Command, CommandFactory, ValueEnum};

use super::{Cli, NAME};

/// The word that asks for kubectl's plugin completion, first on the command line.
pub const COMPLETE: &str = "__complete";

/// cobra's directives: complete no file names; or let the shell complete file names.
const NO_FILE: u8 = 4;
const FILES: u8 = 0;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// The completion script for `shell`, for the executable `kubectl-groundskeeper`.
pub fn script(shell: Shell) -> String {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), NAME, &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn takes_value(a: &Arg) -> bool {
    a.get_num_args().is_some_and(|n| n.takes_values())
}

fn flag<'a>(cmd: &'a Command, word: &str) -> Option<&'a Arg> {
    if let Some(long) = word.strip_prefix("--") {
        cmd.get_arguments().find(|a| a.get_long() == Some(long))
    } else {
        let short = word.strip_prefix('-')?.chars().next()?;
        cmd.get_arguments().find(|a| a.get_short() == Some(short))
    }
}

fn values(a: &Arg) -> Vec<String> {
    a.get_possible_values()
        .iter()
        .map(|v| v.get_name().to_string())
        .collect()
}

/// kubectl's plugin completion of `words` (the last is the one being completed).
pub fn complete(words: &[String]) -> String {
    let mut root = Cli::command();
    root.build();
    let mut cmd = &root;
    let (done, last) = match words.split_last() {
        Some((last, done)) => (done, last.as_str()),
        None => (&[][..], ""),
    };
    let mut pending: Option<&Arg> = None;
    for w in done {
        if pending.take().is_some() {
            continue;
        }
        if w.starts_with('-') {
            pending = flag(cmd, w).filter(|a| takes_value(a) && !w.contains('='));
        } else if let Some(sub) = cmd.find_subcommand(w) {
            cmd = sub;
        }
    }
    let (candidates, directive) = match pending {
        Some(a) if values(a).is_empty() => (Vec::new(), FILES),
        Some(a) => (values(a), NO_FILE),
        None if last.starts_with('-') => {
            let longs = cmd
                .get_arguments()
                .filter(|a| !a.is_hide_set())
                .filter_map(|a| a.get_long().map(|l| format!("--{l}")));
            (longs.collect(), NO_FILE)
        }
        None => {
            let subs = cmd
                .get_subcommands()
                .filter(|s| !s.is_hide_set() && s.get_name() != "help")
                .map(|s| s.get_name().to_string());
            let positional = cmd.get_positionals().flat_map(values);
            (subs.chain(positional).collect(), NO_FILE)
        }
    };
    let mut out: String = candidates
        .into_iter()
        .filter(|c| c.starts_with(last))
        .map(|c| c + "\n")
        .collect();
    out.push_str(&format!(":{directive}\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(words: &[&str]) -> Vec<String> {
        let words: Vec<String> = words.iter().map(|s| s.to_string()).collect();
        complete(&words).lines().map(String::from).collect()
    }

    #[test]
    fn kubectl_plugin_completion_in_cobras_format() {
        assert_eq!(ask(&["w"]), ["why", ":4"]);
        assert!(ask(&[""]).starts_with(&["get".into(), "why".into()]));
        assert_eq!(ask(&["why", ""]), ["servicecidr", "pod", ":4"]);
        assert_eq!(ask(&["get", "s"]), ["servicecidrs", ":4"]);
        assert_eq!(ask(&["-n", "shop", "why", "po"]), ["pod", ":4"]);
        assert_eq!(
            ask(&["get", "servicecidrs", "-o", ""]),
            ["text", "json", "yaml", ":4"]
        );
        assert!(ask(&["why", "pod", "--as-"]).contains(&"--as-group".into()));
        assert_eq!(ask(&["completion", "z"]), ["zsh", ":4"]);
        // A file name: the shell's own completion.
        assert_eq!(ask(&["sysctl", "check", "-f", ""]), [":0"]);
    }

    #[test]
    fn scripts_complete_the_executable() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let s = script(shell);
            assert!(s.contains(NAME), "{shell:?}");
            assert!(s.contains("servicecidrs"), "{shell:?}");
        }
    }
}
