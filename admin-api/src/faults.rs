//! `/v1/faults`: the rule of every store operation.

use crate::{FaultRule, Op};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// `GET /v1/faults`, and the answer to `PUT /v1/faults`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Faults {
    pub faults: FaultSet,
    /// Store operations the rules have made fail, wait or lose their reply.
    #[serde(default)]
    pub injected: u64,
}

/// The rule of every operation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FaultSet {
    pub get: FaultRule,
    pub insert: FaultRule,
    pub replace: FaultRule,
    pub delete: FaultRule,
}

impl FaultSet {
    pub fn rule(&self, op: Op) -> &FaultRule {
        match op {
            Op::Get => &self.get,
            Op::Insert => &self.insert,
            Op::Replace => &self.replace,
            Op::Delete => &self.delete,
        }
    }

    pub fn rule_mut(&mut self, op: Op) -> &mut FaultRule {
        match op {
            Op::Get => &mut self.get,
            Op::Insert => &mut self.insert,
            Op::Replace => &mut self.replace,
            Op::Delete => &mut self.delete,
        }
    }
}

/// `PUT /v1/faults`: new rules for some operations; the others keep theirs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SetFaults {
    pub faults: BTreeMap<Op, FaultRule>,
}

impl SetFaults {
    /// One operation's rule.
    pub fn one(op: Op, rule: FaultRule) -> SetFaults {
        SetFaults {
            faults: BTreeMap::from([(op, rule)]),
        }
    }

    /// Decodes a request body, or says what is wrong with it, naming the
    /// operation (`faults.insert: …`). The rules are not validated yet.
    pub fn from_json(body: &[u8]) -> Result<SetFaults, String> {
        let value: Value =
            serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
        let Some(faults) = value.get("faults").and_then(Value::as_object) else {
            return Err("the body must be {\"faults\":{\"insert\":RULE,...}}".into());
        };
        let mut set = SetFaults::default();
        for (name, rule) in faults {
            let op: Op = name.parse().map_err(|e| format!("faults.{name}: {e}"))?;
            let rule = serde_json::from_value::<FaultRule>(rule.clone())
                .map_err(|e| format!("faults.{name}: {e}"))?;
            set.faults.insert(op, rule);
        }
        Ok(set)
    }

    /// Whether every rule is one the gateway accepts ([`FaultRule::validate`]),
    /// or the `detail` of its 400 answer, naming the first bad operation.
    pub fn validate(&self) -> Result<(), String> {
        for (op, rule) in &self.faults {
            rule.validate().map_err(|e| {
                format!(
                    "faults.{op}: {}; probability is 0 to 1 and latency_ms at most {}",
                    e.0,
                    crate::MAX_LATENCY_MS
                )
            })?;
        }
        Ok(())
    }
}
