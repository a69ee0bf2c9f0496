//! Time source for every measurement the gateway makes.
//!
//! Timing maths never calls `Instant::now()` directly: it asks a [`Clock`], so unit tests
//! drive it with a [`ManualClock`] and assert exact figures. The running server uses
//! [`MonotonicClock`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A monotonic time source. Readings are offsets from an arbitrary origin fixed when the
/// clock was made; only differences between readings of one clock are meaningful.
/// `Debug`, so what holds a clock can derive it.
pub trait Clock: std::fmt::Debug + Send + Sync + 'static {
    fn now(&self) -> Duration;

    /// The reading this clock had at `instant`: how moments the engine stamped itself
    /// (with `Instant::now()`, where it hands a token over) join the gateway's timeline.
    fn at(&self, instant: Instant) -> Duration;

    /// Wall-clock time now, for the timestamps of trace spans.
    fn system_time(&self) -> SystemTime;

    /// Wall-clock seconds since the Unix epoch, for the `created` field of responses.
    fn unix_seconds(&self) -> u64 {
        unix_seconds(self.system_time())
    }
}

/// `at` in seconds since the Unix epoch (0 before it): the `created` of responses and of
/// the served models (`ModelInfo::loaded_at`, stamped where no clock is held).
pub fn unix_seconds(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Shared handle to the clock, as held by application state.
pub type SharedClock = Arc<dyn Clock>;

/// Wall-clock monotonic time (`std::time::Instant`).
#[derive(Debug)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn at(&self, instant: Instant) -> Duration {
        instant.saturating_duration_since(self.origin)
    }

    fn system_time(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// A clock that only moves when told to; for tests.
#[derive(Debug, Default)]
pub struct ManualClock {
    nanos: AtomicU64,
}

impl ManualClock {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn advance(&self, by: Duration) {
        self.nanos.fetch_add(
            u64::try_from(by.as_nanos()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }

    /// A manual clock knows no real instants: a stamped moment reads as now.
    fn at(&self, _instant: Instant) -> Duration {
        self.now()
    }

    /// A fixed date (2026-01-01T00:00:00Z) plus the time advanced so far.
    fn system_time(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_767_225_600) + self.now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_advanced() {
        let clock = ManualClock::new();
        assert_eq!(clock.now(), Duration::ZERO);
        clock.advance(Duration::from_millis(15));
        clock.advance(Duration::from_millis(5));
        assert_eq!(clock.now(), Duration::from_millis(20));
    }

    #[test]
    fn monotonic_clock_never_goes_back() {
        let clock = MonotonicClock::new();
        let a = clock.now();
        let b = clock.now();
        assert!(b >= a);
    }

    #[test]
    fn an_earlier_instant_reads_earlier_on_the_monotonic_clock() {
        let clock = MonotonicClock::new();
        let stamped = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        let now = clock.now();
        let then = clock.at(stamped);
        assert!(
            then + Duration::from_millis(2) <= now,
            "{then:?} vs {now:?}"
        );
        let before_origin = stamped - Duration::from_secs(1);
        assert_eq!(clock.at(before_origin), Duration::ZERO);
    }
}
