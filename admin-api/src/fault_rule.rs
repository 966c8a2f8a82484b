//! A store fault rule and its one text form, after fail-rs:
//! `[P%][N*]KIND[(ARG)]`, with KIND one of `error(message)`, `timeout(ms)`,
//! `delay(ms)`, `lost`, `off`. The gateway's store decorator (`idem::store::Faulty`)
//! applies them, `PUT /v1/faults` carries them as JSON, and the console shows
//! and takes them as this text; the `gateway` fuzz target parses them as
//! operators type them.
//!
//! ```
//! use idem_admin_api::{FaultRule, FaultKind};
//! let rule: FaultRule = "25%3*error(connection refused)".parse().unwrap();
//! assert_eq!(rule.kind, FaultKind::Error);
//! assert_eq!((rule.probability, rule.count), (0.25, Some(3)));
//! assert_eq!(rule.to_string(), "25%3*error(connection refused)");
//! ```

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// The store operations a fault can hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Get,
    Insert,
    Replace,
    Delete,
}

impl Op {
    pub const ALL: [Op; 4] = [Op::Get, Op::Insert, Op::Replace, Op::Delete];

    pub fn as_str(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::Insert => "insert",
            Op::Replace => "replace",
            Op::Delete => "delete",
        }
    }
}

impl FromStr for Op {
    type Err = ParseFaultError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Op::ALL
            .into_iter()
            .find(|op| op.as_str() == s)
            .ok_or_else(|| {
                ParseFaultError(format!(
                    "unknown store operation {s:?}; expected get, insert, replace or delete"
                ))
            })
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a fault does to an operation it hits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Nothing: the rule is switched off.
    #[default]
    Off,
    /// Fails at once with the rule's message; nothing is applied.
    Error,
    /// Waits `latency_ms`, then fails as a timeout; nothing is applied.
    Timeout,
    /// Waits `latency_ms`, then runs the operation normally.
    Delay,
    /// Applies the operation, then fails as if the reply were lost.
    Lost,
}

impl FaultKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::Off => "off",
            FaultKind::Error => "error",
            FaultKind::Timeout => "timeout",
            FaultKind::Delay => "delay",
            FaultKind::Lost => "lost",
        }
    }

    /// Whether `latency_ms` means anything for this kind.
    pub fn uses_latency(self) -> bool {
        matches!(self, FaultKind::Timeout | FaultKind::Delay)
    }
}

/// One operation's fault.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FaultRule {
    pub kind: FaultKind,
    /// For `timeout` and `delay`.
    pub latency_ms: u64,
    /// The chance that each call is hit, from 0 to 1.
    pub probability: f64,
    /// Hit only this many more calls, then switch off.
    pub count: Option<u64>,
    /// For `error`.
    pub message: String,
}

impl Default for FaultRule {
    fn default() -> Self {
        FaultRule {
            kind: FaultKind::Off,
            latency_ms: 0,
            probability: 1.0,
            count: None,
            message: String::new(),
        }
    }
}

impl FaultRule {
    pub fn error(message: impl Into<String>) -> Self {
        FaultRule {
            kind: FaultKind::Error,
            message: message.into(),
            ..Self::default()
        }
    }
    pub fn timeout(after: Duration) -> Self {
        FaultRule {
            kind: FaultKind::Timeout,
            latency_ms: after.as_millis() as u64,
            ..Self::default()
        }
    }
    pub fn delay(by: Duration) -> Self {
        FaultRule {
            kind: FaultKind::Delay,
            latency_ms: by.as_millis() as u64,
            ..Self::default()
        }
    }
    pub fn lost() -> Self {
        FaultRule {
            kind: FaultKind::Lost,
            ..Self::default()
        }
    }
    /// Hits only the next `n` calls.
    #[must_use]
    pub fn times(mut self, n: u64) -> Self {
        self.count = Some(n);
        self
    }
    /// Hits each call with probability `p` (0 to 1).
    #[must_use]
    pub fn with_probability(mut self, p: f64) -> Self {
        self.probability = p;
        self
    }

    /// Whether the rule is one a `FaultHandle` accepts: a probability from
    /// 0 to 1, a count (if any) of at least 1 and a latency of at most a minute.
    pub fn validate(&self) -> Result<(), ParseFaultError> {
        if !(0.0..=1.0).contains(&self.probability) {
            return Err(ParseFaultError(format!(
                "probability {} is outside 0 to 1",
                self.probability
            )));
        }
        if self.count == Some(0) {
            return Err(ParseFaultError(
                "count 0 would hit no call; give a count of at least 1, or none for every call"
                    .into(),
            ));
        }
        if self.latency_ms > MAX_LATENCY_MS {
            return Err(ParseFaultError(format!(
                "latency {} ms is over the limit of {MAX_LATENCY_MS} ms",
                self.latency_ms
            )));
        }
        Ok(())
    }
}

/// Faults longer than a minute are never what an operator meant.
pub const MAX_LATENCY_MS: u64 = 60_000;

/// The text form, which [`FaultRule::from_str`] reads back. A rule that is
/// off is `off`, whatever its probability and count: it hits no call.
impl fmt::Display for FaultRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kind == FaultKind::Off {
            return f.write_str("off");
        }
        if self.probability < 1.0 {
            // Six decimals, trailing zeros dropped: 0.57 shows as "57%",
            // not as its binary neighbour "56.99999999999999%".
            let percent = format!("{:.6}", self.probability * 100.0);
            let percent = percent.trim_end_matches('0').trim_end_matches('.');
            write!(f, "{percent}%")?;
        }
        if let Some(n) = self.count {
            write!(f, "{n}*")?;
        }
        match self.kind {
            FaultKind::Off | FaultKind::Lost => f.write_str(self.kind.as_str()),
            FaultKind::Error => write!(f, "error({})", self.message),
            FaultKind::Timeout | FaultKind::Delay => {
                write!(f, "{}({})", self.kind.as_str(), self.latency_ms)
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad fault rule: {0}")]
pub struct ParseFaultError(pub String);

impl FromStr for FaultRule {
    type Err = ParseFaultError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why: String| {
            ParseFaultError(format!(
                "{text:?}: {why}; expected [P%][N*]error(msg)|timeout(ms)|delay(ms)|lost|off"
            ))
        };
        let mut rule = FaultRule::default();
        let mut rest = text.trim();
        if let Some((p, tail)) = rest.split_once('%') {
            let p: f64 = p
                .trim()
                .parse()
                .map_err(|_| bad(format!("{p:?} is not a percentage")))?;
            rule.probability = p / 100.0;
            rest = tail;
        }
        if let Some((n, tail)) = rest
            .split_once('*')
            .filter(|(n, _)| n.chars().all(|c| c.is_ascii_digit()))
        {
            rule.count = Some(
                n.parse()
                    .map_err(|_| bad(format!("{n:?} is not a count")))?,
            );
            rest = tail;
        }
        let (kind, arg) = match rest.split_once('(') {
            Some((kind, arg)) => {
                let arg = arg
                    .strip_suffix(')')
                    .ok_or_else(|| bad("missing ')'".into()))?;
                (kind, Some(arg))
            }
            None => (rest, None),
        };
        let ms = |arg: Option<&str>| -> Result<u64, ParseFaultError> {
            let arg = arg.ok_or_else(|| bad(format!("{kind} needs a duration in ms")))?;
            arg.trim_end_matches("ms")
                .trim()
                .parse()
                .map_err(|_| bad(format!("{arg:?} is not a duration in ms")))
        };
        match kind {
            "off" => {}
            "error" => {
                rule.kind = FaultKind::Error;
                arg.unwrap_or("injected fault")
                    .clone_into(&mut rule.message);
            }
            "timeout" => {
                rule.kind = FaultKind::Timeout;
                rule.latency_ms = ms(arg)?;
            }
            "delay" => {
                rule.kind = FaultKind::Delay;
                rule.latency_ms = ms(arg)?;
            }
            "lost" => rule.kind = FaultKind::Lost,
            other => return Err(bad(format!("unknown fault {other:?}"))),
        }
        rule.validate()?;
        if rule.kind == FaultKind::Off {
            // An off rule does nothing whatever its probability or count: it
            // has one form, the one it is shown as (`1*off` is `off`).
            return Ok(FaultRule::default());
        }
        Ok(rule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar_round_trips() {
        for text in [
            "error(connection refused)",
            "timeout(200)",
            "delay(5)",
            "lost",
            "50%lost",
            "57%lost",
            "12.5%timeout(10)",
            "0.01%lost",
            "3*error(x)",
            "10%2*delay(1)",
        ] {
            let rule: FaultRule = text.parse().unwrap();
            assert_eq!(rule.to_string(), text);
        }
        assert_eq!("delay(5ms)".parse::<FaultRule>().unwrap().latency_ms, 5);
        let off = FaultRule::default().with_probability(0.5).times(3);
        assert_eq!(
            off.to_string(),
            "off",
            "an off rule hits nothing, whatever its odds"
        );
    }

    #[test]
    fn bad_rules_name_the_problem() {
        let err = "explode".parse::<FaultRule>().unwrap_err().to_string();
        assert!(err.contains("unknown fault \"explode\""), "{err}");
        let err = "150%lost".parse::<FaultRule>().unwrap_err().to_string();
        assert!(err.contains("outside 0 to 1"), "{err}");
        let err = "delay(99999999)"
            .parse::<FaultRule>()
            .unwrap_err()
            .to_string();
        assert!(err.contains("limit of 60000 ms"), "{err}");
        assert!("timeout".parse::<FaultRule>().is_err());
        let err = "0*lost".parse::<FaultRule>().unwrap_err().to_string();
        assert!(err.contains("count 0 would hit no call"), "{err}");
    }
}
