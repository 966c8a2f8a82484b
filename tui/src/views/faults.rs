//! The faults view: the store decorator's rule for each operation, edited
//! from the keyboard. A change is a draft until `Enter` applies it (`Esc`
//! discards it), so a rule goes live whole — its count and probability set —
//! never half-made on its first key press. Turning a fault off (`o`, or
//! `Space` on a fault that is on) applies at once: taking a fault away is
//! always safe. A whole rule typed with `R` applies on its own `Enter`.
//! The cursor starts on `insert`, the operation the guard claims with
//! (`tests::update::faults::the_cursor_starts_on_insert`).

use super::{Effects, Field, Input, Severity};
use crate::api::{FaultKind, FaultRule, Faults, MAX_LATENCY_MS, Op};
use crate::format::{percent, thousands};
use crate::keymap::{Binding, also, bind};
use crate::protocol::Command;
use crate::theme::{BOLD, DIM, LABEL, SELECTED, block, fault_style};
use crossterm::event::KeyCode;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table, Widget};

/// The operations the guard component calls: `insert` to claim a key,
/// `replace` to complete, release, renew or checkpoint it, `get` to read
/// a record back after a holder's write failed (contract 0.2). `delete`
/// serves the admin API only, so a fault on it changes no traffic.
pub const GUARD_OPS: [Op; 3] = [Op::Get, Op::Insert, Op::Replace];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultsAction {
    Up,
    Down,
    Home,
    End,
    SetKind(FaultKind),
    Toggle,
    LatencyUp,
    LatencyDown,
    ProbabilityUp,
    ProbabilityDown,
    CountUp,
    CountDown,
    EditLatency,
    EditProbability,
    EditCount,
    EditMessage,
    /// The whole rule as text, in the grammar the gateway parses.
    EditRule,
    /// Sends the draft.
    Apply,
    /// Drops the draft.
    Discard,
}

use FaultsAction as A;
use KeyCode as K;

/// The faults view's key table; the help overlay lists it as written.
#[rustfmt::skip] // a table: one binding a line
pub const BINDINGS: &[Binding<FaultsAction>] = &[
    bind(&[K::Up, K::Char('k')], A::Up, "↑↓ j k", "choose the operation"),
    also(&[K::Down, K::Char('j')], A::Down),
    also(&[K::Home, K::Char('g'), K::PageUp], A::Home),
    also(&[K::End, K::Char('G'), K::PageDown], A::End),
    bind(&[K::Char('o')], A::SetKind(FaultKind::Off), "o / e", "off / error"),
    also(&[K::Char('e')], A::SetKind(FaultKind::Error)),
    bind(&[K::Char('t')], A::SetKind(FaultKind::Timeout), "t / d / l", "timeout / delay / lost"),
    also(&[K::Char('d')], A::SetKind(FaultKind::Delay)),
    also(&[K::Char('l')], A::SetKind(FaultKind::Lost)),
    bind(&[K::Char(' ')], A::Toggle, "Space", "fault on / off"),
    bind(&[K::Char('+'), K::Char('=')], A::LatencyUp, "+ / -", "latency ±100 ms"),
    also(&[K::Char('-'), K::Char('_')], A::LatencyDown),
    bind(&[K::Char(']')], A::ProbabilityUp, "] / [", "probability ±10 %"),
    also(&[K::Char('[')], A::ProbabilityDown),
    bind(&[K::Char('>'), K::Char('.')], A::CountUp, "> / <", "count ±1 (0: unlimited)"),
    also(&[K::Char('<'), K::Char(',')], A::CountDown),
    bind(&[K::Char('L')], A::EditLatency, "L / P", "type latency / prob."),
    also(&[K::Char('P')], A::EditProbability),
    bind(&[K::Char('C')], A::EditCount, "C / M", "type count / message"),
    also(&[K::Char('M')], A::EditMessage),
    bind(&[K::Char('R')], A::EditRule, "R", "type the whole rule"),
    bind(&[K::Enter], A::Apply, "Enter / Esc", "apply / drop the draft"),
    also(&[K::Esc], A::Discard),
];

/// Each fault kind with the key that sets it, in the key table's order:
/// the panel offers them as the table binds them.
fn kind_keys() -> impl Iterator<Item = (char, FaultKind)> {
    BINDINGS.iter().filter_map(|b| match (b.action, b.codes) {
        (A::SetKind(kind), [K::Char(key), ..]) => Some((*key, kind)),
        _ => None,
    })
}

pub const HINTS: &str =
    "o e t d l kind · +- latency · [] prob · <> count · Enter apply · Esc discard · ? help ";

const INJECTED_BY: &str = "injected by idem-tui";

#[derive(Clone, Debug, PartialEq)]
pub struct FaultsView {
    pub current: Faults,
    pub loaded: bool,
    pub selected: usize,
    /// A rule being made for an operation, not sent until `Enter`.
    pub draft: Option<(Op, FaultRule)>,
}

impl Default for FaultsView {
    fn default() -> Self {
        FaultsView {
            current: Faults::default(),
            loaded: false,
            // Opens on insert: the operation every claim goes through.
            selected: op_index(Op::Insert),
            draft: None,
        }
    }
}

fn op_index(op: Op) -> usize {
    Op::ALL.iter().position(|o| *o == op).unwrap_or(0)
}

impl FaultsView {
    pub fn selected_op(&self) -> Op {
        Op::ALL[self.selected.min(Op::ALL.len() - 1)]
    }

    /// The rule shown for `op`: its draft, or the rule in force.
    pub fn shown(&self, op: Op) -> &FaultRule {
        match &self.draft {
            Some((draft_op, rule)) if *draft_op == op => rule,
            _ => self.current.faults.rule(op),
        }
    }

    pub fn update(&mut self, action: FaultsAction) -> Effects {
        let last = Op::ALL.len() - 1;
        let op = self.selected_op();
        let rule = self.shown(op).clone();
        if let Some(why) = pointless(action, op, &rule) {
            return Effects::say(why, Severity::Error);
        }
        let moved = |view: &mut FaultsView, to: usize| {
            if to == view.selected {
                return Effects::none();
            }
            view.selected = to;
            match view.draft.take() {
                Some((op, rule)) => Effects::say(
                    format!("{op}: draft {rule} discarded (not applied)"),
                    Severity::Error,
                ),
                None => Effects::none(),
            }
        };
        match action {
            A::Up => moved(self, self.selected.saturating_sub(1)),
            A::Down => moved(self, (self.selected + 1).min(last)),
            A::Home => moved(self, 0),
            A::End => moved(self, last),
            A::Apply => self.apply(),
            A::Discard => match self.draft.take() {
                Some((op, rule)) => {
                    Effects::say(format!("{op}: draft {rule} discarded"), Severity::Info)
                }
                None => Effects::none(),
            },
            A::EditLatency => {
                Effects::prompt(Input::new(Field::Latency(op), rule.latency_ms.to_string()))
            }
            A::EditProbability => Effects::prompt(Input::new(
                Field::Probability(op),
                percent(rule.probability),
            )),
            A::EditCount => Effects::prompt(Input::new(
                Field::Count(op),
                rule.count.map_or("unlimited".to_owned(), |n| n.to_string()),
            )),
            A::EditMessage => Effects::prompt(Input::new(Field::Message(op), rule.message)),
            A::EditRule => Effects::prompt(Input::new(Field::Rule(op), rule.to_string())),
            A::SetKind(_)
            | A::Toggle
            | A::LatencyUp
            | A::LatencyDown
            | A::ProbabilityUp
            | A::ProbabilityDown
            | A::CountUp
            | A::CountDown => self.edit(|rule| adjust(action, rule)),
        }
    }

    /// Changes the selected operation's draft (made from the rule in force
    /// at its first change). A change back to the rule in force drops the
    /// draft; a change to `off` applies at once.
    fn edit(&mut self, change: impl FnOnce(&mut FaultRule)) -> Effects {
        if !self.loaded {
            return Effects::say(
                "faults not loaded yet: waiting for the server",
                Severity::Error,
            );
        }
        let op = self.selected_op();
        let mut rule = self.shown(op).clone();
        change(&mut rule);
        if &rule == self.current.faults.rule(op) {
            self.draft = None;
            return Effects::none();
        }
        if rule.kind == FaultKind::Off {
            self.draft = Some((op, rule));
            return self.apply();
        }
        let said = format!("{op}: draft {rule} — Enter applies it, Esc discards it");
        self.draft = Some((op, rule));
        Effects::say(said, Severity::Info)
    }

    /// Sends the draft. The table shows it as in force at once; the server's
    /// answer (or its refusal) has the last word.
    fn apply(&mut self) -> Effects {
        let Some((op, rule)) = self.draft.take() else {
            return Effects::say(
                "no draft to apply: change a fault first (e t d l, + - [ ] < >)",
                Severity::Error,
            );
        };
        self.current.faults.rule_mut(op).clone_from(&rule);
        let mut effects = Effects::commands(vec![Command::SetFault(op, rule.clone())]);
        let unused = if GUARD_OPS.contains(&op) {
            ""
        } else {
            " (the guard never calls it: no traffic changes)"
        };
        effects.status = Some((format!("{op}: {rule} — sending{unused}"), Severity::Info));
        effects
    }

    /// A typed value for one of the fields.
    pub fn submit(&mut self, field: Field, text: &str) -> Effects {
        let refuse = |why: String| Effects::say(why, Severity::Error);
        match field {
            Field::Search => Effects::none(),
            Field::Latency(op) => {
                self.selected = op_index(op);
                match text.parse::<u64>() {
                    Ok(ms) if ms <= MAX_LATENCY_MS => self.edit(|r| r.latency_ms = ms),
                    _ => refuse(format!(
                        "latency {text:?} is not a whole number of ms from 0 to {MAX_LATENCY_MS}"
                    )),
                }
            }
            Field::Probability(op) => {
                self.selected = op_index(op);
                match text.trim_end_matches('%').trim().parse::<f64>() {
                    Ok(p) if (0.0..=100.0).contains(&p) => self.edit(|r| r.probability = p / 100.0),
                    _ => refuse(format!(
                        "probability {text:?} is not a percentage from 0 to 100"
                    )),
                }
            }
            Field::Count(op) => {
                self.selected = op_index(op);
                let count = if text.is_empty() {
                    Ok(0)
                } else {
                    text.parse::<u64>()
                };
                match count {
                    Ok(n) => self.edit(|r| r.count = (n > 0).then_some(n)),
                    Err(_) => refuse(format!(
                        "count {text:?} is not a whole number (0 = unlimited)"
                    )),
                }
            }
            Field::Message(op) => {
                self.selected = op_index(op);
                self.edit(|r| text.clone_into(&mut r.message))
            }
            Field::Rule(op) => {
                self.selected = op_index(op);
                // The whole rule, typed and entered: its Enter is the confirmation.
                match text.parse::<FaultRule>() {
                    Ok(rule) if &rule == self.current.faults.rule(op) => {
                        self.draft = None;
                        Effects::none()
                    }
                    Ok(rule) => {
                        self.draft = Some((op, rule));
                        self.apply()
                    }
                    Err(e) => refuse(e.to_string()),
                }
            }
        }
    }

    /// The operations with a fault on, for the summary line.
    pub fn active(&self) -> Vec<String> {
        Op::ALL
            .iter()
            .filter(|op| self.current.faults.rule(**op).kind != FaultKind::Off)
            .map(|op| format!("{op} {}", self.current.faults.rule(*op).kind.as_str()))
            .collect()
    }
}

impl FaultsView {
    /// The draft, and that it is not in force yet.
    fn draft_line(&self) -> Line<'static> {
        match &self.draft {
            Some((op, rule)) => Line::from(vec![
                Span::styled(format!(" ✎ {op}: {rule} "), fault_style(rule.kind)),
                Span::styled("not applied: Enter applies it, Esc discards it", BOLD),
            ]),
            None => Line::default(),
        }
    }
}

/// What a key that edits a rule does to it.
fn adjust(action: FaultsAction, rule: &mut FaultRule) {
    match action {
        A::SetKind(kind) => {
            rule.kind = kind;
            if kind.uses_latency() && rule.latency_ms == 0 {
                rule.latency_ms = 500;
            }
        }
        A::Toggle => {
            rule.kind = if rule.kind == FaultKind::Off {
                FaultKind::Error
            } else {
                FaultKind::Off
            };
        }
        A::LatencyUp => rule.latency_ms = (rule.latency_ms + 100).min(MAX_LATENCY_MS),
        A::LatencyDown => rule.latency_ms = rule.latency_ms.saturating_sub(100),
        A::ProbabilityUp => {
            rule.probability = (((rule.probability * 10.0).round() + 1.0) / 10.0).min(1.0);
        }
        A::ProbabilityDown => {
            rule.probability = (((rule.probability * 10.0).round() - 1.0) / 10.0).max(0.0);
        }
        A::CountUp => rule.count = Some(rule.count.map_or(1, |n| n + 1)),
        A::CountDown => {
            rule.count = match rule.count {
                None | Some(0 | 1) => None,
                Some(n) => Some(n - 1),
            };
        }
        _ => {}
    }
    if rule.kind == FaultKind::Error && rule.message.is_empty() {
        rule.message = INJECTED_BY.into();
    }
}

/// Why `action` would do nothing to `rule`, if it would: a key that does
/// nothing must say why.
fn pointless(action: FaultsAction, op: Op, rule: &FaultRule) -> Option<String> {
    let kind = rule.kind.as_str();
    match action {
        A::LatencyUp | A::LatencyDown | A::EditLatency if !rule.kind.uses_latency() => {
            Some(format!(
                "{op}: latency is for timeout and delay faults (press t or d); this one is {kind}"
            ))
        }
        A::EditMessage if rule.kind != FaultKind::Error => Some(format!(
            "{op}: the message is for error faults (press e); this one is {kind}"
        )),
        A::ProbabilityUp
        | A::ProbabilityDown
        | A::CountUp
        | A::CountDown
        | A::EditProbability
        | A::EditCount
            if rule.kind == FaultKind::Off =>
        {
            Some(format!(
                "{op}: the fault is off; choose a kind first (e error, t timeout, d delay, l lost)"
            ))
        }
        _ => None,
    }
}

/// Lines the faults panel takes: borders, header, four operations, a blank,
/// the keys for the selected operation, and what the guard calls.
pub const HEIGHT: u16 = 10;

impl Widget for &FaultsView {
    fn render(self, area: Rect, buf: &mut Buffer) {
        let header =
            Row::new(["OP", "FAULT", "LATENCY", "PROBABILITY", "COUNT", "RULE"]).style(LABEL);
        let rows = Op::ALL.iter().enumerate().map(|(i, op)| {
            let rule = self.shown(*op);
            let drafted = self.draft.as_ref().is_some_and(|(d, _)| d == op);
            let on = rule.kind != FaultKind::Off;
            let mark = match (drafted, on) {
                (true, _) => "✎",
                (false, true) => "●",
                (false, false) => "○",
            };
            let kind = format!("{mark} {}", rule.kind.as_str());
            let latency = if rule.kind.uses_latency() || !on {
                format!("{:>6}ms", rule.latency_ms)
            } else {
                "       —".into()
            };
            let name = if GUARD_OPS.contains(op) {
                Span::raw(op.as_str())
            } else {
                Span::styled(format!("{op}*"), DIM)
            };
            let row = Row::new(vec![
                Cell::from(name),
                Cell::from(Span::styled(kind, fault_style(rule.kind))),
                Cell::from(latency),
                Cell::from(format!("{:>5}%", percent(rule.probability))),
                Cell::from(
                    rule.count
                        .map_or("     ∞".to_owned(), |n| format!("{n:>6}")),
                ),
                Cell::from(if drafted {
                    Span::styled(format!("{rule} (draft)"), fault_style(rule.kind))
                } else {
                    Span::styled(rule.to_string(), DIM)
                }),
            ]);
            if i == self.selected {
                row.style(SELECTED)
            } else {
                row
            }
        });
        let title = Line::from(vec![
            Span::styled(" Store faults ", BOLD),
            Span::styled(
                format!("· injected {} ", thousands(self.current.injected)),
                DIM,
            ),
            if self.loaded {
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
        let outer = block(title);
        let inner = outer.inner(area);
        outer.render(area, buf);
        let [rows_area, keys_area] =
            Layout::vertical([Constraint::Length(5), Constraint::Min(0)]).areas(inner);
        Widget::render(
            Table::new(rows, widths).header(header).column_spacing(1),
            rows_area,
            buf,
        );
        let op = self.selected_op();
        let current = self.shown(op).kind;
        let mut choice = vec![Span::styled(format!(" {op}: "), LABEL)];
        for (key, kind) in kind_keys() {
            let text = format!("[{key}] {}", kind.as_str());
            choice.push(if kind == current {
                Span::styled(text, fault_style(kind).add_modifier(Modifier::REVERSED))
            } else {
                Span::raw(text)
            });
            choice.push("  ".into());
        }
        // The rest is in the footer too: shown when it fits.
        let tail = Span::styled("+- latency  [] prob.  <> count  L P C M R type", DIM);
        let used: usize = choice.iter().map(Span::width).sum();
        if used + tail.width() <= usize::from(keys_area.width) {
            choice.push(tail);
        }
        let note = Line::from(Span::styled(
            " The guard calls get, insert and replace; *delete: admin API only.",
            DIM,
        ));
        Paragraph::new(vec![self.draft_line(), Line::from(choice), note]).render(keys_area, buf);
    }
}
