//! Text for the screen: durations, clocks, counts, and cutting text to fit.

// Durations and bar lengths are shown to a tenth at best: a float there
// loses nothing anyone could see.
#![allow(clippy::cast_precision_loss, clippy::cast_sign_loss)]

/// `850ms`, `12.3s`, `4m05s`, `1h02m`, `3d04h`.
pub fn duration(ms: u64) -> String {
    let s = ms / 1000;
    match ms {
        0..1000 => format!("{ms}ms"),
        1000..60_000 => format!("{}.{}s", s, (ms % 1000) / 100),
        60_000..3_600_000 => format!("{}m{:02}s", s / 60, s % 60),
        3_600_000..86_400_000 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// `420µs`, `1.2ms`, `1.50s`.
pub fn micros(us: u64) -> String {
    match us {
        0..1000 => format!("{us}µs"),
        1000..1_000_000 => format!("{:.1}ms", us as f64 / 1000.0),
        _ => format!("{:.2}s", us as f64 / 1e6),
    }
}

/// `HH:MM:SS.mmm` (UTC) of a time in ms since the epoch.
pub fn clock(ms: u64) -> String {
    let s = ms / 1000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        (s / 3600) % 24,
        (s / 60) % 60,
        s % 60,
        ms % 1000
    )
}

/// `YYYY-MM-DD HH:MM:SS.mmm` (UTC) of a time in ms since the epoch.
pub fn date_time(ms: u64) -> String {
    let (y, m, d) = civil_from_days((ms / 86_400_000).cast_signed());
    format!("{y:04}-{m:02}-{d:02} {}", clock(ms))
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A countdown bar of `cells` cells, in eighths.
pub fn bar(fraction: f64, cells: usize) -> String {
    const EIGHTHS: [char; 9] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉', '█'];
    let eighths = (fraction.clamp(0.0, 1.0) * (cells * 8) as f64).round() as usize;
    (0..cells)
        .map(|i| EIGHTHS[eighths.saturating_sub(i * 8).min(8)])
        .collect()
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `text` cut to `width` characters, the cut marked with `…` at the end.
pub fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_owned()
    } else {
        let mut t: String = text.chars().take(width.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// `text` cut to at most `width` characters at a word's end, the cut marked
/// with `…`: a reason cut short never ends mid-word. (A first word longer
/// than `width` is cut inside it.)
pub fn truncate_words(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let room = width.saturating_sub(1);
    let head: String = text.chars().take(room + 1).collect();
    let cut = match head.rfind(' ') {
        Some(at) if at > 0 => head[..at].trim_end().to_owned(),
        _ => head.chars().take(room).collect(),
    };
    format!("{cut}…")
}

/// `text` in lines of at most `width` characters, broken at spaces (a word
/// longer than a line is broken inside it). Nothing is dropped.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let mut word = word.to_owned();
        loop {
            let len = line.chars().count();
            let need = word.chars().count() + usize::from(len > 0);
            if len + need <= width {
                if len > 0 {
                    line.push(' ');
                }
                line.push_str(&word);
                break;
            }
            if len > 0 {
                lines.push(std::mem::take(&mut line));
                continue;
            }
            // A word longer than a whole line.
            let head: String = word.chars().take(width).collect();
            word = word.chars().skip(width).collect();
            lines.push(head);
            if word.is_empty() {
                break;
            }
        }
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

/// `text` cut to `width` characters in the middle, so that both ends stay:
/// keys that share a long start (`order-2026-12-03-…`) still differ where
/// they end.
pub fn truncate_middle(text: &str, width: usize) -> String {
    let len = text.chars().count();
    if len <= width {
        return text.to_owned();
    }
    if width < 5 {
        return truncate(text, width);
    }
    let tail = (width - 1) / 2;
    let head = width - 1 - tail;
    let mut t: String = text.chars().take(head).collect();
    t.push('…');
    t.extend(text.chars().skip(len - tail));
    t
}

/// `0.25` → `"25"`; whole percentages without decimals.
pub fn percent(p: f64) -> String {
    let pct = p * 100.0;
    if (pct - pct.round()).abs() < 1e-9 {
        format!("{pct:.0}")
    } else {
        format!("{pct:.1}")
    }
}

/// The first 8 digits of a fingerprint, after any `sha256:`-style prefix.
pub fn short_fingerprint(fingerprint: &str) -> String {
    let digits = fingerprint.rsplit(':').next().unwrap_or(fingerprint);
    digits.chars().take(8).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_gregorian() {
        assert_eq!(date_time(0), "1970-01-01 00:00:00.000");
        assert_eq!(date_time(1_764_669_600_123), "2025-12-02 10:00:00.123");
        assert_eq!(date_time(951_782_400_000), "2000-02-29 00:00:00.000");
    }

    #[test]
    fn words_are_cut_and_wrapped_whole() {
        let reason = "store unavailable: insert failed for key anon/order-1";
        assert_eq!(truncate_words(reason, 30), "store unavailable: insert…");
        assert_eq!(truncate_words("short", 30), "short");
        assert_eq!(truncate_words("abcdefghij", 5), "abcd…");
        let lines = wrap(reason, 20);
        assert_eq!(
            lines,
            [
                "store unavailable:",
                "insert failed for",
                "key anon/order-1"
            ]
        );
        assert_eq!(lines.join(" "), reason, "nothing dropped");
        assert_eq!(wrap("abcdefghij", 4), ["abcd", "efgh", "ij"]);
        assert_eq!(wrap("", 4), [""]);
    }

    #[test]
    fn middle_cuts_keep_both_ends() {
        assert_eq!(truncate_middle("order-00017", 20), "order-00017");
        assert_eq!(truncate_middle("order-2026-12-03-00017", 11), "order…00017");
        assert_eq!(truncate_middle("abcdef", 3), "ab…");
    }
}
