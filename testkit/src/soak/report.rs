//! The figures printed at the end of a soak; the CI test reads the
//! `soak:` line.

use super::check::{OrderLog, Report, Reuse};
use super::clients::{Tally, get};
use super::gateways::Totals;
use super::slow::{SlowTally, UNGUARDED_SLOTS};
use super::{MAX_TRIES, SPIKE_PERCENT};
use idem::testing::Books;
use std::time::Duration;

pub(super) struct Figures<'a> {
    pub(super) tally: &'a Tally,
    pub(super) slow: &'a SlowTally,
    pub(super) slow_clients: usize,
    pub(super) totals: &'a Totals,
    pub(super) injected_by_gateway: &'a [u64],
    pub(super) books: &'a Books,
    pub(super) report: &'a Report,
    pub(super) orders_planned: usize,
    pub(super) kills_planned: usize,
    pub(super) pauses_planned: usize,
    pub(super) steps_planned: usize,
    pub(super) skew: Duration,
    pub(super) lease: Duration,
    pub(super) orders: &'a [OrderLog],
    pub(super) elapsed: Duration,
}

#[allow(clippy::too_many_lines)] // one line of the report after another
pub(super) fn print_figures(f: &Figures) {
    let (t, r) = (f.tally, f.report);
    let answered_2xx = f.orders.iter().filter(|o| !o.bodies.is_empty()).count();
    let reused = f
        .orders
        .iter()
        .filter(|o| o.reuse != Reuse::NotSent)
        .count();
    let runs: u64 = f.books.executions.values().sum();
    let duplicates_prevented = get(&t.replayed) + get(&t.in_flight);
    let toggles = get(&t.faults_on) + get(&t.faults_off);
    let injected: u64 = f.injected_by_gateway.iter().sum();
    let conserved = !r.violations.iter().any(|v| v.starts_with("stock"));
    println!("figures after {:.1}s:", f.elapsed.as_secs_f64());
    println!(
        "  orders            {} of {} placed; {answered_2xx} answered 2xx; {reused} keys reused with another body",
        f.orders.len(),
        f.orders_planned
    );
    println!(
        "  requests          {} sent: 2xx executed {}, 2xx replayed {}, 409 in flight {}, 422 conflict {}, 503 store down {}, other 5xx {}, other {}; connection errors {}, client timeouts {}, gave up after {MAX_TRIES} tries {}",
        get(&t.sent),
        get(&t.executed),
        get(&t.replayed),
        get(&t.in_flight),
        get(&t.conflict),
        get(&t.unavailable),
        get(&t.upstream_failed),
        get(&t.other),
        get(&t.connection_errors),
        get(&t.timeouts),
        get(&t.gave_up),
    );
    let outcome = |name| f.totals.outcome(name);
    println!(
        "  gateways said     executed {}, replayed {}, in flight {}, conflict {}, unavailable {}, invalid {}",
        outcome("executed"),
        outcome("replayed"),
        outcome("in_flight"),
        outcome("conflict"),
        outcome("unavailable"),
        outcome("invalid"),
    );
    println!(
        "  faults            {toggles} toggles ({} on, {} off); {injected} store calls hit (by gateway: {:?})",
        get(&t.faults_on),
        get(&t.faults_off),
        f.injected_by_gateway
    );
    println!(
        "  crashes           {} of {} planned (kill -9 of a gateway mid-run, restarted on the same port)",
        get(&t.kills),
        f.kills_planned
    );
    let at_pause = f.orders.iter().filter(|o| o.at_pause).count();
    println!(
        "  pauses            {} of {} planned (kill -STOP of a gateway for 1.2–2 leases, then kill -CONT); {at_pause} orders had a request at a stopped gateway",
        get(&t.pauses),
        f.pauses_planned
    );
    println!(
        "  wall clocks       gateway 1 {} s ahead of gateway 0 throughout; {} of {} planned steps of an hour (libfaketime: the gateways' CLOCK_REALTIME only)",
        f.skew.as_secs(),
        get(&t.clock_steps),
        f.steps_planned
    );
    println!(
        "  latency spikes    {} switched on (a delay of {}–{} % of the {:.1}s lease on insert or replace, on some of the calls)",
        get(&t.spikes_on),
        SPIKE_PERCENT.start(),
        SPIKE_PERCENT.end(),
        f.lease.as_secs_f64()
    );
    let s = f.slow;
    println!(
        "  slow clients      {} keyless, {} requests: {} cut with 408, {} refused 503 ({UNGUARDED_SLOTS} unguarded slots a gateway; the gateways refused {}), {} other answers, {} unanswered (a gateway killed or stopped); keyed requests refused for want of a slot: {}",
        f.slow_clients,
        get(&s.sent),
        get(&s.cut),
        get(&s.shed),
        f.totals.unguarded_refused,
        get(&s.other),
        get(&s.broken),
        f.totals.guarded_refused,
    );
    println!(
        "  duplicates        {duplicates_prevented} prevented ({} replays + {} 409s); {} reused keys refused with 422",
        get(&t.replayed),
        get(&t.in_flight),
        get(&t.conflict),
    );
    println!(
        "  ledger            {} orders, {runs} handler runs, {} reservations, {} charges, stock {} ({})",
        f.books.executions.len(),
        f.books.reservations.len(),
        f.books.charges.len(),
        f.books.stock,
        if conserved {
            "conserved"
        } else {
            "NOT conserved"
        }
    );
    println!(
        "  re-executions     {} orders ran more than once: {} in flight at a kill, {} under a store fault, {} after a slow or failed upstream call, {} at a stopped gateway",
        r.reexecuted,
        r.reexecuted_at_kill,
        r.reexecuted_under_fault,
        r.reexecuted_slow,
        r.reexecuted_paused
    );
    println!(
        "                    (a claim whose holder was killed, or whose response a store fault kept from being recorded,\n                     is taken over after its lease and runs again under a new fence; the ledger absorbs the repeat)"
    );
    println!(
        "  stored responses  {} match the ledger; {} keys left claimed (response never recorded)",
        r.stored_matching, r.left_processing
    );
    println!(
        "  2xx bodies        {} checked against their key's kept response (first answers and replays alike); any other body is a violation",
        r.answers_checked
    );
    println!(
        "  overlapping runs  {} pairs of runs of one key overlapped in time; allowed only as a takeover under a higher fence whose earlier run's response was refused",
        r.overlapping_runs
    );
    println!("  violations        {}", r.violations.len());
    for violation in r.violations.iter().take(20) {
        println!("    {violation}");
    }
    if r.violations.len() > 20 {
        println!("    … and {} more", r.violations.len() - 20);
    }
    println!(
        "soak: orders={} requests={} crashes={} fault_toggles={toggles} faults_injected={injected} duplicates_prevented={duplicates_prevented} reexecuted={} violations={} pauses={} spikes={} answers_checked={} overlapping_runs={} slow_cut={} slow_shed={} guarded_refused={} clock_steps={} skew_s={}",
        f.orders.len(),
        get(&t.sent),
        get(&t.kills),
        r.reexecuted,
        r.violations.len(),
        get(&t.pauses),
        get(&t.spikes_on),
        r.answers_checked,
        r.overlapping_runs,
        get(&s.cut),
        get(&s.shed),
        f.totals.guarded_refused,
        get(&t.clock_steps),
        f.skew.as_secs(),
    );
}
