//! The activity view: outcomes per second, store latency, and the decision
//! log, which scrolls and pauses. The faults view shows the log's tail too.

// Rates are shown to a tenth: a float there loses nothing anyone could see.
#![allow(clippy::cast_precision_loss, clippy::cast_sign_loss)]

use crate::api::{Event, Outcome, Outcomes, Stats};
use crate::format::{clock, micros, truncate_middle};
use crate::keymap::{Binding, also, bind};
use crate::theme::{BOLD, DIM, LABEL, block, fault_style, outcome_style};
use crate::views::keys::split_key;
use crossterm::event::KeyCode;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Sparkline, Widget};
use std::collections::VecDeque;

/// Samples of the rates kept for the sparklines (one per stats poll).
pub const HISTORY: usize = 240;
/// Lines of the decision log kept.
pub const LOG_LINES: usize = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActivityAction {
    ClearLog,
    ScrollUp,
    ScrollDown,
    PageUp,
    PageDown,
    Oldest,
    Follow,
    Pause,
}

use ActivityAction as A;
use KeyCode as K;

/// The activity view's key table; the help overlay lists it as written.
#[rustfmt::skip] // a table: one binding a line
pub const BINDINGS: &[Binding<ActivityAction>] = &[
    bind(&[K::Up, K::Char('k')], A::ScrollUp, "↑↓jk PgUp/Dn", "scroll the log"),
    also(&[K::Down, K::Char('j')], A::ScrollDown),
    also(&[K::PageUp], A::PageUp),
    also(&[K::PageDown], A::PageDown),
    bind(&[K::Home, K::Char('g')], A::Oldest, "g / G", "oldest / newest (follow)"),
    also(&[K::End, K::Char('G')], A::Follow),
    bind(&[K::Char('p'), K::Char(' ')], A::Pause, "p Space", "pause / follow the log"),
    bind(&[K::Char('c')], A::ClearLog, "c", "clear the decision log"),
];

pub const HINTS: &str = "↑↓ scroll · p pause · G follow · c clear log · ? help · q quit ";

/// One line of the decision log: any event of the stream.
pub type LogLine = Event;

/// The decision log: the newest [`LOG_LINES`], and where the operator reads.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Log {
    pub lines: VecDeque<LogLine>,
    /// Lines between the bottom of the screen and the newest line; while it
    /// is above zero (or `paused`), new lines do not move what is on screen.
    pub back: usize,
    pub paused: bool,
    /// Lines that arrived while the operator was not following.
    pub unseen: usize,
}

impl Log {
    pub fn push(&mut self, line: LogLine) {
        if self.lines.len() == LOG_LINES {
            self.lines.pop_front();
        }
        self.lines.push_back(line);
        if self.back > 0 || self.paused {
            self.back = (self.back + 1).min(self.lines.len().saturating_sub(1));
            self.unseen += 1;
        }
    }

    fn following(&self) -> bool {
        self.back == 0 && !self.paused
    }

    fn scroll(&mut self, up: isize) {
        let max = self.lines.len().saturating_sub(1);
        self.back = self.back.saturating_add_signed(up).min(max);
        if self.back == 0 && !self.paused {
            self.unseen = 0;
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct ActivityView {
    pub stats: Option<Stats>,
    pub rates: VecDeque<Outcomes<f64>>,
    pub p99_us: VecDeque<u64>,
    pub log: Log,
}

fn push_bounded<T>(queue: &mut VecDeque<T>, item: T, cap: usize) {
    if queue.len() == cap {
        queue.pop_front();
    }
    queue.push_back(item);
}

/// How far one PgUp/PgDn moves the log.
const LOG_PAGE: isize = 10;

impl ActivityView {
    pub fn update(&mut self, action: ActivityAction) {
        let log = &mut self.log;
        match action {
            A::ClearLog => *log = Log::default(),
            A::ScrollUp => log.scroll(1),
            A::ScrollDown => log.scroll(-1),
            A::PageUp => log.scroll(LOG_PAGE),
            A::PageDown => log.scroll(-LOG_PAGE),
            A::Oldest => log.scroll(isize::MAX),
            A::Follow => {
                log.paused = false;
                log.scroll(isize::MIN);
            }
            A::Pause => {
                log.paused = !log.paused;
                if !log.paused {
                    log.scroll(isize::MIN);
                }
            }
        }
    }

    pub fn stats(&mut self, stats: Stats) {
        push_bounded(&mut self.rates, stats.rates_per_s, HISTORY);
        push_bounded(&mut self.p99_us, stats.store_latency_us.p99, HISTORY);
        self.stats = Some(stats);
    }
}

impl Widget for &ActivityView {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let [top, log_area] =
            Layout::vertical([Constraint::Length(9), Constraint::Min(0)]).areas(area);
        let [rates_area, latency_area] =
            Layout::horizontal([Constraint::Min(40), Constraint::Length(30)]).areas(top);
        self.render_rates(rates_area, buf);
        self.render_latency(latency_area, buf);
        self.log.render(log_area, buf);
    }
}

/// Picks one outcome's rate.
type Pick = fn(&Outcomes<f64>) -> f64;

impl ActivityView {
    fn render_rates(&self, area: Rect, buf: &mut Buffer) {
        let rates_block = block(Line::from(vec![
            Span::styled(" Outcomes per second ", BOLD),
            Span::styled(format!("· last {} samples ", self.rates.len()), DIM),
        ]));
        let inner = rates_block.inner(area);
        rates_block.render(area, buf);
        let series: [(Outcome, Pick); 5] = [
            (Outcome::Executed, |r| r.executed),
            (Outcome::Replayed, |r| r.replayed),
            (Outcome::InFlight, |r| r.in_flight),
            (Outcome::Conflict, |r| r.conflict),
            (Outcome::Unavailable, |r| r.unavailable),
        ];
        let lines = Layout::vertical([Constraint::Length(1); 7]).split(inner);
        for ((outcome, pick), line) in series.iter().zip(lines.iter()) {
            let [label_area, spark_area] =
                Layout::horizontal([Constraint::Length(22), Constraint::Min(0)]).areas(*line);
            let now = self.rates.back().map_or(0.0, pick);
            Line::from(vec![
                Span::styled(format!("{:<12}", outcome.as_str()), outcome_style(*outcome)),
                Span::raw(format!("{now:>8.1}/s")),
            ])
            .render(label_area, buf);
            // The newest samples that fit, right-aligned like a chart.
            let width = usize::from(spark_area.width);
            let data: Vec<u64> = self
                .rates
                .iter()
                .rev()
                .take(width)
                .rev()
                .map(|r| pick(r).ceil() as u64)
                .collect();
            Sparkline::default()
                .data(&data)
                .style(outcome_style(*outcome))
                .render(spark_area, buf);
        }
    }

    fn render_latency(&self, area: Rect, buf: &mut Buffer) {
        let latency = self
            .stats
            .as_ref()
            .map(|s| s.store_latency_us)
            .unwrap_or_default();
        let pool = self.stats.as_ref().map(|s| s.pool).unwrap_or_default();
        let width = usize::from(area.width.saturating_sub(2));
        let p99: Vec<u64> = self
            .p99_us
            .iter()
            .rev()
            .take(width)
            .rev()
            .copied()
            .collect();
        let text = vec![
            Line::from(vec![
                Span::styled("p50 ", LABEL),
                Span::raw(format!("{:>8}", micros(latency.p50))),
                Span::styled("  p90 ", LABEL),
                Span::raw(micros(latency.p90)),
            ]),
            Line::from(vec![
                Span::styled("p99 ", LABEL),
                Span::raw(format!("{:>8}", micros(latency.p99))),
                Span::styled("  max ", LABEL),
                Span::raw(micros(latency.max)),
            ]),
            Line::from(Span::styled("p99 over time", DIM)),
        ];
        let lat_block = block(Span::styled(" Store latency ", BOLD));
        let inner = lat_block.inner(area);
        lat_block.render(area, buf);
        let [text_area, spark_area, pool_area] = Layout::vertical([
            Constraint::Length(3),
            Constraint::Length(2),
            Constraint::Min(0),
        ])
        .areas(inner);
        Paragraph::new(text).render(text_area, buf);
        Sparkline::default()
            .data(&p99)
            .style(Style::new().fg(Color::Blue))
            .render(spark_area, buf);
        Line::from(vec![
            Span::styled("pool ", LABEL),
            Span::raw(format!("{} busy {} idle", pool.in_use, pool.idle)),
        ])
        .render(pool_area, buf);
    }
}

fn log_line(line: &LogLine) -> Line<'static> {
    match line {
        LogLine::Decision(d) => {
            // The client's own key, tagged with its scope's start.
            let (scope, key) = split_key(&d.key);
            let label = if scope.is_empty() {
                key.to_owned()
            } else {
                format!("{} {key}", scope.chars().take(4).collect::<String>())
            };
            Line::from(vec![
                Span::styled(clock(d.ts_ms), DIM),
                " ".into(),
                Span::styled(
                    format!("{:<11}", d.outcome.as_str().to_uppercase()),
                    outcome_style(d.outcome),
                ),
                Span::raw(format!(" {:<24}", truncate_middle(&label, 24))),
                Span::raw(d.status.map_or("   —".to_owned(), |s| format!(" {s:>3}"))),
                Span::styled(format!(" {:>8}", micros(d.latency_us)), DIM),
                Span::raw(
                    d.detail
                        .as_ref()
                        .map(|t| format!("  {t}"))
                        .unwrap_or_default(),
                ),
            ])
        }
        LogLine::Admin(_) | LogLine::Renewal(_) | LogLine::StoreError(_) => Line::from(""),
        LogLine::Fault(f) => Line::from(vec![
            Span::styled(clock(f.ts_ms), DIM),
            " ".into(),
            Span::styled(
                format!("{:<11}", "FAULT"),
                fault_style(f.rule.kind).add_modifier(Modifier::REVERSED),
            ),
            Span::raw(format!(" {} → {}", f.op, f.rule)),
        ]),
    }
}

impl Widget for &Log {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let mut title = vec![
            Span::styled(" Decisions ", BOLD),
            Span::styled("· newest last ", DIM),
        ];
        if !self.following() {
            let state = if self.paused { "paused" } else { "scrolled" };
            title.push(Span::styled(
                format!("· {state}, {} new · G follows ", self.unseen),
                Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD),
            ));
        }
        let outer = block(Line::from(title));
        let inner = outer.inner(area);
        outer.render(area, buf);
        let rows = usize::from(inner.height);
        let end = self.lines.len().saturating_sub(self.back);
        let start = end.saturating_sub(rows);
        let lines: Vec<Line> = self.lines.range(start..end).map(log_line).collect();
        if lines.is_empty() {
            Line::from(Span::styled("no decisions yet", DIM)).render(inner, buf);
        } else {
            Paragraph::new(lines).render(inner, buf);
        }
    }
}
