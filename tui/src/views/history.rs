//! A key's history: what the gateway saw happen to one key — its decisions
//! (a new key, replays, conflicts, takeovers, refusals with their full
//! reasons), its lease renewals, the store's errors on it, operators'
//! actions, and the fault changes made meanwhile — newest last. Opened with
//! `h` on the selected row of the keys view; polled while it is open.

use crate::api::{AdminAction, Event, FaultKind, KeyHistory, Verdict};
use crate::format::{clock, micros, thousands, wrap};
use crate::theme::{ALERT, BOLD, DIM, LABEL, block, fault_style, outcome_style};
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget};

/// The open history of one key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HistoryPane {
    /// The store key.
    pub key: String,
    /// The latest answer; `None` until the first arrives.
    pub history: Option<KeyHistory>,
    /// Lines scrolled up from the newest.
    pub back: usize,
}

/// Where an event's text starts: after the time and the label.
const TEXT_AT: usize = 25;

/// An event as the history shows it: a label, its style, what it says, and
/// the full text (a reason, an error) on the lines under it.
pub fn describe(event: &Event) -> (&'static str, Style, String, Option<String>) {
    match event {
        Event::Decision(d) => {
            let status = d.status.map_or("—".to_owned(), |s| s.to_string());
            let took = micros(d.latency_us);
            let (label, what) = match d.outcome {
                Verdict::Executed => match d.fence {
                    Some(1) => (
                        "NEW KEY",
                        format!("{status} · ran upstream, fence 1 · {took}"),
                    ),
                    Some(f) => (
                        "TAKEOVER",
                        format!(
                            "{status} · ran upstream, fence {f}: an earlier claim lapsed, was released or expired · {took}"
                        ),
                    ),
                    None => ("EXECUTED", format!("{status} · {took}")),
                },
                Verdict::Replayed => ("REPLAY", format!("{status} · the stored response · {took}")),
                Verdict::InFlight => (
                    "IN FLIGHT",
                    format!("{status} · the first request was still running"),
                ),
                Verdict::Conflict => (
                    "CONFLICT",
                    format!("{status} · another payload under this key"),
                ),
                Verdict::Unavailable => (
                    "UNAVAILABLE",
                    format!("{status} · failed closed, nothing ran"),
                ),
                Verdict::Invalid => ("INVALID", format!("{status} · refused")),
            };
            (label, outcome_style(d.outcome), what, d.detail.clone())
        }
        Event::Admin(a) => {
            let label = match a.action {
                AdminAction::Release => "RELEASE",
                AdminAction::Expire => "EXPIRE",
                AdminAction::Delete => "DELETE",
            };
            (
                label,
                Style::new()
                    .fg(Color::LightBlue)
                    .add_modifier(ratatui::style::Modifier::BOLD),
                format!("by an operator at {} · fence {}", a.by, a.fence),
                None,
            )
        }
        Event::Fault(f) => {
            let by =
                f.by.as_deref()
                    .map_or(String::new(), |by| format!(" · by {by}"));
            let label = if f.rule.kind == FaultKind::Off {
                "FAULT OFF"
            } else {
                "FAULT"
            };
            (
                label,
                fault_style(f.rule.kind),
                format!("{}: {}{by}", f.op, f.rule),
                None,
            )
        }
        Event::Renewal(_) => (
            "RENEWAL",
            Style::new().fg(Color::Yellow),
            "the lease was renewed while the request ran".into(),
            None,
        ),
        Event::StoreError(e) => (
            "STORE ERROR",
            ALERT,
            format!("{} failed", e.op),
            Some(e.error.clone()),
        ),
    }
}

impl HistoryPane {
    pub fn new(key: String) -> HistoryPane {
        HistoryPane {
            key,
            history: None,
            back: 0,
        }
    }

    /// The pane's lines at `width`: one per event, its full text wrapped under it.
    pub fn lines(&self, width: usize) -> Vec<Line<'static>> {
        let Some(history) = &self.history else {
            return vec![Line::from(Span::styled("loading the key's history…", DIM))];
        };
        if history.events.is_empty() {
            return vec![
                Line::from(Span::styled(
                    "this gateway saw nothing happen to this key",
                    DIM,
                )),
                Line::from(Span::styled(
                    format!(
                        "(it keeps its newest {} events of all keys{}; another gateway may have served it)",
                        thousands(history.kept),
                        history
                            .since_ms
                            .map_or(String::new(), |ms| format!(", since {}", clock(ms)))
                    ),
                    DIM,
                )),
            ];
        }
        let mut lines = Vec::new();
        let room = width.saturating_sub(TEXT_AT).max(20);
        for event in &history.events {
            let (label, style, what, more) = describe(event);
            let mut first = wrap(&what, room).into_iter();
            lines.push(Line::from(vec![
                Span::styled(clock(event.ts_ms()), DIM),
                Span::raw(" "),
                Span::styled(format!("{label:<12}"), style),
                Span::raw(first.next().unwrap_or_default()),
            ]));
            for rest in first {
                lines.push(Line::from(format!("{:TEXT_AT$}{rest}", "")));
            }
            for part in more.iter().flat_map(|m| wrap(m, room)) {
                lines.push(Line::from(vec![
                    Span::raw(" ".repeat(TEXT_AT)),
                    Span::styled(part, Style::new().fg(Color::Gray)),
                ]));
            }
        }
        lines
    }

    pub fn scroll(&mut self, up: isize) {
        self.back = self.back.saturating_add_signed(up);
    }
}

impl Widget for &HistoryPane {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let count = self
            .history
            .as_ref()
            .map_or(String::new(), |h| format!("· {} events ", h.events.len()));
        let outer = block(Line::from(vec![
            Span::styled(" History ", BOLD),
            Span::styled(self.key.clone(), LABEL),
            Span::styled(format!(" {count}· newest last "), DIM),
        ]))
        .title_bottom(Line::from(Span::styled(" ↑↓ scroll · h/Esc close ", DIM)).right_aligned());
        let inner = outer.inner(area);
        outer.render(area, buf);
        let lines = self.lines(usize::from(inner.width));
        let rows = usize::from(inner.height);
        // Newest last, at the bottom; scrolled up by `back`.
        let end = lines
            .len()
            .saturating_sub(self.back.min(lines.len().saturating_sub(rows)));
        let start = end.saturating_sub(rows);
        Paragraph::new(lines[start..end].to_vec()).render(inner, buf);
    }
}
