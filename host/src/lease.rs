//! The one rule that ties a lease to the store's timeout, checked where a
//! guard is built and where the gateway's configuration is read.

use std::time::Duration;

/// Whether renewals can keep a lease of `lease` alive on a store that may
/// take `store_timeout` to answer: [`Guard::run`](crate::Guard::run) renews
/// a third of the way into the lease, and a renewal must land before the
/// lease ends even when it takes the whole store timeout. So the lease must
/// be at least twice the store timeout. A shorter one could lapse while its
/// holder is alive and renewing, and a repeat would run the key a second time.
pub fn check_lease_renewable(
    lease: Duration,
    store_timeout: Duration,
) -> Result<(), LeaseTooShort> {
    if lease < store_timeout.saturating_mul(2) {
        return Err(LeaseTooShort {
            lease,
            store_timeout,
        });
    }
    Ok(())
}

/// A lease renewals cannot keep alive: shorter than twice the store's
/// timeout (see [`check_lease_renewable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "lease ({} ms) must be at least twice store-timeout ({} ms), i.e. at least {} ms: \
     a renewal starts a third into the lease and may take the whole store timeout, so a \
     shorter lease could lapse while its holder is alive; lengthen the lease or shorten \
     the store timeout",
    .lease.as_millis(),
    .store_timeout.as_millis(),
    .store_timeout.saturating_mul(2).as_millis()
)]
pub struct LeaseTooShort {
    pub lease: Duration,
    pub store_timeout: Duration,
}

impl LeaseTooShort {
    /// The shortest lease this store timeout allows.
    pub fn shortest(&self) -> Duration {
        self.store_timeout.saturating_mul(2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_twice_the_store_timeout_is_the_shortest_kept() {
        let ms = Duration::from_millis;
        assert!(check_lease_renewable(ms(10_000), ms(5_000)).is_ok());
        let err = check_lease_renewable(ms(9_999), ms(5_000)).unwrap_err();
        assert_eq!(err.shortest(), ms(10_000));
        assert!(err.to_string().contains("at least 10000 ms"), "{err}");
        assert!(check_lease_renewable(ms(2_000), ms(5_000)).is_err());
    }
}
