//! Rendering: `impl Widget for &App`. It reads the state and draws it; it
//! never awaits, locks or fails, and draws only the rows that fit.

// Durations, rates and bar lengths are shown to a tenth at best: a float
// there loses nothing anyone could see.
#![allow(clippy::cast_precision_loss, clippy::cast_sign_loss)]

use crate::action::bindings;
use crate::api::{FaultKind, KeyInfo, KeyState, Outcome, Outcomes};
use crate::app::{
    App, Connection, LogLine, Order, Severity, Sort, View, describe_rule, format_percent,
};
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Block, BorderType, Cell, Clear, Paragraph, Row, Sparkline, Table, Widget, Wrap,
};

/// The smallest screen the layout is made for.
pub const MIN_SIZE: (u16, u16) = (80, 24);

const SELECTED: Style = Style::new()
    .bg(Color::DarkGray)
    .add_modifier(Modifier::BOLD);
const DIM: Style = Style::new().fg(Color::DarkGray);
const LABEL: Style = Style::new().fg(Color::Cyan);

/// A key's state as the operator reads it: the store's state, and whether
/// its lease or its retention has run out by now.
pub fn key_state(row: &KeyInfo, now_ms: u64) -> (&'static str, Style) {
    match row.state {
        KeyState::Processing if row.lease_until_ms > now_ms => {
            ("PROCESSING", Style::new().fg(Color::Yellow))
        }
        // The owner stopped renewing: the next request takes over.
        KeyState::Processing => (
            "LAPSED",
            Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        ),
        KeyState::Done if row.expires_at_ms > now_ms => ("DONE", Style::new().fg(Color::Green)),
        KeyState::Done => ("EXPIRED", DIM),
    }
}

pub fn outcome_style(outcome: Outcome) -> Style {
    match outcome {
        Outcome::Executed => Style::new().fg(Color::Green),
        Outcome::Replayed => Style::new().fg(Color::Cyan),
        Outcome::InFlight => Style::new().fg(Color::Yellow),
        Outcome::Conflict => Style::new().fg(Color::Magenta),
        Outcome::Unavailable => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        Outcome::Invalid => Style::new().fg(Color::LightRed),
    }
}

pub fn fault_style(kind: FaultKind) -> Style {
    match kind {
        FaultKind::Off => DIM,
        FaultKind::Error => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        FaultKind::Timeout => Style::new().fg(Color::Magenta).add_modifier(Modifier::BOLD),
        FaultKind::Delay => Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD),
        FaultKind::Lost => Style::new()
            .fg(Color::LightRed)
            .add_modifier(Modifier::BOLD),
    }
}

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

/// A countdown bar of `cells` cells, in eighths.
pub fn bar(fraction: f64, cells: usize) -> String {
    const EIGHTHS: [char; 9] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉', '█'];
    let eighths = (fraction.clamp(0.0, 1.0) * (cells * 8) as f64).round() as usize;
    (0..cells)
        .map(|i| EIGHTHS[eighths.saturating_sub(i * 8).min(8)])
        .collect()
}

fn thousands(n: u64) -> String {
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

fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_owned()
    } else {
        let mut t: String = text.chars().take(width.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let width = width.min(area.width);
    let height = height.min(area.height);
    Rect::new(
        area.x + (area.width - width) / 2,
        area.y + (area.height - height) / 2,
        width,
        height,
    )
}

fn block(title: impl Into<Line<'static>>) -> Block<'static> {
    Block::bordered()
        .border_type(BorderType::Rounded)
        .border_style(DIM)
        .title(title.into())
}

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
            View::Keys => self.render_keys(body, buf),
            View::Faults => self.render_faults(body, buf),
            View::Activity => self.render_activity(body, buf),
        }
        self.render_footer(footer, buf);
        if let Some(confirm) = &self.confirm {
            let text = format!("{} {}?", confirm.verb.question(), confirm.key);
            let width = (text.chars().count() as u16 + 6).clamp(40, area.width);
            let dialog = centered(area, width, 5);
            Clear.render(dialog, buf);
            Paragraph::new(vec![
                Line::from(text).bold(),
                Line::from(vec![
                    "y".bold().green(),
                    " / Enter: yes    ".into(),
                    "n".bold().red(),
                    " / Esc: no".into(),
                ]),
            ])
            .centered()
            .block(block(" Confirm ").border_style(Style::new().fg(Color::Yellow)))
            .render(dialog, buf);
        }
        if self.help {
            App::render_help(area, buf);
        }
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
            Connection::Lost { .. } => (
                "✗ disconnected",
                Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
            ),
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
        if let Connection::Lost {
            error,
            since_ms,
            attempts,
        } = &self.connection
        {
            let ago = duration(self.local_ms.saturating_sub(*since_ms));
            let text = format!(
                " connection lost {ago} ago: {error} — reconnecting (attempt {attempts}); showing the last data seen"
            );
            Line::from(truncate(&text, area.width.into()))
                .style(Style::new().fg(Color::White).bg(Color::Red).bold())
                .render(area, buf);
            return;
        }
        let Some(stats) = &self.stats else {
            Line::from(" waiting for the first answer from the admin API…")
                .style(DIM)
                .render(area, buf);
            return;
        };
        let r = &stats.rates_per_s;
        let mut rates = vec![Span::raw(" ")];
        for (outcome, rate) in [
            (Outcome::Executed, r.executed),
            (Outcome::Replayed, r.replayed),
            (Outcome::InFlight, r.in_flight),
            (Outcome::Conflict, r.conflict),
            (Outcome::Unavailable, r.unavailable),
        ] {
            rates.push(Span::styled(
                format!("{} {rate:.1}/s ", short(outcome)),
                outcome_style(outcome),
            ));
        }
        let active: Vec<String> = crate::api::Op::ALL
            .iter()
            .filter(|op| self.faults.faults.rule(**op).kind != FaultKind::Off)
            .map(|op| format!("{op} {}", self.faults.faults.rule(*op).kind.as_str()))
            .collect();
        let faults = if active.is_empty() {
            None
        } else {
            Some(Span::styled(
                format!(" faults: {}  ", active.join(", ")),
                Style::new().fg(Color::Red).bold(),
            ))
        };
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
        let mut spans = rates;
        spans.extend(faults);
        for extra in [p99, store] {
            if width(&spans) + extra.width() <= usize::from(area.width) {
                spans.push(extra);
            }
        }
        Line::from(spans).render(area, buf);
    }

    fn render_footer(&self, area: Rect, buf: &mut Buffer) {
        if let Some(input) = &self.input {
            Line::from(vec![
                Span::styled(format!(" {}: ", input.field.prompt()), LABEL),
                Span::raw(input.text.clone()),
                "█".slow_blink(),
                Span::styled("  Enter apply · Esc cancel", DIM),
            ])
            .render(area, buf);
            return;
        }
        let hints = match self.view {
            View::Keys => {
                "↑↓ move · s sort · f state · / prefix · Enter detail · r e d act · ? help · q quit "
            }
            View::Faults => {
                "o e t d l kind · Space on/off · +- latency · [] prob · <> count · ? help · q quit "
            }
            View::Activity => "c clear log · ? help · q quit ",
        };
        let status_width = match &self.status {
            Some((text, severity)) => {
                let style = match severity {
                    Severity::Info => Style::new().fg(Color::Green),
                    Severity::Error => Style::new().fg(Color::Red).bold(),
                };
                let text = truncate(&format!(" {text}"), usize::from(area.width) / 2);
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

    fn render_keys(&self, area: Rect, buf: &mut Buffer) {
        let (table_area, detail_area) = if self.detail_open {
            let table_height = area.height / 2;
            let [t, d] = Layout::vertical([Constraint::Length(table_height), Constraint::Min(0)])
                .areas(area);
            (t, Some(d))
        } else {
            (area, None)
        };
        self.render_key_table(table_area, buf);
        if let Some(detail_area) = detail_area {
            self.render_detail(detail_area, buf);
        }
    }

    #[allow(clippy::too_many_lines)] // one table: title, header, one cell per column
    fn render_key_table(&self, area: Rect, buf: &mut Buffer) {
        let keys = &self.keys;
        let q = &keys.query;
        let now = self.now_ms();
        let shown = self
            .visible_rows()
            .min(usize::from(area.height.saturating_sub(3)));
        let start = keys.offset.min(keys.rows.len());
        let end = (start + shown).min(keys.rows.len());
        let first = keys.page_start();
        let range = if keys.rows.is_empty() {
            "none".to_owned()
        } else {
            format!(
                "{}–{}",
                thousands((first + 1) as u64),
                thousands((first + keys.rows.len()) as u64)
            )
        };
        let of = match keys.total {
            Some(total) => format!(" of {}", thousands(total)),
            None if keys.next.is_some() => " of more".to_owned(),
            None => String::new(),
        };
        let mut title = vec![
            Span::styled(" Keys ", Style::new().bold()),
            Span::raw(format!("{range}{of} ")),
            Span::styled("· state ", DIM),
            Span::raw(match q.state {
                None => "all",
                Some(KeyState::Processing) => "processing",
                Some(KeyState::Done) => "done",
            }),
        ];
        if !q.prefix.is_empty() {
            title.push(Span::styled(" · prefix ", DIM));
            title.push(Span::raw(format!("{:?}", q.prefix)));
        }
        title.push(" ".into());
        if !keys.loaded {
            title.push(Span::styled("loading… ", DIM));
        }
        let arrow = if q.order == Order::Asc { "▲" } else { "▼" };
        let head = |name: &str, sort: Option<Sort>| {
            if sort == Some(q.sort) {
                Cell::from(format!("{name}{arrow}")).bold().underlined()
            } else {
                Cell::from(name.to_owned())
            }
        };
        // The last decision on each key needs room: shown from 100 columns.
        let wide = area.width >= 100;
        let mut header = vec![
            head("KEY", Some(Sort::Key)),
            head("STATE", None),
            head("LEASE", Some(Sort::Lease)),
            head("EXPIRES", Some(Sort::Expires)),
            head("FENCE", None),
            head("FINGERPR", None),
            head("STATUS", None),
            head("REPLAYS", Some(Sort::Replays)),
        ];
        if wide {
            header.push(head("LAST", None));
        }
        let header = Row::new(header).style(LABEL);
        let scale = keys.lease_scale_ms.max(1);
        let selected = keys.selected.min(keys.rows.len().saturating_sub(1));
        let rows = keys.rows[start..end].iter().enumerate().map(|(i, row)| {
            let (state, state_style) = key_state(row, now);
            let lease = if row.state == KeyState::Processing {
                let left = row.lease_until_ms.saturating_sub(now);
                let style = if left == 0 {
                    Style::new().fg(Color::Red)
                } else {
                    Style::new().fg(Color::Yellow)
                };
                Cell::from(Line::from(vec![
                    Span::styled(bar(left as f64 / scale as f64, 5), style),
                    Span::raw(format!(" {:>6}", duration(left))),
                ]))
            } else {
                Cell::from(Span::styled("      —", DIM))
            };
            let expires = row.expires_at_ms.saturating_sub(now);
            let mut cells = vec![
                Cell::from(row.key.clone()),
                Cell::from(Span::styled(state, state_style)),
                lease,
                Cell::from(format!("{:>7}", duration(expires))),
                Cell::from(format!("{:>5}", row.fence)),
                Cell::from(Span::styled(short_fingerprint(&row.fingerprint), DIM)),
                Cell::from(
                    row.status
                        .map_or_else(|| "     —".to_owned(), |s| format!("{s:>6}")),
                ),
                Cell::from(format!("{:>7}", row.replays)),
            ];
            if wide {
                cells.push(match self.last_outcome.get(&row.key) {
                    Some(outcome) => Cell::from(Span::styled(
                        outcome.as_str().to_uppercase(),
                        outcome_style(*outcome),
                    )),
                    None => Cell::from(Span::styled("—", DIM)),
                });
            }
            let row_widget = Row::new(cells);
            if start + i == selected && !keys.rows.is_empty() {
                row_widget.style(SELECTED)
            } else {
                row_widget
            }
        });
        let mut widths = vec![
            Constraint::Min(12),
            Constraint::Length(10),
            Constraint::Length(12),
            Constraint::Length(7),
            Constraint::Length(5),
            Constraint::Length(8),
            Constraint::Length(6),
            Constraint::Length(7),
        ];
        if wide {
            widths.push(Constraint::Length(11));
        }
        let table = Table::new(rows, widths)
            .header(header)
            .column_spacing(1)
            .block(block(Line::from(title)));
        Widget::render(table, area, buf);
        if keys.loaded && keys.rows.is_empty() {
            let inner = Rect::new(area.x + 2, area.y + 2, area.width.saturating_sub(4), 1);
            Line::from(Span::styled("no keys match", DIM)).render(inner, buf);
        }
    }

    fn render_detail(&self, area: Rect, buf: &mut Buffer) {
        let Some(row) = self.keys.selected_key() else {
            Paragraph::new("no key selected")
                .style(DIM)
                .block(block(" Detail "))
                .render(area, buf);
            return;
        };
        let now = self.now_ms();
        let detail = self.detail.as_ref().filter(|d| d.info.key == row.key);
        let info = detail.map_or(row, |d| &d.info);
        let (state, state_style) = key_state(info, now);
        let label = |t: &str| Span::styled(format!("{t:<12}"), LABEL);
        let mut lines = vec![
            Line::from(vec![
                label("state"),
                Span::styled(state, state_style),
                Span::styled(
                    format!("   fence {}  version {}", info.fence, info.version),
                    DIM,
                ),
            ]),
            Line::from(vec![
                label("lease"),
                Span::raw(if info.state == KeyState::Processing {
                    format!(
                        "{} left (until {} UTC)",
                        duration(info.lease_until_ms.saturating_sub(now)),
                        clock(info.lease_until_ms)
                    )
                } else {
                    "none (done)".to_owned()
                }),
            ]),
            Line::from(vec![
                label("expires"),
                Span::raw(format!(
                    "in {} (at {} UTC)",
                    duration(info.expires_at_ms.saturating_sub(now)),
                    clock(info.expires_at_ms)
                )),
            ]),
            Line::from(vec![
                label("fingerprint"),
                Span::raw(info.fingerprint.clone()),
            ]),
            Line::from(vec![
                label("replays"),
                Span::raw(info.replays.to_string()),
                Span::styled("   status ", LABEL),
                Span::raw(info.status.map_or("—".to_owned(), |s| s.to_string())),
            ]),
        ];
        match detail.map(|d| &d.response) {
            None => lines.push(Line::from(Span::styled(
                "loading the stored response…",
                DIM,
            ))),
            Some(None) => lines.push(Line::from(vec![
                label("response"),
                Span::styled("none stored (still processing)", DIM),
            ])),
            Some(Some(response)) => {
                lines.push(Line::from(vec![
                    label("response"),
                    Span::raw(format!(
                        "{} · {} body bytes",
                        response.status,
                        thousands(response.body_bytes)
                    )),
                ]));
                for (name, value) in &response.headers {
                    lines.push(Line::from(vec![
                        Span::raw("  "),
                        Span::styled(format!("{name}: "), DIM),
                        Span::raw(value.clone()),
                    ]));
                }
                lines.push(Line::from(label("body")));
                for line in response.body_preview.lines().take(usize::from(area.height)) {
                    lines.push(Line::from(format!("  {line}")));
                }
            }
        }
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(block(Line::from(vec![
                Span::raw(" "),
                Span::styled(row.key.clone(), Style::new().bold()),
                Span::raw(" "),
            ])))
            .render(area, buf);
    }

    fn render_faults(&self, area: Rect, buf: &mut Buffer) {
        let [table_area, log_area] =
            Layout::vertical([Constraint::Length(9), Constraint::Min(0)]).areas(area);
        let header =
            Row::new(["OP", "FAULT", "LATENCY", "PROBABILITY", "COUNT", "RULE"]).style(LABEL);
        let rows = crate::api::Op::ALL.iter().enumerate().map(|(i, op)| {
            let rule = self.faults.faults.rule(*op);
            let on = rule.kind != FaultKind::Off;
            let kind = format!("{} {}", if on { "●" } else { "○" }, rule.kind.as_str());
            let latency = if rule.kind.uses_latency() || !on {
                format!("{:>6}ms", rule.latency_ms)
            } else {
                "       —".into()
            };
            let row = Row::new(vec![
                Cell::from(op.as_str()),
                Cell::from(Span::styled(kind, fault_style(rule.kind))),
                Cell::from(latency),
                Cell::from(format!("{:>5}%", format_percent(rule.probability))),
                Cell::from(
                    rule.count
                        .map_or("     ∞".to_owned(), |n| format!("{n:>6}")),
                ),
                Cell::from(Span::styled(describe_rule(rule), DIM)),
            ]);
            if i == self.fault_selected {
                row.style(SELECTED)
            } else {
                row
            }
        });
        let title = Line::from(vec![
            Span::styled(" Store faults ", Style::new().bold()),
            Span::styled(
                format!("· injected {} ", thousands(self.faults.injected)),
                DIM,
            ),
            if self.faults_loaded {
                Span::raw("")
            } else {
                Span::styled("loading… ", DIM)
            },
        ]);
        let widths = [
            Constraint::Length(8),
            Constraint::Length(10),
            Constraint::Length(9),
            Constraint::Length(11),
            Constraint::Length(6),
            Constraint::Min(10),
        ];
        let inner = block(title);
        let table_inner = inner.inner(table_area);
        inner.render(table_area, buf);
        let [rows_area, keys_area] =
            Layout::vertical([Constraint::Length(5), Constraint::Min(0)]).areas(table_inner);
        Widget::render(
            Table::new(rows, widths).header(header).column_spacing(1),
            rows_area,
            buf,
        );
        let current = self.faults.faults.rule(self.selected_op()).kind;
        let mut choice = vec![Span::styled(format!(" {}: ", self.selected_op()), LABEL)];
        for (key, kind) in [
            ('o', FaultKind::Off),
            ('e', FaultKind::Error),
            ('t', FaultKind::Timeout),
            ('d', FaultKind::Delay),
            ('l', FaultKind::Lost),
        ] {
            let text = format!("[{key}] {}", kind.as_str());
            choice.push(if kind == current {
                Span::styled(text, fault_style(kind).add_modifier(Modifier::REVERSED))
            } else {
                Span::raw(text)
            });
            choice.push("  ".into());
        }
        choice.push(Span::styled(
            "+- latency  [] prob.  <> count  L P C M type",
            DIM,
        ));
        Paragraph::new(vec![Line::default(), Line::from(choice)]).render(keys_area, buf);
        self.render_log(log_area, buf);
    }

    fn render_activity(&self, area: Rect, buf: &mut Buffer) {
        let [top, log_area] =
            Layout::vertical([Constraint::Length(9), Constraint::Min(0)]).areas(area);
        let [rates_area, latency_area] =
            Layout::horizontal([Constraint::Min(40), Constraint::Length(30)]).areas(top);
        let rates_block = block(Line::from(vec![
            Span::styled(" Outcomes per second ", Style::new().bold()),
            Span::styled(format!("· last {} samples ", self.rates.len()), DIM),
        ]));
        let inner = rates_block.inner(rates_area);
        rates_block.render(rates_area, buf);
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
        let latency = self
            .stats
            .as_ref()
            .map(|s| s.store_latency_us)
            .unwrap_or_default();
        let pool = self.stats.as_ref().map(|s| s.pool).unwrap_or_default();
        let width = usize::from(latency_area.width.saturating_sub(2));
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
        let lat_block = block(Span::styled(" Store latency ", Style::new().bold()));
        let lat_inner = lat_block.inner(latency_area);
        lat_block.render(latency_area, buf);
        let [text_area, spark_area, pool_area] = Layout::vertical([
            Constraint::Length(3),
            Constraint::Length(2),
            Constraint::Min(0),
        ])
        .areas(lat_inner);
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
        self.render_log(log_area, buf);
    }

    fn render_log(&self, area: Rect, buf: &mut Buffer) {
        let title = Line::from(vec![
            Span::styled(" Decisions ", Style::new().bold()),
            Span::styled("· newest last ", DIM),
        ]);
        let outer = block(title);
        let inner = outer.inner(area);
        outer.render(area, buf);
        let rows = usize::from(inner.height);
        let lines: Vec<Line> = self
            .log
            .iter()
            .skip(self.log.len().saturating_sub(rows))
            .map(|line| match line {
                LogLine::Decision(d) => Line::from(vec![
                    Span::styled(clock(d.ts_ms), DIM),
                    " ".into(),
                    Span::styled(
                        format!("{:<11}", d.outcome.as_str().to_uppercase()),
                        outcome_style(d.outcome),
                    ),
                    Span::raw(format!(" {:<24}", truncate(&d.key, 24))),
                    Span::raw(d.status.map_or("   —".to_owned(), |s| format!(" {s:>3}"))),
                    Span::styled(format!(" {:>8}", micros(d.latency_us)), DIM),
                    Span::raw(
                        d.detail
                            .as_ref()
                            .map(|t| format!("  {t}"))
                            .unwrap_or_default(),
                    ),
                ]),
                LogLine::Fault(f) => Line::from(vec![
                    Span::styled(clock(f.ts_ms), DIM),
                    " ".into(),
                    Span::styled(
                        format!("{:<11}", "FAULT"),
                        fault_style(f.rule.kind).add_modifier(Modifier::REVERSED),
                    ),
                    Span::raw(format!(" {} → {}", f.op, describe_rule(&f.rule))),
                ]),
            })
            .collect();
        if lines.is_empty() {
            Line::from(Span::styled("no decisions yet", DIM)).render(inner, buf);
        } else {
            Paragraph::new(lines).render(inner, buf);
        }
    }

    fn render_help(area: Rect, buf: &mut Buffer) {
        let dialog = centered(area, 76, 18);
        Clear.render(dialog, buf);
        let outer = block(Span::styled(
            " Help · ? or Esc closes ",
            Style::new().bold(),
        ))
        .border_style(LABEL);
        let inner = outer.inner(dialog);
        outer.render(dialog, buf);
        let [left, right] =
            Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)])
                .areas(inner);
        let sections = bindings();
        let column = |parts: &[(&'static str, &'static [crate::action::Binding])]| {
            let mut lines = Vec::new();
            for (title, list) in parts {
                lines.push(Line::from(Span::styled(
                    *title,
                    Style::new().bold().underlined(),
                )));
                for b in *list {
                    lines.push(Line::from(vec![
                        Span::styled(format!(" {:<13}", b.keys), LABEL),
                        Span::raw(b.what),
                    ]));
                }
                lines.push(Line::default());
            }
            Paragraph::new(lines)
        };
        column(&sections[..2]).render(left, buf);
        column(&sections[2..]).render(right, buf);
    }
}

/// The first 8 digits of a fingerprint, after any `sha256:`-style prefix.
pub fn short_fingerprint(fingerprint: &str) -> String {
    let digits = fingerprint.rsplit(':').next().unwrap_or(fingerprint);
    digits.chars().take(8).collect()
}

/// Picks one outcome's rate.
type Pick = fn(&Outcomes<f64>) -> f64;

fn short(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Executed => "exec",
        Outcome::Replayed => "replay",
        Outcome::InFlight => "inflight",
        Outcome::Conflict => "conflict",
        Outcome::Unavailable => "unavail",
        Outcome::Invalid => "invalid",
    }
}
