//! How an answer is printed: a table or sentences for people, the same facts as JSON or YAML
//! for scripts (`-o json|yaml`, as kubectl prints them), and kubectl's ages and tables.

use clap::ValueEnum;
use serde::Serialize;

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
    Yaml,
}

/// An answer: its text, and the same facts structured.
pub struct Answer {
    pub text: String,
    pub data: serde_json::Value,
}

impl Answer {
    pub fn new(text: String, data: &impl Serialize) -> anyhow::Result<Self> {
        Ok(Self {
            text,
            data: serde_json::to_value(data)?,
        })
    }

    /// The answer as `output` asks.
    pub fn print(self, output: Output) -> anyhow::Result<String> {
        match output {
            Output::Text => Ok(self.text),
            Output::Json => Ok(serde_json::to_string_pretty(&self.data)? + "\n"),
            Output::Yaml => Ok(serde_norway::to_string(&self.data)?),
        }
    }
}

/// A table as kubectl prints one: upper-case headers, columns padded to their widest cell and
/// three spaces apart.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = headers.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                let pad = widths[i] - cell.chars().count() + 3;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// An age as kubectl prints one (apimachinery's `duration.HumanDuration`).
pub fn age(d: jiff::SignedDuration) -> String {
    let seconds = d.as_secs();
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    let unit = |big: i64, bs: &str, small: i64, ss: &str| match small {
        0 => format!("{big}{bs}"),
        _ => format!("{big}{bs}{small}{ss}"),
    };
    if minutes < 10 {
        return unit(minutes, "m", seconds % 60, "s");
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    let (days, years) = (hours / 24, hours / 24 / 365);
    if hours < 8 {
        unit(hours, "h", minutes % 60, "m")
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 24 * 8 {
        unit(days, "d", hours % 24, "h")
    } else if hours < 24 * 365 * 2 {
        format!("{days}d")
    } else if hours < 24 * 365 * 8 {
        unit(years, "y", days % 365, "d")
    } else {
        format!("{years}y")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::SignedDuration as D;

    #[test]
    fn ages_as_kubectl_prints_them() {
        for (secs, want) in [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600 + 60, "3h1m"),
            (8 * 3600 + 60, "8h"),
            (50 * 3600, "2d2h"),
            (48 * 3600, "2d"),
            (10 * 86400, "10d"),
            (3 * 365 * 86400 + 86400, "3y1d"),
            (9 * 365 * 86400, "9y"),
        ] {
            assert_eq!(age(D::from_secs(secs)), want, "{secs}s");
        }
    }

    #[test]
    fn tables_pad_columns_three_spaces_apart() {
        let t = table(
            &["NAME", "AGE"],
            &[
                vec!["a-long-name".into(), "5s".into()],
                vec!["b".into(), "10m".into()],
            ],
        );
        assert_eq!(
            t,
            "NAME          AGE\na-long-name   5s\nb             10m\n"
        );
    }

    #[test]
    fn every_output_prints_the_same_facts() {
        let a = || Answer::new("text\n".into(), &serde_json::json!({"a": [1]})).unwrap();
        assert_eq!(a().print(Output::Text).unwrap(), "text\n");
        let j: serde_json::Value = serde_json::from_str(&a().print(Output::Json).unwrap()).unwrap();
        let y: serde_json::Value =
            serde_norway::from_str(&a().print(Output::Yaml).unwrap()).unwrap();
        assert_eq!(j, y);
        assert_eq!(j["a"][0], 1);
    }
}
