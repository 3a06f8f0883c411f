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

/// A part a selection flag can name: its name, and the other names it answers to (upstream's
/// names for the same controller).
#[derive(Clone, Copy, Debug)]
pub struct Part {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
}

impl Part {
    fn answers_to(&self, s: &str) -> bool {
        self.name == s || self.aliases.contains(&s)
    }
}

/// Parses a comma-separated selection of named parts (controllers, node tasks) against the
/// known names, with kube-controller-manager's `--controllers` syntax: `name` selects a part,
/// `-name` leaves it out, `*` selects every part not named with `-`; where a part is named
/// more than once the first mention wins (upstream's rule). Any name a part answers to may be
/// used. An empty string selects none. Unknown names are refused by name. The selection is in
/// the order of `known`.
pub fn parse_selection(s: &str, known: &[Part]) -> Result<Vec<&'static str>, String> {
    let mut star = false;
    let mut chosen: Vec<(&'static str, bool)> = Vec::new();
    for item in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if item == "*" {
            star = true;
            continue;
        }
        let (on, name) = match item.strip_prefix('-') {
            Some(n) => (false, n),
            None => (true, item),
        };
        let Some(part) = known.iter().find(|k| k.answers_to(name)) else {
            let names: Vec<String> = known
                .iter()
                .map(|k| {
                    std::iter::once(k.name)
                        .chain(k.aliases.iter().copied())
                        .collect::<Vec<_>>()
                        .join(" or ")
                })
                .collect();
            return Err(format!(
                "unknown name {name:?} in {item:?} (known: {}; `*` for all, `-name` to leave one out)",
                names.join(", ")
            ));
        };
        if !chosen.iter().any(|(n, _)| *n == part.name) {
            chosen.push((part.name, on));
        }
    }
    Ok(known
        .iter()
        .filter(|k| match chosen.iter().find(|(n, _)| *n == k.name) {
            Some((_, on)) => *on,
            None => star,
        })
        .map(|k| k.name)
        .collect())
}

#[cfg(test)]
mod selection_tests {
    use super::{Part, parse_selection};

    const KNOWN: &[Part] = &[
        Part {
            name: "servicecidr",
            aliases: &["service-cidr-controller"],
        },
        Part {
            name: "podgc",
            aliases: &["pod-garbage-collector-controller"],
        },
    ];

    #[test]
    fn selection() {
        let sel = |s| parse_selection(s, KNOWN);
        assert_eq!(sel("servicecidr,podgc"), Ok(vec!["servicecidr", "podgc"]));
        assert_eq!(sel("podgc,servicecidr"), Ok(vec!["servicecidr", "podgc"]));
        assert_eq!(sel(" podgc ,podgc"), Ok(vec!["podgc"]));
        assert_eq!(sel(""), Ok(vec![]));
        assert_eq!(sel("*"), Ok(vec!["servicecidr", "podgc"]));
        assert_eq!(sel("*,-podgc"), Ok(vec!["servicecidr"]));
        assert_eq!(
            sel("-pod-garbage-collector-controller,*"),
            Ok(vec!["servicecidr"])
        );
        assert_eq!(sel("service-cidr-controller"), Ok(vec!["servicecidr"]));
        assert_eq!(sel("-podgc"), Ok(vec![]));
        // The first mention wins, as in kube-controller-manager.
        assert_eq!(sel("podgc,-podgc"), Ok(vec!["podgc"]));
        assert_eq!(sel("-podgc,*,podgc"), Ok(vec!["servicecidr"]));
        for (bad, name) in [
            ("servicecidr,podgcc", "podgcc"),
            ("-nope", "nope"),
            ("*,-", ""),
            ("**", "**"),
        ] {
            let e = sel(bad).unwrap_err();
            assert!(e.contains(&format!("{name:?}")), "{bad}: {e}");
        }
    }

    /// The rule, over every list of up to four items from all spellings: a part is selected
    /// iff its first mention (under any name) is without `-`, or it is not mentioned and `*` is.
    #[test]
    fn first_mention_wins_else_star() {
        let items = [
            "*",
            "servicecidr",
            "-servicecidr",
            "service-cidr-controller",
            "-service-cidr-controller",
            "podgc",
            "-podgc",
            "pod-garbage-collector-controller",
            "-pod-garbage-collector-controller",
        ];
        let n = items.len();
        for len in 0..=4u32 {
            for mut code in 0..n.pow(len) {
                let list: Vec<&str> = (0..len)
                    .map(|_| {
                        let i = items[code % n];
                        code /= n;
                        i
                    })
                    .collect();
                let got = parse_selection(&list.join(","), KNOWN).unwrap();
                for part in KNOWN {
                    let first = list
                        .iter()
                        .find(|i| part.answers_to(i.trim_start_matches('-')));
                    let want = match first {
                        Some(i) => !i.starts_with('-'),
                        None => list.contains(&"*"),
                    };
                    assert_eq!(got.contains(&part.name), want, "{list:?}: {got:?}");
                }
            }
        }
    }
}
