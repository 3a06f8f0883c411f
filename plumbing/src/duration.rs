//! Durations as flags and annotations take them: Go's `time.ParseDuration` syntax (what
//! kube-controller-manager's flags take), and a bare number of seconds.

use std::time::Duration;

/// The longest duration a flag takes: no housekeeping interval needs more, and well below it
/// no timer or deadline can overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// Parses a duration the way Go's `time.ParseDuration` does (what kube-controller-manager's
/// flags take): a sequence of decimal numbers, each with an optional fraction and a unit, `ns`,
/// `us` (or `µs`), `ms`, `s`, `m`, `h` (`300ms`, `1.5h`, `1h30m`, `.5s`, `+2m`), or `0`. Also,
/// as before Go syntax was accepted, a bare number of seconds (`40`, `1.5`). Negative
/// durations (other than `-0`) and anything over [`MAX_DURATION`] are refused, naming the value.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return bare_seconds(s);
    }
    let nanos = go_duration_nanos(s).map_err(|why| format!("{s:?} is not a duration: {why}"))?;
    if nanos > MAX_DURATION.as_nanos() {
        return Err(format!(
            "{s:?} is longer than the maximum, 8784h (366 days)"
        ));
    }
    Ok(Duration::from_nanos(nanos as u64))
}

const EXAMPLES: &str = "examples: 500ms, 30s, 2m, 1h30m, 1.5s";

fn bare_seconds(s: &str) -> Result<Duration, String> {
    let n: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a duration ({EXAMPLES})"))?;
    if n > MAX_DURATION.as_secs_f64() {
        return Err(format!(
            "{s:?} is longer than the maximum, 8784h (366 days)"
        ));
    }
    Ok(Duration::from_secs_f64(n))
}

/// Go's `time.ParseDuration` grammar, `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+` or `0`, to
/// nanoseconds; like Go, a fraction adds `fraction × unit` truncated to whole nanoseconds. Sums
/// saturate (anything that large is refused by the caller); a negative non-zero value is an
/// error here.
fn go_duration_nanos(s: &str) -> Result<u128, String> {
    let (negative, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(EXAMPLES.into());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let digits = |t: &str| t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let int_len = digits(rest);
        let (int, after) = rest.split_at(int_len);
        let (frac, after) = match after.strip_prefix('.') {
            Some(f) => f.split_at(digits(f)),
            None => ("", after),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(format!("a number must come before each unit ({EXAMPLES})"));
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let per_unit: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => {
                return Err(format!(
                    "missing unit after {:?} ({EXAMPLES})",
                    &rest[..rest.len() - after.len()]
                ));
            }
            _ => return Err(format!("unknown unit {unit:?} (use ns, us, ms, s, m or h)")),
        };
        // Past 30 integer digits the value is far over any maximum: saturate, do not overflow.
        let whole: u128 = if int.len() > 30 {
            u128::MAX
        } else {
            int.parse().unwrap_or(0)
        };
        total = total.saturating_add(whole.saturating_mul(per_unit));
        total = total.saturating_add(fraction_nanos(frac, per_unit));
        rest = after;
    }
    if negative && total > 0 {
        return Err("a duration cannot be negative".into());
    }
    Ok(total)
}

/// `0.frac × per_unit` in whole nanoseconds, computed as Go does: the fraction's digits as an
/// integer (digits past what fits in an int64 are dropped), then `f × (unit / scale)` in
/// float64, truncated.
fn fraction_nanos(frac: &str, per_unit: u128) -> u128 {
    let (mut f, mut scale) = (0u64, 1f64);
    for d in frac.bytes() {
        let next = f
            .checked_mul(10)
            .and_then(|x| x.checked_add(u64::from(d - b'0')));
        match next {
            Some(x) if x <= i64::MAX as u64 => {
                f = x;
                scale *= 10.0;
            }
            _ => break,
        }
    }
    (f as f64 * (per_unit as f64 / scale)) as u128
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("40"), Ok(Duration::from_secs(40)));
        let e = parse_duration("10x").unwrap_err();
        assert!(e.contains("10x") && e.contains("unit"), "{e}");
        assert!(parse_duration("abc").unwrap_err().contains("abc"));
        assert!(parse_duration("").is_err());
        for huge in ["99999999999999999999999s", "1e20s", "10000000h", "8785h"] {
            let e = parse_duration(huge).unwrap_err();
            assert!(e.contains(huge), "{huge}: {e}");
        }
        assert_eq!(parse_duration("8784h"), Ok(MAX_DURATION));
    }

    /// Go's own examples and corner cases (time.ParseDuration's tests), and the forms we
    /// accepted before Go syntax (a bare number of seconds).
    #[test]
    fn go_duration_syntax() {
        let ns = Duration::from_nanos;
        for (text, want) in [
            ("0", ns(0)),
            ("5s", Duration::from_secs(5)),
            ("30s", Duration::from_secs(30)),
            ("1478s", Duration::from_secs(1478)),
            ("-0", ns(0)),
            ("+5s", Duration::from_secs(5)),
            ("-0s", ns(0)),
            ("+0s", ns(0)),
            ("5.0s", Duration::from_secs(5)),
            ("5.6s", Duration::from_millis(5600)),
            ("5.s", Duration::from_secs(5)),
            (".5s", Duration::from_millis(500)),
            ("1.0s", Duration::from_secs(1)),
            ("1.00s", Duration::from_secs(1)),
            ("1.004s", Duration::from_millis(1004)),
            ("1.0040s", Duration::from_millis(1004)),
            ("100.00100s", Duration::from_millis(100_001)),
            ("10ns", ns(10)),
            ("11us", ns(11_000)),
            ("12\u{b5}s", ns(12_000)),
            ("12\u{3bc}s", ns(12_000)),
            ("13ms", ns(13_000_000)),
            ("14s", Duration::from_secs(14)),
            ("15m", Duration::from_secs(900)),
            ("16h", Duration::from_secs(16 * 3600)),
            ("3h30m", Duration::from_secs(3 * 3600 + 1800)),
            ("1h30m", Duration::from_secs(5400)),
            ("10.5s4m", Duration::from_millis(4 * 60_000 + 10_500)),
            ("1h2m3s4ms5us6ns", ns(3_723_004_005_006)),
            ("39h9m14.425s", Duration::from_millis(140_954_425)),
            ("52763797000ns", ns(52_763_797_000)),
            ("0.3333333333333333333h", ns(1_200_000_000_000)),
            ("0.100000000000000000000h", Duration::from_secs(360)),
            ("1.5ns", ns(1)),
            (" 1h30m ", Duration::from_secs(5400)),
            // Before Go syntax: a bare number is seconds.
            ("1.5", Duration::from_millis(1500)),
            ("40", Duration::from_secs(40)),
        ] {
            assert_eq!(parse_duration(text), Ok(want), "{text:?}");
        }
        for bad in [
            "-", "+", "-3", "s", ".", "-.", ".s", "+.s", "1d", "1..5s", "1.5.s", "3000000h", "-1s",
            "-1ns", "1s-2s", "1 s", "1h 30m", "h1", "1e3s", "1\u{b5}", "0x10s",
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains(&format!("{:?}", bad.trim())), "{bad:?}: {e}");
        }
    }

    use testkit::rng::Rng;

    /// The rule, over generated strings: a sum of parts `<int>[.<frac>]<unit>`, in any order
    /// and with units repeated, as Go writes and reads them, parses to the exact sum of its
    /// parts. Fractions are kept to the digits a unit divides into whole nanoseconds, where
    /// Go's float arithmetic is exact too; an optional leading `+`; `.5s` and `5.s` forms.
    #[test]
    fn sums_of_unit_parts_parse_to_their_exact_sum() {
        // (spelling, nanoseconds, most fraction digits that stay whole nanoseconds)
        const UNITS: [(&str, u128, u32); 9] = [
            ("ns", 1, 0),
            ("us", 1_000, 3),
            ("\u{b5}s", 1_000, 3),
            ("\u{3bc}s", 1_000, 3),
            ("ms", 1_000_000, 6),
            ("s", 1_000_000_000, 9),
            ("m", 60_000_000_000, 10),
            ("h", 3_600_000_000_000, 11),
            ("h", 3_600_000_000_000, 0),
        ];
        for seed in 0..5000u64 {
            let mut rng = Rng(seed);
            let mut text = String::new();
            let mut want: u128 = 0;
            if rng.below_u64(4) == 0 {
                text.push('+');
            }
            for _ in 0..1 + rng.below_u64(5) {
                let (unit, per, max_frac) = UNITS[rng.below_u64(UNITS.len() as u64) as usize];
                // Small enough that five parts stay under the 8784h maximum.
                let whole = match rng.below_u64(3) {
                    0 => 0,
                    1 => rng.below_u64(100),
                    _ => rng.below_u64(1_000_000_000_000_000) / per as u64 / 5,
                } as u128;
                let frac_digits = if max_frac == 0 {
                    0
                } else {
                    rng.below_u64(u64::from(max_frac) + 1) as u32
                };
                let frac = if frac_digits == 0 {
                    0
                } else {
                    rng.below_u64(10u64.pow(frac_digits)) as u128
                };
                let int_text = if whole == 0 && frac_digits > 0 && rng.below_u64(2) == 0 {
                    String::new() // `.5s`
                } else {
                    whole.to_string()
                };
                text.push_str(&int_text);
                if frac_digits > 0 {
                    text.push_str(&format!(".{frac:0width$}", width = frac_digits as usize));
                } else if rng.below_u64(8) == 0 {
                    text.push('.'); // `5.s`
                }
                text.push_str(unit);
                want += whole * per + frac * per / 10u128.pow(frac_digits);
            }
            let got = parse_duration(&text)
                .unwrap_or_else(|e| panic!("seed {seed}: {text:?} refused: {e}"));
            assert_eq!(got.as_nanos(), want, "seed {seed}: {text:?}");
        }
    }

    /// Every generated string that is not Go syntax (a part without digits, without a unit, or
    /// with an unknown unit) is refused, naming the string.
    #[test]
    fn strings_outside_the_grammar_are_refused_by_name() {
        let parts = [
            "1", ".", "5.", ".5", "2", "s", "ms", "h", "x", "d", "e", "-", " ", "µs", "us",
        ];
        for seed in 0..5000u64 {
            let mut rng = Rng(seed);
            let text: String = (0..1 + rng.below_u64(5))
                .map(|_| parts[rng.below_u64(parts.len() as u64) as usize])
                .collect();
            let trimmed = text.trim();
            let go_ok = is_go_duration(trimmed)
                || (!trimmed.is_empty()
                    && trimmed.chars().all(|c| c.is_ascii_digit() || c == '.')
                    && trimmed.parse::<f64>().is_ok());
            match parse_duration(&text) {
                Ok(_) => assert!(go_ok, "seed {seed}: {text:?} accepted"),
                Err(e) => {
                    assert!(!go_ok, "seed {seed}: {text:?} refused: {e}");
                    assert!(e.contains(&format!("{trimmed:?}")), "{e}");
                }
            }
        }
    }

    /// Go's grammar as a recogniser, independent of the parser: `[-+]?` then one or more
    /// `digits* (. digits*)? unit` with a digit somewhere in the number, or `0`; negatives
    /// only when zero (none are generated above).
    fn is_go_duration(s: &str) -> bool {
        let s = s.strip_prefix('+').unwrap_or(s);
        if s == "0" {
            return true;
        }
        let units = ["ns", "us", "\u{b5}s", "\u{3bc}s", "ms", "s", "m", "h"];
        let mut rest = s;
        if rest.is_empty() {
            return false;
        }
        while !rest.is_empty() {
            let n = rest
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .unwrap_or(rest.len());
            let number = &rest[..n];
            if number.matches('.').count() > 1 || !number.chars().any(|c| c.is_ascii_digit()) {
                return false;
            }
            let tail = &rest[n..];
            let u = tail
                .find(|c: char| c.is_ascii_digit() || c == '.')
                .unwrap_or(tail.len());
            if !units.contains(&&tail[..u]) {
                return false;
            }
            rest = &tail[u..];
        }
        true
    }
}
