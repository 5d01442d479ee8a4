//! When a connection has waited long enough: for Data-Out that R2Ts
//! asked for ([`Awaited`]), and for a sign of life from the initiator
//! ([`Liveness`], NOP-In pings as RFC 7143 11.19 has them). No clock is
//! read here: the caller passes the time in and sleeps until the instant
//! handed back, so each decision is tested without waiting.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The target's timers, as `braid serve` sets them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timers {
    /// How long a WRITE may wait for the next Data-Out its R2T asked for
    /// before the connection is dropped (ERL 0 has no recovery to offer)
    /// and its tasks with it.
    pub data_out: Duration,
    /// Silence from the initiator after which the target pings it
    /// (NOP-In asking for a NOP-Out); `None`: never.
    pub nop_in_interval: Option<Duration>,
    /// How long a ping may go unanswered before the connection is taken
    /// for dead and dropped, its session with it.
    pub nop_in_timeout: Duration,
}

impl Default for Timers {
    /// As Linux's own target: a ping after 15 s of silence, dead 15 s
    /// later; a few seconds for Data-Out.
    fn default() -> Self {
        Self {
            data_out: Duration::from_secs(5),
            nop_in_interval: Some(Duration::from_secs(15)),
            nop_in_timeout: Duration::from_secs(15),
        }
    }
}

/// WRITEs owed Data-Out, each with when it last heard of its data (the
/// R2T that asked, or the last Data-Out).
#[derive(Debug)]
pub(crate) struct Awaited {
    timeout: Duration,
    since: HashMap<u32, Instant>,
}

impl Awaited {
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            since: HashMap::new(),
        }
    }

    /// Task `itt` is owed data from `now` on (asked for, or some came).
    pub fn wait(&mut self, itt: u32, now: Instant) {
        self.since.insert(itt, now);
    }

    /// Task `itt` is owed nothing any more.
    pub fn forget(&mut self, itt: u32) {
        self.since.remove(&itt);
    }

    /// When the first wait runs out, if any is running.
    pub fn next(&self) -> Option<Instant> {
        self.since.values().min().map(|t| *t + self.timeout)
    }

    /// A task whose data is overdue at `now`, and how long it waited.
    pub fn overdue(&self, now: Instant) -> Option<(u32, Duration)> {
        self.since
            .iter()
            .map(|(itt, t)| (*itt, now.saturating_duration_since(*t)))
            .find(|(_, waited)| *waited >= self.timeout)
    }
}

/// What the connection is to do about the initiator's silence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tick {
    /// Nothing yet.
    Wait,
    /// Send a ping with this Target Transfer Tag.
    Ping(u32),
    /// A ping went unanswered for the timeout: the initiator is gone.
    Dead(Duration),
}

/// Pings an initiator that has gone quiet, and says when it is dead.
/// Any PDU from it is a sign of life: one that sends commands or answers
/// is there, whether or not it has read the ping yet.
#[derive(Debug)]
pub(crate) struct Liveness {
    every: Option<Duration>,
    timeout: Duration,
    heard: Instant,
    /// The ping unanswered: its tag and when it was sent.
    pinged: Option<(u32, Instant)>,
    tag: u32,
}

impl Liveness {
    pub fn new(timers: &Timers, now: Instant) -> Self {
        Self {
            every: timers.nop_in_interval,
            timeout: timers.nop_in_timeout,
            heard: now,
            pinged: None,
            tag: 0,
        }
    }

    /// A PDU came from the initiator at `now`.
    pub fn heard(&mut self, now: Instant) {
        self.heard = now;
        self.pinged = None;
    }

    /// When to [`Self::tick`] next; `None`: never (no pings).
    pub fn next(&self) -> Option<Instant> {
        let every = self.every?;
        Some(match self.pinged {
            Some((_, at)) => at + self.timeout,
            None => self.heard + every,
        })
    }

    /// What is due at `now`.
    pub fn tick(&mut self, now: Instant) -> Tick {
        let Some(every) = self.every else {
            return Tick::Wait;
        };
        match self.pinged {
            Some((_, at)) if now.saturating_duration_since(at) >= self.timeout => {
                Tick::Dead(now.saturating_duration_since(self.heard))
            }
            Some(_) => Tick::Wait,
            None if now.saturating_duration_since(self.heard) >= every => {
                // Any tag but the reserved 0xffffffff, which would ask for
                // no answer (RFC 7143 11.19.2).
                self.tag = self.tag.wrapping_add(1) % 0xffff_ffff;
                self.pinged = Some((self.tag, now));
                Tick::Ping(self.tag)
            }
            None => Tick::Wait,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_write_is_overdue_once_its_data_stops_for_the_timeout() {
        let t0 = Instant::now();
        let mut a = Awaited::new(5 * S);
        assert_eq!(a.next(), None, "nothing owed, nothing to wait for");
        a.wait(7, t0);
        a.wait(8, t0 + 2 * S);
        assert_eq!(a.next(), Some(t0 + 5 * S));
        assert_eq!(a.overdue(t0 + 4 * S), None);
        assert_eq!(a.overdue(t0 + 5 * S), Some((7, 5 * S)));
        a.wait(7, t0 + 4 * S);
        assert_eq!(a.overdue(t0 + 5 * S), None, "data came: it waits anew");
        assert_eq!(a.next(), Some(t0 + 7 * S));
        a.forget(8);
        a.forget(7);
        assert_eq!(a.next(), None);
    }

    #[test]
    fn a_quiet_initiator_is_pinged_then_dead_unless_it_answers() {
        let t0 = Instant::now();
        let timers = Timers {
            nop_in_interval: Some(15 * S),
            nop_in_timeout: 15 * S,
            ..Timers::default()
        };
        let mut l = Liveness::new(&timers, t0);
        assert_eq!(l.next(), Some(t0 + 15 * S));
        assert_eq!(l.tick(t0 + 14 * S), Tick::Wait);
        let Tick::Ping(tag) = l.tick(t0 + 15 * S) else {
            panic!("no ping after 15 s of silence");
        };
        assert_ne!(tag, 0xffff_ffff, "a ping that asks for an answer");
        assert_eq!(l.next(), Some(t0 + 30 * S));
        assert_eq!(l.tick(t0 + 29 * S), Tick::Wait, "one ping at a time");
        assert_eq!(l.tick(t0 + 30 * S), Tick::Dead(30 * S));

        let mut l = Liveness::new(&timers, t0);
        assert!(matches!(l.tick(t0 + 15 * S), Tick::Ping(_)));
        l.heard(t0 + 20 * S);
        assert_eq!(l.tick(t0 + 31 * S), Tick::Wait, "it answered: alive");
        assert_eq!(l.next(), Some(t0 + 35 * S), "pinged again after silence");
    }

    #[test]
    fn without_an_interval_nobody_is_pinged() {
        let t0 = Instant::now();
        let timers = Timers {
            nop_in_interval: None,
            ..Timers::default()
        };
        let mut l = Liveness::new(&timers, t0);
        assert_eq!(l.next(), None);
        assert_eq!(l.tick(t0 + 3600 * S), Tick::Wait);
    }
}
