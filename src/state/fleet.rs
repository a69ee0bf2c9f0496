//! A fleet's routing state shared by every gateway in front of it: an endpoint one gateway
//! ejects (after its failures, or when a probe cannot reach it) or sees rate-limited (a
//! 429's `Retry-After`) is out for every gateway within [`SYNC_EVERY`], instead of each
//! rediscovering a dead replica with its own failed requests.
//!
//! Each gateway, every [`SYNC_EVERY`], sends what it sees of each endpoint (until when it
//! is out, as wall-clock time) and learns in the same call (`fleet.lua`) the latest any
//! gateway has sent: one call per fleet of two or more endpoints, off the requests' path. A gateway adopts an ejection as its own (within its rule that at
//! most half a fleet is out), so the replica comes back as if it had ejected it: after
//! the cool-down, on a growing share. Prefix affinity needs nothing shared: it is
//! rendezvous hashing over the endpoints' names ([`crate::engine::upstream::fleet`]), so
//! every gateway that sees the same endpoints in the same states sends a prefix to the
//! same one.

use std::sync::{Arc, LazyLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::SharedState;
use crate::engine::upstream::fleet::{Fleet, OutUntil};

/// How often a gateway sends and learns its fleets' state.
pub const SYNC_EVERY: Duration = Duration::from_millis(500);

static SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("fleet.lua")));

/// The script, for the watcher to load ahead of the calls.
pub(super) fn script() -> &'static redis::Script {
    &SCRIPT
}

/// `at` as Unix milliseconds (0 for none, or one passed).
fn unix_ms(at: Option<Instant>, now: Instant, wall: SystemTime) -> u64 {
    let Some(at) = at.filter(|&at| at > now) else {
        return 0;
    };
    let when = wall + (at - now);
    u64::try_from(
        when.duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(0)
}

/// Unix milliseconds as an instant of this process (None for 0 or one passed).
fn instant(ms: u64, now: Instant, wall: SystemTime) -> Option<Instant> {
    let when = UNIX_EPOCH + Duration::from_millis(ms);
    when.duration_since(wall)
        .ok()
        .filter(|d| !d.is_zero())
        .map(|d| now + d)
}

/// Shares `fleet`'s state (model `model`) through `state` while the fleet lives.
pub async fn run(fleet: Weak<Fleet>, model: String, state: Arc<SharedState>) {
    let key = format!("{}:fleet:{{{model}}}", state.key_prefix());
    let mut every = tokio::time::interval(SYNC_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(fleet) = fleet.upgrade() else { return };
        let (now, wall) = (Instant::now(), SystemTime::now());
        let endpoints = fleet.endpoints();
        // One replica is tried whatever its state: there is nothing to route around.
        if endpoints.len() < 2 {
            continue;
        }
        let mut invocation = SCRIPT.prepare_invoke();
        invocation.key(&key);
        for endpoint in &endpoints {
            let out = endpoint.out_until(now);
            invocation
                .arg(&endpoint.label)
                .arg(unix_ms(out.ejected, now, wall))
                .arg(unix_ms(out.limited, now, wall));
        }
        let learned: Result<Vec<(u64, u64)>, _> = state
            .call(Duration::from_secs(1), |mut connection| {
                let invocation = &invocation;
                async move { invocation.invoke_async(&mut connection).await }
            })
            .await;
        // Without Redis each gateway goes on with what it sees itself.
        let Ok(learned) = learned else { continue };
        // Read back with the same pair of clocks it was written with: a later `now`
        // would move every deadline later by the call's time, and each gateway would
        // publish that back.
        for (endpoint, (ejected, limited)) in endpoints.iter().zip(learned) {
            let seen = OutUntil {
                ejected: instant(ejected, now, wall),
                limited: instant(limited, now, wall),
            };
            fleet.adopt(endpoint, seen, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_cross_as_wall_clock_time() {
        let (now, wall) = (Instant::now(), SystemTime::now());
        let later = now + Duration::from_secs(7);
        let ms = unix_ms(Some(later), now, wall);
        let back = instant(ms, now, wall).expect("still ahead");
        assert!(
            back.duration_since(now).abs_diff(Duration::from_secs(7)) < Duration::from_millis(2)
        );
        assert_eq!(unix_ms(Some(now), now, wall), 0, "passed");
        assert_eq!(unix_ms(None, now, wall), 0);
        assert_eq!(instant(0, now, wall), None);
    }
}
