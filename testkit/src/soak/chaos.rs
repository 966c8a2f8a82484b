//! The chaos: store faults switched on and off through the admin API,
//! latency spikes near the lease, gateways killed and paused.

use super::clients::bump;
use super::gateways::{Gateway, Process, signal};
use super::{SPIKE_PERCENT, Soak, lock};
use anyhow::{Context, bail};
use idem::store::{FaultKind, FaultRule, Op};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

/// The faults the soak has switched on at one gateway.
#[derive(Default)]
pub(super) struct FaultState {
    /// Operation → whether the fault on it [`disrupts`].
    pub(super) on: BTreeMap<Op, bool>,
    /// Bumped whenever a fault that [`disrupts`] goes on.
    pub(super) generation: u64,
}

impl FaultState {
    pub(super) fn disruptive(&self) -> bool {
        self.on.values().any(|&disrupts| disrupts)
    }
}

/// Faults that can keep a claim or a response from being recorded: those
/// that fail an operation or lose its reply, and a latency spike on
/// `replace`, which can hold a completion or a renewal past the lease. A
/// spike on `insert` is not one: a claim, however slow, must never let two
/// runs of one key happen.
fn disrupts(rule: &FaultRule, op: Op, lease: Duration) -> bool {
    match rule.kind {
        FaultKind::Error | FaultKind::Timeout | FaultKind::Lost => true,
        FaultKind::Delay => op == Op::Replace && is_spike(rule, lease),
        FaultKind::Off => false,
    }
}

/// A state a gateway goes in and out of (a pause), as requests see it:
/// whether it holds, and how many times it has begun.
#[derive(Clone, Copy, Default)]
pub(super) struct Spell {
    pub(super) holds: bool,
    pub(super) begun: u64,
}

impl Spell {
    pub(super) fn begin(&mut self) {
        self.holds = true;
        self.begun += 1;
    }

    /// Whether it held at any time between `mark` (taken as a request
    /// started) and now.
    pub(super) fn since(self, mark: Spell) -> bool {
        mark.holds || self.holds || self.begun != mark.begun
    }
}

impl Soak {
    /// Switches one fault at one gateway on or off.
    pub(super) async fn toggle_fault(&self, rng: &mut fastrand::Rng) {
        let gateway = &self.gateways[rng.usize(..self.gateways.len())];
        // Weighted toward insert and replace, the operations the guard uses.
        let op = [
            Op::Insert,
            Op::Insert,
            Op::Replace,
            Op::Replace,
            Op::Get,
            Op::Delete,
        ][rng.usize(..6)];
        let is_on = lock(&gateway.faults).on.contains_key(&op);
        let rule = if is_on && rng.f64() < 0.6 {
            FaultRule::default()
        } else {
            random_rule(rng, op, self.lease)
        };
        let turning_on = rule.kind != FaultKind::Off;
        let disrupts = disrupts(&rule, op, self.lease);
        if turning_on {
            // Marked before the rule can take effect, so no request misses it.
            let mut faults = lock(&gateway.faults);
            faults.on.insert(op, disrupts);
            if disrupts {
                faults.generation += 1;
            }
        }
        let body = json!({"faults": {op.as_str(): rule}});
        let applied = matches!(
            self.admin_json(gateway, "PUT", "/v1/faults", Some(&body))
                .await,
            Ok((200, _))
        );
        if applied {
            if turning_on {
                bump(&self.tally.faults_on);
                if rule.kind == FaultKind::Delay && is_spike(&rule, self.lease) {
                    bump(&self.tally.spikes_on);
                }
            } else {
                // Unmarked only once the rule is off.
                lock(&gateway.faults).on.remove(&op);
                bump(&self.tally.faults_off);
            }
        }
    }

    /// Switches every fault off at every gateway (retrying while one restarts).
    pub(super) async fn faults_off(&self) -> anyhow::Result<()> {
        let off: serde_json::Map<String, Value> = Op::ALL
            .into_iter()
            .map(|op| (op.as_str().to_owned(), json!(FaultRule::default())))
            .collect();
        let body = json!({ "faults": off });
        for gateway in &self.gateways {
            let mut tries = 0;
            while !matches!(
                self.admin_json(gateway, "PUT", "/v1/faults", Some(&body))
                    .await,
                Ok((200, _))
            ) {
                tries += 1;
                if tries == 50 {
                    bail!(
                        "gateway {}: its faults could not be switched off",
                        gateway.index
                    );
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            lock(&gateway.faults).on.clear();
        }
        Ok(())
    }

    /// `kill -9` one gateway, then start it again on the same ports.
    pub(super) async fn crash(
        &self,
        gateway: &Gateway,
        started: Instant,
        down: Duration,
    ) -> anyhow::Result<()> {
        // Its counters die with it: read them first.
        let totals = self.totals(gateway).await;
        lock(&gateway.earlier).add(&totals);
        let before = gateway.orders_in_flight();
        let process = lock(&gateway.process).take();
        let pid = process.map(Process::kill);
        let after = gateway.orders_in_flight();
        let hit: HashSet<usize> = before.into_iter().chain(after).collect();
        let orders = hit.len();
        lock(&self.killed_in_flight).extend(hit);
        bump(&self.tally.kills);
        println!(
            "{:>6.1}s kill -9 gateway {} (pid {}), requests of {orders} orders in flight at it",
            started.elapsed().as_secs_f64(),
            gateway.index,
            pid.unwrap_or_default(),
        );
        tokio::time::sleep(down).await;
        let restarting = Instant::now();
        gateway.start()?;
        self.wait_ready(&format!("http://{}/v1/stats", gateway.admin))
            .await
            .with_context(|| format!("gateway {} did not come back", gateway.index))?;
        println!(
            "{:>6.1}s gateway {} restarted on {} after {:.1}s down ({:.1}s to start)",
            started.elapsed().as_secs_f64(),
            gateway.index,
            gateway.proxy,
            (down + restarting.elapsed()).as_secs_f64(),
            restarting.elapsed().as_secs_f64(),
        );
        Ok(())
    }

    /// `kill -STOP` one gateway for `paused` (longer than its lease, so its
    /// claims lapse and are taken over at the other gateway), then `kill
    /// -CONT`: its requests then go on as zombies, under claims they lost.
    /// Steps `gateway`'s wall clock by `by_s` seconds, at once, while it runs.
    pub(super) fn step(
        &self,
        gateway: &Gateway,
        started: Instant,
        by_s: i64,
    ) -> anyhow::Result<()> {
        let Some(clock) = &gateway.clock else {
            return Ok(());
        };
        let offset = clock.step(by_s)?;
        bump(&self.tally.clock_steps);
        println!(
            "{:>6.1}s gateway {}'s wall clock steps {by_s:+} s (now {offset:+} s off the real one)",
            started.elapsed().as_secs_f64(),
            gateway.index,
        );
        Ok(())
    }

    pub(super) async fn pause(
        &self,
        gateway: &Gateway,
        started: Instant,
        paused: Duration,
    ) -> anyhow::Result<()> {
        let pid = gateway
            .pid()
            .with_context(|| format!("gateway {} is not running", gateway.index))?;
        // Marked before the signal, so no request misses it.
        lock(&gateway.paused).begin();
        let stopped = signal(pid, "STOP").await;
        let orders = gateway.orders_in_flight().len();
        println!(
            "{:>6.1}s kill -STOP gateway {} (pid {pid}) for {:.1}s, past its {:.1}s lease; requests of {orders} orders in flight at it",
            started.elapsed().as_secs_f64(),
            gateway.index,
            paused.as_secs_f64(),
            self.lease.as_secs_f64(),
        );
        if stopped.is_ok() {
            tokio::time::sleep(paused).await;
        }
        let continued = signal(pid, "CONT").await;
        lock(&gateway.paused).holds = false;
        stopped.and(continued)?;
        bump(&self.tally.pauses);
        println!(
            "{:>6.1}s kill -CONT gateway {}",
            started.elapsed().as_secs_f64(),
            gateway.index
        );
        Ok(())
    }
}

/// A fault to switch on: an error, added latency, a timeout or a lost reply,
/// on some of the calls; on `insert` and `replace`, one time in three, a
/// latency spike of 40–90 % of the lease instead (the slow claim of issue 16:
/// a lease stamped before a slow `insert` has little left when the upstream
/// is called). Other latencies stay far below the lease.
fn random_rule(rng: &mut fastrand::Rng, op: Op, lease: Duration) -> FaultRule {
    let probability = f64::from(rng.u32(5..=50)) / 100.0;
    if matches!(op, Op::Insert | Op::Replace) && rng.u32(0..3) == 0 {
        let latency = share_of(lease, rng.u32(SPIKE_PERCENT));
        return FaultRule::delay(latency).with_probability(probability);
    }
    match rng.u32(0..4) {
        0 => FaultRule::error("injected by idem soak").with_probability(probability),
        1 => FaultRule::timeout(Duration::from_millis(rng.u64(20..=200)))
            .with_probability(probability),
        2 => FaultRule::delay(Duration::from_millis(rng.u64(5..=100)))
            .with_probability((probability * 2.0).min(1.0)),
        _ => FaultRule::lost().with_probability(probability.min(0.3)),
    }
}

/// Whether a delay is one of [`random_rule`]'s latency spikes.
fn is_spike(rule: &FaultRule, lease: Duration) -> bool {
    Duration::from_millis(rule.latency_ms) >= share_of(lease, *SPIKE_PERCENT.start())
}

/// `percent` % of `lease`, to the millisecond below.
pub(super) fn share_of(lease: Duration, percent: u32) -> Duration {
    let ms = lease.as_millis() * u128::from(percent) / 100;
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// What happens to a gateway mid-run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Upset {
    /// `kill -9`, then a restart on the same ports.
    Kill,
    /// `kill -STOP` past the lease, then `kill -CONT`.
    Pause,
    /// Its wall clock steps an hour, forward or back, and stays there.
    Step { forward: bool },
}

/// When (orders done) each upset comes and to which gateway, the last
/// first: `[kills, pauses, steps]` of them. Kills at even steps through the
/// orders, pauses halfway between steps of their own, clock steps at three
/// eighths of steps of their own (forward first, then back, and so on),
/// each alternating gateways. One runs at a time; the clients go on
/// throughout.
pub(super) fn upsets(
    [kills, pauses, steps]: [usize; 3],
    orders: usize,
    seed: u64,
) -> Vec<(u64, Upset, usize)> {
    let kill_at = (1..=kills).map(|k| {
        let at = (orders * k / (kills + 1)) as u64;
        (at, Upset::Kill, (k + usize::from(seed % 2 == 1)) % 2)
    });
    let pause_at = (1..=pauses).map(|k| {
        let at = (orders * (2 * k - 1) / (2 * pauses)) as u64;
        (
            at,
            Upset::Pause,
            (k + usize::from(seed.is_multiple_of(2))) % 2,
        )
    });
    let step_at = (1..=steps).map(|k| {
        let at = (orders * (8 * k - 5) / (8 * steps)) as u64;
        (
            at,
            Upset::Step {
                forward: k % 2 == 1,
            },
            k % 2,
        )
    });
    let mut all: Vec<_> = kill_at.chain(pause_at).chain(step_at).collect();
    all.sort_by_key(|&(at, upset, _)| std::cmp::Reverse((at, upset != Upset::Kill)));
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upsets_alternate_gateways_and_come_in_order() {
        let mut upsets = upsets([2, 2, 2], 1200, 7);
        upsets.reverse();
        assert_eq!(
            upsets,
            [
                (225, Upset::Step { forward: true }, 1),
                (300, Upset::Pause, 1),
                (400, Upset::Kill, 0),
                (800, Upset::Kill, 1),
                (825, Upset::Step { forward: false }, 0),
                (900, Upset::Pause, 0),
            ]
        );
    }
}
