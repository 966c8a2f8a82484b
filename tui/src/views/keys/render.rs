//! Drawing the keys view: `impl Widget for &KeysView`. The table measures
//! the rows that fit here, where it is drawn, and keeps the selection on
//! screen (as ratatui's `TableState` does).

// Bar lengths are shown to an eighth of a cell: a float loses nothing there.
#![allow(clippy::cast_precision_loss)]

use super::{KeysView, split_key};
use crate::api::{KeyInfo, KeyState};
use crate::format::{bar, date_time, duration, short_fingerprint, thousands, truncate_middle};
use crate::protocol::{Order, Sort};
use crate::theme::{ALERT, BOLD, DIM, LABEL, SELECTED, block, key_state, outcome_style};
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table, Widget, Wrap};
use std::collections::BTreeSet;

/// Which columns fit a table `width` cells wide. The key always shows; the
/// others give way from the right of the least needed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyColumns {
    /// LAST: the latest decision on the key.
    pub last: bool,
    /// FENCE and FINGERPR (both are in the detail pane).
    pub fence_and_fingerprint: bool,
}

impl KeyColumns {
    pub fn for_width(width: u16) -> KeyColumns {
        KeyColumns {
            last: width >= 100,
            fence_and_fingerprint: width >= 120,
        }
    }
}

/// The short tag of each client scope on the page: at least 6 characters,
/// more while two scopes would share it (as git shortens hashes).
pub fn scope_tags<'a>(scopes: impl Iterator<Item = &'a str>) -> usize {
    let scopes: BTreeSet<&str> = scopes.collect();
    let distinct = |n: usize| {
        let cut: BTreeSet<String> = scopes.iter().map(|s| s.chars().take(n).collect()).collect();
        cut.len() == scopes.len()
    };
    (6..16).find(|n| distinct(*n)).unwrap_or(16)
}

fn tag(scope: &str, len: usize) -> String {
    if scope.is_empty() {
        "—".to_owned()
    } else {
        scope.chars().take(len).collect()
    }
}

impl Widget for &KeysView {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let (table_area, detail_area) = if self.detail_open {
            let [t, d] =
                Layout::vertical([Constraint::Percentage(50), Constraint::Min(0)]).areas(area);
            (t, Some(d))
        } else {
            (area, None)
        };
        self.render_table(table_area, buf);
        if let Some(detail_area) = detail_area {
            self.render_detail(detail_area, buf);
        }
    }
}

impl KeysView {
    /// The visible rows: borders and the column header take three lines.
    fn scroll_to_selection(&self, height: u16) -> (usize, usize) {
        let shown = usize::from(height.saturating_sub(3)).max(1);
        self.page_rows.set(shown);
        let len = self.rows.len();
        let selected = self.selected.min(len.saturating_sub(1));
        let mut offset = self.offset.get();
        if selected < offset {
            offset = selected;
        } else if selected >= offset + shown {
            offset = selected + 1 - shown;
        }
        offset = offset.min(len.saturating_sub(shown));
        self.offset.set(offset);
        (offset, (offset + shown).min(len))
    }

    fn title(&self) -> Vec<Span<'static>> {
        let q = &self.query;
        let first = self.page_start();
        let range = if self.rows.is_empty() {
            "none".to_owned()
        } else {
            format!(
                "{}–{}",
                thousands((first + 1) as u64),
                thousands((first + self.rows.len()) as u64)
            )
        };
        let of = match self.total {
            Some(total) => format!(" of {}", thousands(total)),
            None if self.next.is_some() => " of more".to_owned(),
            None => String::new(),
        };
        let mut title = vec![
            Span::styled(" Keys ", BOLD),
            Span::raw(format!("{range}{of} ")),
            Span::styled("· state ", DIM),
            Span::raw(self.filter.as_str()),
        ];
        if !q.search.is_empty() {
            title.push(Span::styled(" · search ", DIM));
            title.push(Span::raw(format!("{:?}", q.search)));
        }
        if !q.prefix.is_empty() {
            title.push(Span::styled(" · prefix ", DIM));
            title.push(Span::raw(format!("{:?}", q.prefix)));
        }
        title.push(" ".into());
        if let Some(why) = &self.unavailable {
            // Last in the title: the border clips what does not fit.
            title.push(Span::styled(format!("last page shown; {why} "), ALERT));
        } else if !self.loaded {
            title.push(Span::styled("loading… ", DIM));
        }
        title
    }

    fn render_table(&self, area: Rect, buf: &mut Buffer) {
        let q = &self.query;
        let now = self.now_ms();
        let (start, end) = self.scroll_to_selection(area.height);
        let columns = KeyColumns::for_width(area.width);
        // Keys of a library's own store have no client scope: no column.
        let scoped = self.rows.iter().any(|r| !split_key(&r.key).0.is_empty());
        let tag_len = if scoped {
            scope_tags(self.rows[start..end].iter().map(|r| split_key(&r.key).0))
        } else {
            0
        };
        let arrow = if q.order == Order::Asc { "▲" } else { "▼" };
        let head = |name: &str, sort: Option<Sort>| {
            if sort == Some(q.sort) {
                Cell::from(format!("{name}{arrow}")).bold().underlined()
            } else {
                Cell::from(name.to_owned())
            }
        };
        // (header, width) after the key, which takes what is left.
        let mut fixed: Vec<(Cell, u16)> = vec![
            (head("STATE", None), 10),
            (head("LEASE", Some(Sort::Lease)), 12),
            (head("EXPIRES", Some(Sort::Expires)), 7),
        ];
        if columns.fence_and_fingerprint {
            fixed.push((head("FENCE", None), 5));
            fixed.push((head("FINGERPR", None), 8));
        }
        fixed.push((head("STATUS", None), 6));
        fixed.push((head("REPLAYS", Some(Sort::Replays)), 7));
        if columns.last {
            fixed.push((head("LAST", None), 11));
        }
        if scoped {
            fixed.insert(0, (head("CLIENT", None), tag_len as u16));
        }
        // The key comes after the client's tag: one gap per fixed column,
        // two borders.
        let gaps = fixed.len() as u16;
        let taken: u16 = fixed.iter().map(|(_, w)| *w).sum::<u16>() + gaps + 2;
        let key_width = area.width.saturating_sub(taken).max(8);
        let key_at = usize::from(scoped);
        let mut widths: Vec<Constraint> =
            fixed.iter().map(|(_, w)| Constraint::Length(*w)).collect();
        widths.insert(key_at, Constraint::Length(key_width));
        let mut header: Vec<Cell> = fixed.into_iter().map(|(cell, _)| cell).collect();
        header.insert(key_at, head("KEY", Some(Sort::Key)));
        let rows = self.rows[start..end].iter().enumerate().map(|(i, row)| {
            let row_widget = self.row(row, now, columns, tag_len, key_width);
            if start + i == self.selected.min(self.rows.len().saturating_sub(1)) {
                row_widget.style(SELECTED)
            } else {
                row_widget
            }
        });
        let table = Table::new(rows, widths)
            .header(Row::new(header).style(LABEL))
            .column_spacing(1)
            .block(block(Line::from(self.title())));
        Widget::render(table, area, buf);
        if self.loaded && self.rows.is_empty() {
            let inner = Rect::new(area.x + 2, area.y + 2, area.width.saturating_sub(4), 1);
            let why = if q.search.is_empty() {
                "no keys match".to_owned()
            } else {
                format!("no key contains {:?} (Esc clears the search)", q.search)
            };
            Line::from(Span::styled(why, DIM)).render(inner, buf);
        }
    }

    fn row(
        &self,
        row: &KeyInfo,
        now: u64,
        columns: KeyColumns,
        tag_len: usize,
        key_width: u16,
    ) -> Row<'static> {
        let scale = self.lease_scale_ms.max(1);
        let (scope, key) = split_key(&row.key);
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
        let mut cells = Vec::with_capacity(11);
        if tag_len > 0 {
            cells.push(Cell::from(Span::styled(tag(scope, tag_len), DIM)));
        }
        cells.extend([
            Cell::from(truncate_middle(key, usize::from(key_width))),
            Cell::from(Span::styled(state, state_style)),
            lease,
            Cell::from(format!(
                "{:>7}",
                duration(row.expires_at_ms.saturating_sub(now))
            )),
        ]);
        if columns.fence_and_fingerprint {
            cells.push(Cell::from(format!("{:>5}", row.fence)));
            cells.push(Cell::from(Span::styled(
                short_fingerprint(&row.fingerprint),
                DIM,
            )));
        }
        cells.push(Cell::from(
            row.status
                .map_or_else(|| "     —".to_owned(), |s| format!("{s:>6}")),
        ));
        cells.push(Cell::from(format!("{:>7}", row.replays)));
        if columns.last {
            cells.push(match self.last_outcome.get(&row.key) {
                Some(outcome) => Cell::from(Span::styled(
                    outcome.as_str().to_uppercase(),
                    outcome_style(*outcome),
                )),
                None => Cell::from(Span::styled("—", DIM)),
            });
        }
        Row::new(cells)
    }

    fn render_detail(&self, area: Rect, buf: &mut Buffer) {
        let Some(row) = self.selected_key() else {
            Paragraph::new("no key selected")
                .style(DIM)
                .block(block(" Detail "))
                .render(area, buf);
            return;
        };
        let now = self.now_ms();
        let detail = self.detail.as_ref().filter(|d| d.info.key == row.key);
        let info = detail.map_or(row, |d| &d.info);
        let label = |t: &str| Span::styled(format!("{t:<12}"), LABEL);
        let mut lines = record_lines(info, now);
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
                for line in response.body_preview.lines() {
                    lines.push(Line::from(format!("  {line}")));
                }
            }
        }
        let scrolled = if self.detail_scroll > 0 {
            format!("↓{} · J K scroll ", self.detail_scroll)
        } else {
            "J K scroll ".to_owned()
        };
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .scroll((self.detail_scroll, 0))
            .block(
                block(Line::from(vec![
                    Span::raw(" "),
                    Span::styled(info.key.clone(), BOLD),
                    Span::raw(" "),
                ]))
                .title_bottom(Line::from(Span::styled(scrolled, DIM)).right_aligned()),
            )
            .render(area, buf);
    }
}

/// The detail pane's lines about the record itself.
fn record_lines(info: &KeyInfo, now: u64) -> Vec<Line<'static>> {
    let (state, state_style) = key_state(info, now);
    let (scope, key) = split_key(&info.key);
    let label = |t: &str| Span::styled(format!("{t:<12}"), LABEL);
    vec![
        Line::from(vec![label("key"), Span::raw(key.to_owned()).bold()]),
        Line::from(vec![
            label("client"),
            Span::raw(if scope.is_empty() {
                "— (no client scope)".to_owned()
            } else {
                scope.to_owned()
            }),
        ]),
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
                    date_time(info.lease_until_ms)
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
                date_time(info.expires_at_ms)
            )),
        ]),
        Line::from(vec![
            label("fingerprint"),
            Span::raw(info.fingerprint.clone()),
        ]),
        Line::from(vec![
            label("replays"),
            Span::raw(info.replays.to_string()),
            Span::styled(" (since the gateway started)", DIM),
            Span::styled("   status ", LABEL),
            Span::raw(info.status.map_or("—".to_owned(), |s| s.to_string())),
        ]),
    ]
}
