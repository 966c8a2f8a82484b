//! What the gateway is doing: its faults, stats, live events and metrics.

#[allow(clippy::wildcard_imports)]
use super::*;

pub(super) fn faults(admin: &Admin) -> api::Faults {
    let faults = admin.gateway.faults();
    let rules = faults.rules();
    let mut set = api::FaultSet::default();
    for op in Op::ALL {
        *set.rule_mut(op) = rules.get(&op).cloned().unwrap_or_default();
    }
    api::Faults {
        faults: set,
        injected: faults.injected(),
    }
}

pub(super) async fn get_faults(State(admin): State<Admin>) -> Response {
    json(&faults(&admin))
}

pub(super) async fn put_faults(State(admin): State<Admin>, body: axum::body::Bytes) -> Response {
    let bad = |why: String| problem(StatusCode::BAD_REQUEST, why);
    let set = match api::SetFaults::from_json(&body) {
        Ok(set) => set,
        Err(why) => return bad(why),
    };
    // All or nothing: every rule is checked before any is set.
    if let Err(why) = set.validate() {
        return bad(why);
    }
    let changes = set.faults;
    let handle = admin.gateway.faults();
    let before = handle.rules();
    for (op, rule) in &changes {
        if let Err(e) = handle.set(*op, rule.clone()) {
            // Not reached (the rules were validated); restore the old ones anyway.
            for op in Op::ALL {
                let _ = handle.set(op, before.get(&op).cloned().unwrap_or_default());
            }
            return bad(format!("faults.{op}: {}", e.0));
        }
    }
    for (op, rule) in changes {
        admin.gateway.observer().fault_changed(op, rule);
    }
    json(&faults(&admin))
}

pub(super) async fn stats(State(admin): State<Admin>) -> Response {
    let observer = admin.gateway.observer();
    let guard = admin.gateway.guard();
    let pool = guard.pool_stats();
    let latency = observer.store_latency_us();
    let mut stats = api::Stats {
        uptime_ms: observer.uptime().as_millis() as u64,
        store: guard.store().name().to_owned(),
        store_latency_us: latency,
        pool: api::Pool {
            instantiated: pool.instantiated,
            failed: pool.failed,
            idle: pool.idle as u64,
            in_use: pool.in_use,
        },
        purge: guard.purge_stats(),
        clock: clock_stats(guard.clock().as_ref()),
        store_connection: admin.gateway.store_connection().snapshot(),
        slots: admin.gateway.gate().slots(),
        ..api::Stats::default()
    };
    for verdict in Verdict::ALL {
        *stats.outcomes.get_mut(verdict) = observer.count(verdict);
        *stats.rates_per_s.get_mut(verdict) = observer.rate(verdict);
    }
    json(&stats)
}

/// The clock's metrics: name, type, help, value.
#[allow(clippy::cast_precision_loss)] // milliseconds as seconds: exact to 2^53 ms
fn clock_metrics(clock: &api::Clock) -> [(&'static str, &'static str, &'static str, String); 3] {
    #[rustfmt::skip]
    let metrics = [
        ("idem_clock_known", "gauge", "1 once the guard's clock (the store's time authority) has been read, else 0: every guard call answers 503.", u8::from(clock.error_ms.is_some()).to_string()),
        ("idem_clock_error_seconds", "gauge", "The bound on the guard clock's error against the store's time authority.", clock.error_ms.map_or(f64::NAN, |ms| ms as f64 / 1e3).to_string()),
        ("idem_wall_clock_offset_seconds", "gauge", "How far this host's wall clock is ahead of the store's time authority (decisions never read it).", (clock.wall_offset_ms as f64 / 1e3).to_string()),
    ];
    metrics
}

fn clock_stats(clock: &dyn crate::clock::Clock) -> api::Clock {
    let known = clock.known();
    api::Clock {
        authority: clock.authority(),
        now_ms: clock.now_ms(),
        error_ms: known.as_ref().ok().copied(),
        unknown: known.err(),
        wall_offset_ms: crate::clock::wall_offset_ms(clock),
    }
}

pub(super) async fn events(State(admin): State<Admin>) -> Response {
    let observer = admin.gateway.observer();
    let limit = admin.gateway.gate().config().max_event_listeners;
    if observer.listeners() >= limit {
        let mut response = problem(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the live event stream has its limit of {limit} listeners (max-event-listeners); retry later"
            ),
        );
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return response;
    }
    let rx = observer.subscribe();
    let stream =
        futures_util::stream::unfold((rx, admin.stop.clone()), |(mut rx, mut stop)| async move {
            loop {
                tokio::select! {
                    received = rx.recv() => match received {
                        Ok(event) => return Some((Ok::<_, Infallible>(to_sse(&event)), (rx, stop))),
                        Err(broadcast::error::RecvError::Lagged(_)) => {}
                        Err(broadcast::error::RecvError::Closed) => return None,
                    },
                    () = crate::server::serve::stopped(&mut stop) => return None,
                }
            }
        });
    Sse::new(stream)
        .keep_alive(
            KeepAlive::new()
                .interval(Duration::from_secs(10))
                .text("keep-alive"),
        )
        .into_response()
}

pub(super) fn to_sse(event: &Event) -> SseEvent {
    SseEvent::default().event(event.name()).data(event.data())
}

pub(super) async fn metrics(State(admin): State<Admin>) -> Response {
    use std::fmt::Write as _;
    let observer = admin.gateway.observer();
    let pool = admin.gateway.guard().pool_stats();
    let latency = observer.store_latency_us();
    let mut text = String::new();
    // Every metric with its HELP and TYPE; durations in seconds, as
    // Prometheus names them (`_seconds`).
    let mut family = |name: &str, kind: &str, help: &str, samples: &[(String, String)]| {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(text, "{name}{labels} {value}");
        }
    };
    family(
        "idem_outcomes_total",
        "counter",
        "Guarded requests by what the gateway did.",
        &Verdict::ALL
            .iter()
            .map(|v| {
                (
                    format!("{{outcome=\"{}\"}}", v.as_str()),
                    observer.count(*v).to_string(),
                )
            })
            .collect::<Vec<_>>(),
    );
    #[allow(clippy::cast_precision_loss)] // microseconds as seconds: exact to 2^53 µs
    let seconds = |us: u64| format!("{}", us as f64 / 1e6);
    family(
        "idem_store_latency_seconds",
        "summary",
        "Latency of the latest store operations, in seconds (quantile 1 is the maximum).",
        &[
            ("0.5", latency.p50),
            ("0.9", latency.p90),
            ("0.99", latency.p99),
            ("1", latency.max),
        ]
        .map(|(q, us)| (format!("{{quantile=\"{q}\"}}"), seconds(us))),
    );
    let slots = admin.gateway.gate().slots();
    let by_class = |value: fn(&api::SlotUse) -> u64| {
        [("guarded", &slots.guarded), ("unguarded", &slots.unguarded)]
            .map(|(class, slot)| (format!("{{class=\"{class}\"}}"), value(slot).to_string()))
    };
    family(
        "idem_requests_in_progress",
        "gauge",
        "Requests holding a slot now, by class: guarded, or forwarded unguarded (no key, or a method not guarded).",
        &by_class(|s| s.in_use),
    );
    family(
        "idem_request_slots",
        "gauge",
        "Slots by class: --max-concurrent (guarded), --max-concurrent-unguarded.",
        &by_class(|s| s.limit),
    );
    family(
        "idem_requests_refused_total",
        "counter",
        "Requests answered 503 because every slot of their class was taken.",
        &by_class(|s| s.refused),
    );
    // The metrics of one sample each: name, type, help, value.
    let connection = admin.gateway.store_connection().snapshot();
    let connected = u8::from(connection.state == api::ConnectionState::Connected);
    let injected = admin.gateway.faults().injected();
    #[rustfmt::skip] // a table: one metric a line
    let mut single = vec![
        ("idem_faults_injected_total", "counter", "Store operations a fault rule made fail, delay or lose their reply.", injected.to_string()),
        ("idem_pool_instantiated_total", "counter", "Guard component instances created.", pool.instantiated.to_string()),
        ("idem_pool_failed_total", "counter", "Guard component instantiations that failed.", pool.failed.to_string()),
        ("idem_pool_idle", "gauge", "Guard component instances ready for a call.", pool.idle.to_string()),
        ("idem_pool_in_use", "gauge", "Guard component instances serving a call now.", pool.in_use.to_string()),
        ("idem_uptime_seconds", "gauge", "Seconds since the gateway started.", observer.uptime().as_secs().to_string()),
        ("idem_store_connected", "gauge", "1 once the store is open; 0 while the gateway is still trying to open it (guarded requests get 503).", connected.to_string()),
        ("idem_store_connect_attempts_total", "counter", "Attempts to open the store, the one that succeeded included.", connection.attempts.to_string()),
    ];
    single.extend(clock_metrics(&clock_stats(
        admin.gateway.guard().clock().as_ref(),
    )));
    // Only where the guard runs a purger: not with the purge off, nor on Redis, which expires keys itself.
    if let Some(purge) = admin.gateway.guard().purge_stats() {
        let took = Duration::from_micros(purge.last_took_us).as_secs_f64();
        #[rustfmt::skip]
        single.extend([
            ("idem_purge_runs_total", "counter", "Purge periods run (each frees every record expired by its start).", purge.runs.to_string()),
            ("idem_purged_records_total", "counter", "Expired records freed by the purge.", purge.purged.to_string()),
            ("idem_purge_errors_total", "counter", "Purge periods stopped by a store error or timeout.", purge.errors.to_string()),
            ("idem_purge_last_duration_seconds", "gauge", "How long the latest purge period took.", took.to_string()),
        ]);
    }
    for (name, kind, help, value) in single {
        family(name, kind, help, &[(String::new(), value)]);
    }
    let mut response = Response::new(Body::from(text));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}
