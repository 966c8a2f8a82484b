//! The activity view: outcomes per second, store latency, and the decision
//! log, which scrolls, pauses, shows one kind of line (`f`) and opens its
//! bottom line in full (`Enter`: the whole key, every field, the whole
//! reason). The faults view shows the log's tail too.

// Rates are shown to a tenth: a float there loses nothing anyone could see.
#![allow(clippy::cast_precision_loss, clippy::cast_sign_loss)]

use crate::api::{Event, Stats, Verdict, Verdicts};
use crate::format::{clock, date_time, micros, truncate_middle, truncate_words, wrap};
use crate::keymap::{Binding, also, bind};
use crate::theme::{ALERT, BOLD, DIM, LABEL, SELECTED, block, fault_style, outcome_style};
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
    /// The next kind of line to show only.
    NextFilter,
    /// Opens (or closes) the bottom line in full.
    Expand,
    Collapse,
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
    bind(&[K::Char('f')], A::NextFilter, "f", "show one kind of line"),
    bind(&[K::Enter], A::Expand, "Enter / Esc", "line in full / close"),
    also(&[K::Esc], A::Collapse),
    bind(&[K::Char('c')], A::ClearLog, "c", "clear the decision log"),
];

pub const HINTS: &str = "↑↓ scroll · f filter · Enter full line · p pause · G follow · ? help ";

/// Which lines the log shows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFilter {
    #[default]
    All,
    /// Decisions with this outcome.
    Verdict(Verdict),
    /// Operators' actions and fault changes.
    Operators,
    /// Store errors and lease renewals.
    Store,
}

impl LogFilter {
    /// In the order `f` goes through them.
    pub const ALL: [LogFilter; 9] = [
        LogFilter::All,
        LogFilter::Verdict(Verdict::Executed),
        LogFilter::Verdict(Verdict::Replayed),
        LogFilter::Verdict(Verdict::InFlight),
        LogFilter::Verdict(Verdict::Conflict),
        LogFilter::Verdict(Verdict::Unavailable),
        LogFilter::Verdict(Verdict::Invalid),
        LogFilter::Operators,
        LogFilter::Store,
    ];

    pub fn name(self) -> &'static str {
        match self {
            LogFilter::All => "all",
            LogFilter::Verdict(o) => o.as_str(),
            LogFilter::Operators => "operators and faults",
            LogFilter::Store => "store errors and renewals",
        }
    }

    pub fn shows(self, line: &LogLine) -> bool {
        match (self, line) {
            (LogFilter::All, _)
            | (LogFilter::Operators, LogLine::Admin(_) | LogLine::Fault(_))
            | (LogFilter::Store, LogLine::StoreError(_) | LogLine::Renewal(_)) => true,
            (LogFilter::Verdict(o), LogLine::Decision(d)) => d.outcome == o,
            _ => false,
        }
    }
}

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
    /// Which lines show; `back` counts only those.
    pub filter: LogFilter,
    /// Whether the bottom line on screen shows in full, under the log.
    pub expanded: bool,
}

impl Log {
    pub fn push(&mut self, line: LogLine) {
        if self.lines.len() == LOG_LINES {
            self.lines.pop_front();
        }
        let shown = self.filter.shows(&line);
        self.lines.push_back(line);
        if shown && (self.back > 0 || self.paused || self.expanded) {
            self.back = (self.back + 1).min(self.shown().len().saturating_sub(1));
            self.unseen += 1;
        }
    }

    /// The lines the filter shows, oldest first.
    pub fn shown(&self) -> Vec<&LogLine> {
        self.lines.iter().filter(|l| self.filter.shows(l)).collect()
    }

    /// The line at the bottom of the screen: the one `Enter` opens.
    pub fn selected(&self) -> Option<&LogLine> {
        let shown = self.shown();
        let at = shown.len().checked_sub(1 + self.back)?;
        shown.get(at).copied()
    }

    fn following(&self) -> bool {
        self.back == 0 && !self.paused && !self.expanded
    }

    fn scroll(&mut self, up: isize) {
        let max = self.shown().len().saturating_sub(1);
        self.back = self.back.saturating_add_signed(up).min(max);
        if self.back == 0 && !self.paused {
            self.unseen = 0;
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct ActivityView {
    pub stats: Option<Stats>,
    pub rates: VecDeque<Verdicts<f64>>,
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
            A::NextFilter => {
                let i = LogFilter::ALL
                    .iter()
                    .position(|f| *f == log.filter)
                    .unwrap_or(0);
                log.filter = LogFilter::ALL[(i + 1) % LogFilter::ALL.len()];
                log.back = 0;
                log.unseen = 0;
            }
            // While a line is open, the log holds still under it.
            A::Expand => log.expanded = !log.expanded && log.selected().is_some(),
            A::Collapse => log.expanded = false,
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
type Pick = fn(&Verdicts<f64>) -> f64;

impl ActivityView {
    fn render_rates(&self, area: Rect, buf: &mut Buffer) {
        let rates_block = block(Line::from(vec![
            Span::styled(" Outcomes per second ", BOLD),
            Span::styled(format!("· last {} samples ", self.rates.len()), DIM),
        ]));
        let inner = rates_block.inner(area);
        rates_block.render(area, buf);
        let series: [(Verdict, Pick); 5] = [
            (Verdict::Executed, |r| r.executed),
            (Verdict::Replayed, |r| r.replayed),
            (Verdict::InFlight, |r| r.in_flight),
            (Verdict::Conflict, |r| r.conflict),
            (Verdict::Unavailable, |r| r.unavailable),
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

/// A store key as the log shows it: the client's own key, tagged with its
/// scope's start.
fn short_key(store_key: &str) -> String {
    let (scope, key) = split_key(store_key);
    let label = if scope.is_empty() {
        key.to_owned()
    } else {
        format!("{} {key}", scope.chars().take(4).collect::<String>())
    };
    truncate_middle(&label, 24)
}

/// One line of the log, `width` cells wide: a reason that does not fit is
/// cut at a word's end, marked `…` (`Enter` shows it whole).
fn log_line(line: &LogLine, width: usize) -> Line<'static> {
    let time = Span::styled(clock(line.ts_ms()), DIM);
    let tag = |text: &str, style: Style| Span::styled(format!(" {text:<11}"), style);
    // What the time, the tag and a key take: 12 + 12 + 25.
    let rest = |used: usize, text: &str| -> Span<'static> {
        Span::raw(truncate_words(text, width.saturating_sub(used)))
    };
    match line {
        LogLine::Decision(d) => {
            let mut spans = vec![
                time,
                tag(&d.outcome.as_str().to_uppercase(), outcome_style(d.outcome)),
                Span::raw(format!(" {:<24}", short_key(&d.key))),
                Span::raw(d.status.map_or("   —".to_owned(), |s| format!(" {s:>3}"))),
                Span::styled(format!(" {:>8}", micros(d.latency_us)), DIM),
            ];
            if let Some(detail) = &d.detail {
                spans.push(rest(12 + 12 + 25 + 4 + 9 + 2, &format!("  {detail}")));
            }
            Line::from(spans)
        }
        LogLine::Admin(a) => Line::from(vec![
            time,
            tag(
                &a.action.as_str().to_uppercase(),
                Style::new()
                    .fg(Color::LightBlue)
                    .add_modifier(Modifier::BOLD),
            ),
            Span::raw(format!(" {:<24}", short_key(&a.key))),
            rest(12 + 12 + 25, &format!(" by {} (operator)", a.by)),
        ]),
        LogLine::Renewal(r) => Line::from(vec![
            time,
            tag("RENEWAL", Style::new().fg(Color::Yellow)),
            Span::raw(format!(" {:<24}", short_key(&r.key))),
            Span::styled(" lease renewed", DIM),
        ]),
        LogLine::StoreError(e) => Line::from(vec![
            time,
            tag("STORE ERROR", ALERT),
            Span::raw(format!(" {:<24}", short_key(&e.key))),
            rest(12 + 12 + 25, &format!(" {}: {}", e.op, e.error)),
        ]),
        LogLine::Fault(f) => Line::from(vec![
            time,
            tag(
                "FAULT",
                fault_style(f.rule.kind).add_modifier(Modifier::REVERSED),
            ),
            rest(
                12 + 12,
                &format!(
                    " {} → {}{}",
                    f.op,
                    f.rule,
                    f.by.as_deref()
                        .map_or(String::new(), |by| format!(" (by {by})"))
                ),
            ),
        ]),
    }
}

/// A line in full: every field, the whole key and the whole text, wrapped
/// to `width`.
fn full_lines(line: &LogLine, width: usize) -> Vec<Line<'static>> {
    let field = |name: &str, value: String| -> Vec<Line<'static>> {
        wrap(&value, width.saturating_sub(10))
            .into_iter()
            .enumerate()
            .map(|(i, part)| {
                let label = if i == 0 { name } else { "" };
                Line::from(vec![
                    Span::styled(format!("{label:<10}"), LABEL),
                    Span::raw(part),
                ])
            })
            .collect()
    };
    let mut lines = field("at", format!("{} UTC", date_time(line.ts_ms())));
    match line {
        LogLine::Decision(d) => {
            let status = d.status.map_or("—".to_owned(), |s| s.to_string());
            let fence = d.fence.map_or(String::new(), |f| format!(" · fence {f}"));
            lines.extend(field(
                "decision",
                format!(
                    "{} · status {status} · {}{fence}",
                    d.outcome.as_str(),
                    micros(d.latency_us)
                ),
            ));
            lines.extend(field("key", d.key.clone()));
            if let Some(detail) = &d.detail {
                lines.extend(field("reason", detail.clone()));
            }
        }
        LogLine::Admin(a) => {
            lines.extend(field(
                "action",
                format!("{} (an operator)", a.action.as_str()),
            ));
            lines.extend(field("key", a.key.clone()));
            lines.extend(field("by", a.by.clone()));
            lines.extend(field(
                "before",
                format!("fence {}, version {}", a.fence, a.version),
            ));
        }
        LogLine::Renewal(r) => {
            lines.extend(field(
                "renewal",
                "the lease of a claim this gateway runs".into(),
            ));
            lines.extend(field("key", r.key.clone()));
        }
        LogLine::StoreError(e) => {
            lines.extend(field("store", format!("{} failed", e.op)));
            lines.extend(field("key", e.key.clone()));
            lines.extend(field("error", e.error.clone()));
        }
        LogLine::Fault(f) => {
            lines.extend(field("fault", format!("{} → {}", f.op, f.rule)));
            lines.extend(field(
                "by",
                f.by.clone().unwrap_or_else(|| "in process".to_owned()),
            ));
        }
    }
    lines
}

impl Widget for &Log {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let mut title = vec![
            Span::styled(" Decisions ", BOLD),
            Span::styled("· newest last ", DIM),
        ];
        if self.filter != LogFilter::All {
            title.push(Span::styled(
                format!("· only {} (f) ", self.filter.name()),
                Style::new().fg(Color::Cyan).add_modifier(Modifier::BOLD),
            ));
        }
        if !self.following() {
            let state = if self.expanded {
                "held open"
            } else if self.paused {
                "paused"
            } else {
                "scrolled"
            };
            title.push(Span::styled(
                format!("· {state}, {} new · G follows ", self.unseen),
                Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD),
            ));
        }
        let outer = block(Line::from(title));
        let inner = outer.inner(area);
        outer.render(area, buf);
        let width = usize::from(inner.width);
        // The open line takes the bottom of the log, leaving two lines above.
        let log_area = match self.selected().filter(|_| self.expanded) {
            Some(line) => {
                let full = full_lines(line, width);
                let height = (full.len() as u16 + 1).min(inner.height.saturating_sub(2));
                let [log_area, full_area] =
                    Layout::vertical([Constraint::Min(0), Constraint::Length(height)]).areas(inner);
                let mut text = vec![Line::from(Span::styled("─".repeat(width), DIM))];
                text.extend(full);
                Paragraph::new(text).render(full_area, buf);
                log_area
            }
            None => inner,
        };
        let shown = self.shown();
        let rows = usize::from(log_area.height);
        let back = self.back.min(shown.len().saturating_sub(1));
        let end = shown.len().saturating_sub(back);
        let start = end.saturating_sub(rows);
        let mut lines: Vec<Line> = shown[start..end]
            .iter()
            .map(|line| log_line(line, width))
            .collect();
        // The line Enter opens is marked while the log is not following.
        if !self.following()
            && let Some(last) = lines.last_mut()
        {
            *last = std::mem::take(last).patch_style(SELECTED);
        }
        if lines.is_empty() {
            let why = if self.lines.is_empty() {
                "no decisions yet".to_owned()
            } else {
                format!("no {} lines yet (f shows another kind)", self.filter.name())
            };
            Line::from(Span::styled(why, DIM)).render(log_area, buf);
        } else {
            Paragraph::new(lines).render(log_area, buf);
        }
    }
}
