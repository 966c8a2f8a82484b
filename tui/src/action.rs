//! What the operator asks the console to do: key presses become
//! [`Action`]s here. The shell's own keys (views, help, quit, the dialogs)
//! are below; each view's keys are in its own table, which the help
//! overlay lists as written ([`help`]).

use crate::keymap::{Binding, Section, also, bind, help_lines, lookup};
use crate::views::View;
use crate::views::activity::{self, ActivityAction};
use crate::views::faults::{self, FaultsAction};
use crate::views::keys::{self, KeysAction};
use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

/// Everything the operator or the passing time changes. `App::update` is
/// the only consumer; what the server reports is an `Update`, not an action.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Action {
    Quit,
    ToggleHelp,
    ShowView(View),
    NextView,
    PrevView,
    /// Answers to a confirmation.
    Confirm,
    Cancel,
    /// Typed input (search, fault fields).
    InputChar(char),
    InputBackspace,
    InputSubmit,
    Keys(KeysAction),
    Faults(FaultsAction),
    Activity(ActivityAction),
    Tick {
        local_ms: u64,
    },
}

/// Which key table the keyboard speaks to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Normal,
    Help,
    Confirm,
    Input,
}

use Action as A;
use KeyCode as K;

/// The keys that work in every view.
#[rustfmt::skip] // a table: one binding a line
pub const GLOBAL: &[Binding<Action>] = &[
    bind(&[K::Char('1')], A::ShowView(View::Keys), "1 2 3 Tab", "keys, faults, activity"),
    also(&[K::Char('2')], A::ShowView(View::Faults)),
    also(&[K::Char('3')], A::ShowView(View::Activity)),
    also(&[K::Tab], A::NextView),
    also(&[K::BackTab], A::PrevView),
    bind(&[K::Char('?')], A::ToggleHelp, "?", "this help"),
    bind(&[K::Char('q')], A::Quit, "q  Ctrl-C", "quit"),
];

/// The help overlay: every table, as written.
pub fn help() -> [Section; 4] {
    [
        Section {
            title: "Everywhere",
            lines: help_lines(GLOBAL),
        },
        Section {
            title: "Keys",
            lines: help_lines(keys::BINDINGS),
        },
        Section {
            title: "Faults",
            lines: help_lines(faults::BINDINGS),
        },
        Section {
            title: "Activity",
            lines: help_lines(activity::BINDINGS),
        },
    ]
}

/// Maps a key press to an action, given what is on screen.
pub fn from_key(mode: Mode, view: View, key: KeyEvent) -> Option<Action> {
    if key.kind == KeyEventKind::Release {
        return None;
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl && matches!(key.code, K::Char('c' | 'q')) {
        return Some(A::Quit);
    }
    match mode {
        Mode::Input => Some(match key.code {
            K::Enter => A::InputSubmit,
            K::Esc => A::Cancel,
            K::Backspace => A::InputBackspace,
            K::Char(c) if !ctrl => A::InputChar(c),
            _ => return None,
        }),
        Mode::Confirm => match key.code {
            K::Char('y' | 'Y') | K::Enter => Some(A::Confirm),
            K::Char('n' | 'N' | 'q') | K::Esc => Some(A::Cancel),
            _ => None,
        },
        Mode::Help => match key.code {
            K::Char('?') | K::Esc => Some(A::ToggleHelp),
            K::Char('q') => Some(A::Quit),
            _ => None,
        },
        Mode::Normal => lookup(GLOBAL, key.code).or_else(|| match view {
            View::Keys => lookup(keys::BINDINGS, key.code).map(A::Keys),
            View::Faults => lookup(faults::BINDINGS, key.code).map(A::Faults),
            View::Activity => lookup(activity::BINDINGS, key.code).map(A::Activity),
        }),
    }
}
