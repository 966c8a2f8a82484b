//! Styles that carry meaning, shared by every view.

use crate::api::{FaultKind, KeyInfo, KeyState, Verdict};
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, BorderType};

pub const SELECTED: Style = Style::new()
    .bg(Color::DarkGray)
    .add_modifier(Modifier::BOLD);
pub const DIM: Style = Style::new().fg(Color::DarkGray);
pub const LABEL: Style = Style::new().fg(Color::Cyan);
pub const BOLD: Style = Style::new().add_modifier(Modifier::BOLD);
pub const ALERT: Style = Style::new().fg(Color::Red).add_modifier(Modifier::BOLD);

/// Whether a key's lease has run out: the owner stopped renewing, and the
/// next request takes the key over.
pub fn lapsed(row: &KeyInfo, now_ms: u64) -> bool {
    row.state == KeyState::Processing && row.lease_until_ms <= now_ms
}

/// A key's state as the operator reads it: the store's state, and whether
/// its lease or its retention has run out by now.
pub fn key_state(row: &KeyInfo, now_ms: u64) -> (&'static str, Style) {
    match row.state {
        KeyState::Processing if !lapsed(row, now_ms) => {
            ("PROCESSING", Style::new().fg(Color::Yellow))
        }
        KeyState::Processing => ("LAPSED", ALERT),
        KeyState::Done if row.expires_at_ms > now_ms => ("DONE", Style::new().fg(Color::Green)),
        KeyState::Done => ("EXPIRED", DIM),
    }
}

pub fn outcome_style(outcome: Verdict) -> Style {
    match outcome {
        Verdict::Executed => Style::new().fg(Color::Green),
        Verdict::Replayed => Style::new().fg(Color::Cyan),
        Verdict::InFlight => Style::new().fg(Color::Yellow),
        Verdict::Conflict => Style::new().fg(Color::Magenta),
        Verdict::Unavailable => ALERT,
        Verdict::Invalid => Style::new().fg(Color::LightRed),
    }
}

pub fn fault_style(kind: FaultKind) -> Style {
    match kind {
        FaultKind::Off => DIM,
        FaultKind::Error => ALERT,
        FaultKind::Timeout => Style::new().fg(Color::Magenta).add_modifier(Modifier::BOLD),
        FaultKind::Delay => Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD),
        FaultKind::Lost => Style::new()
            .fg(Color::LightRed)
            .add_modifier(Modifier::BOLD),
    }
}

/// A bordered panel with a title.
pub fn block(title: impl Into<Line<'static>>) -> Block<'static> {
    Block::bordered()
        .border_type(BorderType::Rounded)
        .border_style(DIM)
        .title(title.into())
}

/// A `width`×`height` rectangle in the middle of `area`.
pub fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let width = width.min(area.width);
    let height = height.min(area.height);
    Rect::new(
        area.x + (area.width - width) / 2,
        area.y + (area.height - height) / 2,
        width,
        height,
    )
}
