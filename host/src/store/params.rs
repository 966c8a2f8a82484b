//! The settings a network store reads from its URL's query string
//! (`?prefix=idem:&timeout_ms=2000`), split from the ones its driver reads.

use super::OpenError;
use std::time::Duration;

/// A store URL with idem's own query parameters taken out.
pub(crate) struct StoreUrl {
    /// The URL as given, with any password replaced by `***`, for errors.
    pub shown: String,
    /// The URL the driver gets: the original less idem's parameters.
    pub driver: String,
    /// idem's parameters, in order.
    pub params: Vec<(String, String)>,
}

impl StoreUrl {
    /// Splits `url`, taking out the parameters named in `ours`. Parameters
    /// named twice are refused: which one wins would be a guess.
    pub fn parse(url: &str, ours: &[&str]) -> Result<Self, OpenError> {
        let shown = redact(url);
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut params: Vec<(String, String)> = Vec::new();
        let mut rest = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if ours.contains(&name) {
                if params.iter().any(|(n, _)| n == name) {
                    return Err(OpenError::BadUrl {
                        url: shown,
                        reason: format!("the parameter {name:?} is given twice"),
                    });
                }
                let value = percent_decode(value).ok_or_else(|| OpenError::BadUrl {
                    url: shown.clone(),
                    reason: format!("the value of {name:?} is not valid percent-encoded UTF-8"),
                })?;
                params.push((name.to_owned(), value));
            } else {
                rest.push(pair);
            }
        }
        let driver = if rest.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", rest.join("&"))
        };
        Ok(StoreUrl {
            shown,
            driver,
            params,
        })
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// A whole number parameter within `min..=max`, or `default` when absent.
    pub fn number(&self, name: &str, default: u64, min: u64, max: u64) -> Result<u64, OpenError> {
        let Some(text) = self.get(name) else {
            return Ok(default);
        };
        match text.parse::<u64>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(OpenError::BadUrl {
                url: self.shown.clone(),
                reason: format!("{name}={text:?} must be a whole number from {min} to {max}"),
            }),
        }
    }

    /// `timeout_ms`: how long one store operation may take before it fails
    /// as unavailable (default 2 s).
    /// `clock_sync_ms`: how often a shared store reads its server's clock
    /// (`wit/clock.wit`), 100 ms to an hour, every second by default.
    pub fn clock_sync(&self) -> Result<Duration, OpenError> {
        Ok(Duration::from_millis(self.number(
            "clock_sync_ms",
            crate::clock::SYNC_EVERY.as_millis() as u64,
            100,
            3_600_000,
        )?))
    }

    pub fn timeout(&self) -> Result<Duration, OpenError> {
        Ok(Duration::from_millis(self.number(
            "timeout_ms",
            2_000,
            1,
            600_000,
        )?))
    }
}

/// `user:secret@` becomes `user:***@`, so URLs can go into errors and logs.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_ours_from_the_drivers() {
        let u = StoreUrl::parse(
            "redis://:pw@h:1/0?protocol=resp3&prefix=a%3Ab:&timeout_ms=5",
            &["prefix", "timeout_ms"],
        )
        .unwrap();
        assert_eq!(u.driver, "redis://:pw@h:1/0?protocol=resp3");
        assert_eq!(u.get("prefix"), Some("a:b:"));
        assert_eq!(u.timeout().unwrap(), Duration::from_millis(5));
        assert_eq!(
            u.shown,
            "redis://:***@h:1/0?protocol=resp3&prefix=a%3Ab:&timeout_ms=5"
        );
    }

    #[test]
    fn refuses_bad_numbers_and_repeats() {
        let u = StoreUrl::parse("postgres://h/db?pool=0", &["pool"]).unwrap();
        let err = u.number("pool", 16, 1, 1024).unwrap_err().to_string();
        assert!(
            err.contains("pool=\"0\" must be a whole number from 1 to 1024"),
            "{err}"
        );
        assert!(StoreUrl::parse("postgres://h/db?pool=1&pool=2", &["pool"]).is_err());
    }
}
