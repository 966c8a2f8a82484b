//! Faults the store injects into its own primitives, for the conformance
//! scenarios' `fault` steps (`conformance/README.md`): set through the
//! example's `testing` interface, never by the guard. One rule per
//! primitive, as the Rust host's `FaultHandle` keeps them.
//!
//! ```
//! use idem_store_component::faults::{FaultKind, Faults, Hit, Primitive};
//!
//! let mut faults = Faults::default();
//! faults.set(Primitive::Replace, FaultKind::Lost, "", Some(1));
//! assert!(matches!(faults.hit(Primitive::Replace), Some(Hit::Lost(_))));
//! assert_eq!(faults.hit(Primitive::Replace), None, "the one count is spent");
//! ```

use alloc::format;
use alloc::string::String;

/// The store's primitives (`idem:guard/store`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Primitive {
    Get,
    Insert,
    Replace,
    Delete,
}

impl Primitive {
    pub fn name(self) -> &'static str {
        match self {
            Primitive::Get => "get",
            Primitive::Insert => "insert",
            Primitive::Replace => "replace",
            Primitive::Delete => "delete",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// Fail without applying.
    Error,
    /// Apply, then fail: a reply lost on its way back.
    Lost,
}

/// What a call hit: the `unavailable` text it fails with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hit {
    /// Fail before applying.
    Error(String),
    /// Apply, then fail.
    Lost(String),
}

#[derive(Clone, Debug)]
struct Rule {
    kind: FaultKind,
    message: String,
    /// Calls left to fail; `None`: every call.
    left: Option<u32>,
}

/// The rule in force for each primitive.
#[derive(Clone, Debug)]
pub struct Faults {
    rules: [Option<Rule>; 4],
}

impl Faults {
    /// No faults.
    pub const fn new() -> Self {
        Faults {
            rules: [const { None }; 4],
        }
    }

    /// `primitive` fails as `kind` says: every call, or only the next
    /// `count` (0: no fault). An empty `message` reads "injected fault".
    pub fn set(
        &mut self,
        primitive: Primitive,
        kind: FaultKind,
        message: &str,
        count: Option<u32>,
    ) {
        let message = if message.is_empty() {
            "injected fault"
        } else {
            message
        };
        self.rules[primitive as usize] = match count {
            Some(0) => None,
            left => Some(Rule {
                kind,
                message: message.into(),
                left,
            }),
        };
    }

    pub fn clear(&mut self) {
        *self = Faults::new();
    }

    /// Whether this call of `primitive` fails, spending one of its count.
    /// The texts name the primitive as the Rust host's faults do.
    pub fn hit(&mut self, primitive: Primitive) -> Option<Hit> {
        let slot = &mut self.rules[primitive as usize];
        let rule = slot.as_mut()?;
        let name = primitive.name();
        let hit = match rule.kind {
            FaultKind::Error => Hit::Error(format!("{} (injected on {name})", rule.message)),
            FaultKind::Lost => Hit::Lost(format!(
                "reply to {name} lost (injected; the operation was applied)"
            )),
        };
        if let Some(left) = rule.left.as_mut() {
            *left -= 1;
            if *left == 0 {
                *slot = None;
            }
        }
        Some(hit)
    }
}

impl Default for Faults {
    fn default() -> Self {
        Faults::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_names_its_message_and_primitive_until_cleared() {
        let mut faults = Faults::default();
        faults.set(Primitive::Insert, FaultKind::Error, "store timeout", None);
        for _ in 0..3 {
            assert_eq!(
                faults.hit(Primitive::Insert),
                Some(Hit::Error("store timeout (injected on insert)".into()))
            );
        }
        assert_eq!(faults.hit(Primitive::Get), None, "only insert");
        faults.clear();
        assert_eq!(faults.hit(Primitive::Insert), None);
    }

    #[test]
    fn a_count_limits_the_fault_to_the_next_calls() {
        let mut faults = Faults::default();
        faults.set(Primitive::Get, FaultKind::Error, "", Some(2));
        assert_eq!(
            faults.hit(Primitive::Get),
            Some(Hit::Error("injected fault (injected on get)".into()))
        );
        assert!(faults.hit(Primitive::Get).is_some());
        assert_eq!(faults.hit(Primitive::Get), None);
        faults.set(Primitive::Get, FaultKind::Lost, "", Some(0));
        assert_eq!(faults.hit(Primitive::Get), None, "a count of 0 is no fault");
    }

    #[test]
    fn a_new_rule_replaces_the_primitives_old_one() {
        let mut faults = Faults::default();
        faults.set(Primitive::Delete, FaultKind::Error, "x", None);
        faults.set(Primitive::Delete, FaultKind::Lost, "", Some(1));
        assert!(
            matches!(faults.hit(Primitive::Delete), Some(Hit::Lost(m)) if m.contains("delete"))
        );
        assert_eq!(faults.hit(Primitive::Delete), None);
    }
}
