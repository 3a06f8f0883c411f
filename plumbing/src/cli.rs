//! Flag parsing with errors an admin can act on: one line naming the flag and the bad value.

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, error::ErrorKind};

use crate::process::CommonArgs;

/// A binary's command line: its tools (subcommands that run and exit), the flags every
/// groundskeeper binary has, and its own flags `A`, reached through `Deref` (`cli.election`).
#[derive(Parser, Debug)]
#[command(version)]
pub struct Binary<C: Subcommand, A: Args> {
    #[command(subcommand)]
    pub command: Option<C>,
    #[command(flatten)]
    pub common: CommonArgs,
    #[command(flatten)]
    pub args: A,
}

impl<C: Subcommand, A: Args> std::ops::Deref for Binary<C, A> {
    type Target = A;
    fn deref(&self) -> &A {
        &self.args
    }
}

impl<C: Subcommand, A: Args> Binary<C, A> {
    /// The process arguments parsed under the binary's `name` and `about` (for `--help` and
    /// `--version`); bad flags as in [`parse`].
    pub fn parse_as(name: &'static str, about: &'static str) -> Self {
        Self::try_parse_as(name, about, std::env::args_os()).unwrap_or_else(|e| exit_on(e))
    }

    pub fn try_parse_as<I, T>(
        name: &'static str,
        about: &'static str,
        args: I,
    ) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let mut cmd = Self::command().name(name).bin_name(name).about(about);
        let mut matches = cmd.try_get_matches_from_mut(args)?;
        Self::from_arg_matches_mut(&mut matches).map_err(|e| e.format(&mut cmd))
    }
}

/// Parses the process arguments; on a bad flag prints one line and exits 2, on `--help`
/// or `--version` prints them and exits 0.
pub fn parse<T: Parser>() -> T {
    match T::try_parse() {
        Ok(v) => v,
        Err(e) => exit_on(e),
    }
}

fn exit_on(e: clap::Error) -> ! {
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            std::process::exit(0)
        }
        _ => {
            eprintln!("{}", one_line(&e));
            std::process::exit(2)
        }
    }
}

/// The first line of clap's rendering is the one that names the flag and the value; the rest
/// is usage boilerplate.
pub fn one_line(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let first = rendered
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("invalid arguments");
    first.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Parser, Debug)]
    struct Flags {
        #[arg(long, value_parser = crate::client::parse_duration)]
        period: std::time::Duration,
    }

    #[test]
    fn bad_value_is_one_line_naming_flag_and_value() {
        let e = Flags::try_parse_from(["x", "--period", "10x"]).unwrap_err();
        let line = one_line(&e);
        assert!(!line.contains('\n'));
        assert!(line.contains("--period") && line.contains("10x"), "{line}");
    }
}

/// Which named parts (controllers, node tasks) a flag selected.
#[derive(Clone, Debug, PartialEq)]
pub struct Selection(pub Vec<&'static str>);

impl Selection {
    pub fn has(&self, name: &str) -> bool {
        self.0.contains(&name)
    }
}

/// Parses a comma-separated selection of named parts (controllers, node tasks) against the
/// known names; an empty string selects none. Unknown names are refused by name.
pub fn parse_selection(s: &str, known: &[&'static str]) -> Result<Vec<&'static str>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match known.iter().find(|k| **k == part) {
            Some(k) if !out.contains(k) => out.push(*k),
            Some(_) => {}
            None => {
                return Err(format!(
                    "unknown name {part:?} (known: {})",
                    known.join(", ")
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod selection_tests {
    use super::parse_selection;

    #[test]
    fn selection() {
        let known = ["servicecidr", "podgc"];
        assert_eq!(
            parse_selection("servicecidr,podgc", &known),
            Ok(vec!["servicecidr", "podgc"])
        );
        assert_eq!(parse_selection(" podgc ,podgc", &known), Ok(vec!["podgc"]));
        assert_eq!(parse_selection("", &known), Ok(vec![]));
        let e = parse_selection("servicecidr,podgcc", &known).unwrap_err();
        assert!(e.contains("\"podgcc\""), "{e}");
    }
}
