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
