//! Key tables: which key does what, in one place per view. The same table
//! maps a key press to the view's action and writes the help overlay, so
//! the two cannot drift apart.

use crossterm::event::KeyCode;

/// One binding: the keys, the action they trigger, and the help line.
pub struct Binding<A: 'static> {
    pub codes: &'static [KeyCode],
    pub action: A,
    /// `(keys, what)` as the help overlay lists them; `None` for a binding
    /// that shares the line of the one before (↓ shares ↑'s "move").
    pub help: Option<(&'static str, &'static str)>,
}

/// A binding with its own help line.
pub const fn bind<A>(
    codes: &'static [KeyCode],
    action: A,
    keys: &'static str,
    what: &'static str,
) -> Binding<A> {
    Binding {
        codes,
        action,
        help: Some((keys, what)),
    }
}

/// A binding described by the help line of the one before it.
pub const fn also<A>(codes: &'static [KeyCode], action: A) -> Binding<A> {
    Binding {
        codes,
        action,
        help: None,
    }
}

/// The action `code` triggers in `table`, if any.
pub fn lookup<A: Copy>(table: &[Binding<A>], code: KeyCode) -> Option<A> {
    table
        .iter()
        .find(|b| b.codes.contains(&code))
        .map(|b| b.action)
}

/// The help lines of a table, in order.
pub fn help_lines<A>(table: &[Binding<A>]) -> Vec<(&'static str, &'static str)> {
    table.iter().filter_map(|b| b.help).collect()
}

/// One titled block of the help overlay.
pub struct Section {
    pub title: &'static str,
    pub lines: Vec<(&'static str, &'static str)>,
}
