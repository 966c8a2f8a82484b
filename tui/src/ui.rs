//! The frame around the views: `impl Widget for &App` draws the header,
//! the summary line, the view on screen, the footer and the dialogs. It
//! reads the state and draws it; it never awaits, locks or fails.

use crate::action::help;
use crate::api::{ConnectionState, Verdict};
use crate::app::{App, Connection};
use crate::format::{duration, micros, truncate};
use crate::theme::{ALERT, BOLD, DIM, LABEL, block, centered, outcome_style};
use crate::views::activity::HINTS as ACTIVITY_HINTS;
use crate::views::faults::{self, HINTS as FAULTS_HINTS};
use crate::views::keys::HINTS as KEYS_HINTS;
use crate::views::{Severity, View};
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Clear, Paragraph, Widget, Wrap};

/// The smallest screen the layout is made for.
pub const MIN_SIZE: (u16, u16) = (80, 24);

impl Widget for &App {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.width < MIN_SIZE.0 || area.height < MIN_SIZE.1 {
            let text = format!(
                "idem-tui needs at least {}×{}; this terminal is {}×{}",
                MIN_SIZE.0, MIN_SIZE.1, area.width, area.height
            );
            Paragraph::new(text)
                .wrap(Wrap { trim: true })
                .render(area, buf);
            return;
        }
        let [header, summary, body, footer] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Min(0),
            Constraint::Length(1),
        ])
        .areas(area);
        self.render_header(header, buf);
        self.render_summary(summary, buf);
        match self.view {
            View::Keys => self.keys.render(body, buf),
            View::Faults => {
                let [table, log] =
                    Layout::vertical([Constraint::Length(faults::HEIGHT), Constraint::Min(0)])
                        .areas(body);
                self.faults.render(table, buf);
                self.activity.log.render(log, buf);
            }
            View::Activity => self.activity.render(body, buf),
        }
        self.render_footer(footer, buf);
        if let Some(confirm) = &self.confirm {
            let question = format!("{} {}?", confirm.verb.question(), confirm.key);
            let warning = confirm.verb.warning();
            let longest = question.chars().count().max(warning.chars().count());
            let width = (longest as u16 + 6).clamp(40, area.width);
            let dialog = centered(area, width, 6);
            Clear.render(dialog, buf);
            Paragraph::new(vec![
                Line::from(question).bold(),
                Line::from(Span::styled(warning, Style::new().fg(Color::Yellow))),
                Line::from(vec![
                    "y".bold().green(),
                    " / Enter: yes    ".into(),
                    "n".bold().red(),
                    " / Esc: no".into(),
                ]),
            ])
            .centered()
            .wrap(Wrap { trim: true })
            .block(block(" Confirm ").border_style(Style::new().fg(Color::Yellow)))
            .render(dialog, buf);
        }
        if self.help {
            render_help(area, buf);
        }
    }
}

fn short(outcome: Verdict) -> &'static str {
    match outcome {
        Verdict::Executed => "exec",
        Verdict::Replayed => "replay",
        Verdict::InFlight => "inflight",
        Verdict::Conflict => "conflict",
        Verdict::Unavailable => "unavail",
        Verdict::Invalid => "invalid",
    }
}

impl App {
    fn render_header(&self, area: Rect, buf: &mut Buffer) {
        let mut spans = vec![" idem ".bold().black().on_cyan(), " ".into()];
        for (i, view) in View::ALL.iter().enumerate() {
            let text = format!(" {} {} ", i + 1, view.title());
            spans.push(if *view == self.view {
                text.bold().reversed()
            } else {
                text.into()
            });
        }
        Line::from(spans).render(area, buf);
        let (mark, style) = match self.connection {
            Connection::Connected => ("● connected", Style::new().fg(Color::Green)),
            Connection::Connecting => ("○ connecting", Style::new().fg(Color::Yellow)),
            Connection::Lost { .. } => ("✗ disconnected", ALERT),
            Connection::Unauthorized { .. } => ("✗ unauthorized", ALERT),
        };
        let url = truncate(&self.admin_url, 40);
        Line::from(vec![
            Span::styled(url, DIM),
            " ".into(),
            Span::styled(mark, style),
            " ".into(),
        ])
        .right_aligned()
        .render(area, buf);
    }

    fn render_summary(&self, area: Rect, buf: &mut Buffer) {
        let alarm = |text: String, buf: &mut Buffer| {
            Line::from(truncate(&text, area.width.into()))
                .style(Style::new().fg(Color::White).bg(Color::Red).bold())
                .render(area, buf);
        };
        match &self.connection {
            Connection::Lost {
                error,
                since_ms,
                attempts,
            } => {
                let ago = duration(self.local_ms.saturating_sub(*since_ms));
                return alarm(
                    format!(
                        " connection lost {ago} ago: {error} — reconnecting (attempt {attempts}); showing the last data seen"
                    ),
                    buf,
                );
            }
            Connection::Unauthorized { status, .. } => {
                return alarm(format!(" {status}: {}", self.token_fix()), buf);
            }
            Connection::Connecting | Connection::Connected => {}
        }
        if let Some(banner) = &self.banner {
            Line::from(truncate(&format!(" {banner}"), area.width.into()))
                .style(Style::new().fg(Color::Black).bg(Color::Yellow).bold())
                .render(area, buf);
            return;
        }
        let Some(stats) = &self.activity.stats else {
            Line::from(" waiting for the first answer from the admin API…")
                .style(DIM)
                .render(area, buf);
            return;
        };
        // A gateway without its store answers every guarded request 503:
        // that is what the line says until the store is open.
        let link = &stats.store_connection;
        if link.state == ConnectionState::Connecting {
            let waited = duration(self.local_ms.saturating_sub(link.since_ms));
            let why = link
                .last_error
                .as_deref()
                .unwrap_or("the first attempt is under way");
            return alarm(
                format!(
                    " store {} not connected ({waited}, {} attempts): guarded requests get 503 — {why}",
                    stats.store, link.attempts
                ),
                buf,
            );
        }
        let r = &stats.rates_per_s;
        let mut spans = vec![Span::raw(" ")];
        // Faults first: on a narrow screen they are what must not be cut.
        let active = self.faults.active();
        if !active.is_empty() {
            spans.push(Span::styled(
                format!("faults: {}  ", active.join(", ")),
                Style::new().fg(Color::Red).bold(),
            ));
        }
        for (outcome, rate) in [
            (Verdict::Executed, r.executed),
            (Verdict::Replayed, r.replayed),
            (Verdict::InFlight, r.in_flight),
            (Verdict::Conflict, r.conflict),
            (Verdict::Unavailable, r.unavailable),
        ] {
            spans.push(Span::styled(
                format!("{} {rate:.1}/s ", short(outcome)),
                outcome_style(outcome),
            ));
        }
        let p99 = Span::styled(
            format!(" p99 {}  ", micros(stats.store_latency_us.p99)),
            DIM,
        );
        let store = Span::styled(
            format!("store {} · up {}", stats.store, duration(stats.uptime_ms)),
            LABEL,
        );
        // Rates and faults matter most; latency and the store name go first
        // when the screen is narrow.
        let width = |spans: &[Span]| spans.iter().map(Span::width).sum::<usize>();
        for extra in [p99, store] {
            if width(&spans) + extra.width() <= usize::from(area.width) {
                spans.push(extra);
            }
        }
        Line::from(spans).render(area, buf);
    }

    fn render_footer(&self, area: Rect, buf: &mut Buffer) {
        if let Some(input) = &self.input {
            let mut spans = vec![
                Span::styled(format!(" {}: ", input.field.prompt()), LABEL),
                Span::raw(input.text.clone()),
                "█".slow_blink(),
            ];
            if input.text.is_empty() && !input.was.is_empty() {
                spans.push(Span::styled(format!("  (now {})", input.was), DIM));
            }
            spans.push(Span::styled("  Enter apply · Esc cancel", DIM));
            Line::from(spans).render(area, buf);
            return;
        }
        let hints = match self.view {
            View::Keys => KEYS_HINTS,
            View::Faults => FAULTS_HINTS,
            View::Activity => ACTIVITY_HINTS,
        };
        let status_width = match &self.status {
            Some((text, severity)) => {
                let style = match severity {
                    Severity::Info => Style::new().fg(Color::Green),
                    Severity::Error => Style::new().fg(Color::Red).bold(),
                };
                let room = usize::from(area.width).saturating_sub(18);
                let text = truncate(&format!(" {text}"), room);
                let width = text.chars().count() as u16;
                Line::from(Span::styled(text, style)).render(area, buf);
                width
            }
            None => 0,
        };
        let room = usize::from(area.width.saturating_sub(status_width + 1));
        if room > 10 {
            let hints = if hints.chars().count() > room {
                "? help · q quit "
            } else {
                hints
            };
            Line::from(Span::styled(hints, DIM))
                .right_aligned()
                .render(area, buf);
        }
    }
}

fn render_help(area: Rect, buf: &mut Buffer) {
    let dialog = centered(area, 78, 22);
    Clear.render(dialog, buf);
    let outer = block(Span::styled(" Help · ? or Esc closes ", BOLD)).border_style(LABEL);
    let inner = outer.inner(dialog);
    outer.render(dialog, buf);
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(inner);
    let sections = help();
    let column = |parts: &[crate::keymap::Section]| {
        let mut lines = Vec::new();
        for section in parts {
            lines.push(Line::from(Span::styled(
                section.title,
                Style::new().bold().underlined(),
            )));
            for (keys, what) in &section.lines {
                lines.push(Line::from(vec![
                    Span::styled(format!(" {keys:<13}"), LABEL),
                    Span::raw(*what),
                ]));
            }
        }
        Paragraph::new(lines)
    };
    column(&sections[..2]).render(left, buf);
    column(&sections[2..]).render(right, buf);
}
