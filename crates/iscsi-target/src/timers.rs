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
    /// A ping went unanswered (and nothing was taken from the socket)
    /// for this long: the initiator is gone.
    Dead(Duration),
}

/// Whether the initiator takes what is sent to it: the writer has
/// nothing waiting, or has had something waiting and last got bytes into
/// the socket at this instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Taking {
    /// Nothing waits to be sent.
    All,
    /// Something waits; the socket last took bytes at this instant (or
    /// the wait began then).
    Since(Instant),
}

/// Pings an initiator that has gone quiet, or that has stopped reading,
/// and says when it is dead.
///
/// Life is shown both ways. A PDU from the initiator counts while it
/// also takes what is sent to it: one that sends commands but never reads
/// its socket holds READ data and queue room for good, so its talk is not
/// taken for life. Such an initiator is pinged once the socket has taken
/// nothing for the interval, and is dead if, by the timeout, it neither
/// answered nor took any more. One that reads slowly through a long
/// queue keeps the socket moving, and its ping waits for it.
#[derive(Debug)]
pub(crate) struct Liveness {
    every: Option<Duration>,
    timeout: Duration,
    heard: Instant,
    /// The ping unanswered: its tag and when it was sent (or when the
    /// initiator last took something after it).
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

    /// A PDU came from the initiator at `now`, while the writer stood as
    /// `taking` says.
    pub fn heard(&mut self, now: Instant, taking: Taking) {
        self.heard = now;
        if let Some((_, at)) = self.pinged {
            if reads_since(taking, at) {
                self.pinged = None;
            }
        }
    }

    /// When to [`Self::tick`] next; `None`: never (no pings).
    pub fn next(&self, taking: Taking) -> Option<Instant> {
        let every = self.every?;
        Some(match self.pinged {
            Some((_, at)) => at + self.timeout,
            None => match taking {
                Taking::All => self.heard + every,
                Taking::Since(t) => (self.heard + every).min(t + every),
            },
        })
    }

    /// What is due at `now`.
    pub fn tick(&mut self, now: Instant, taking: Taking) -> Tick {
        let Some(every) = self.every else {
            return Tick::Wait;
        };
        let since = |t: Instant| now.saturating_duration_since(t);
        match self.pinged {
            Some((tag, at)) if since(at) >= self.timeout => match taking {
                // Still reading its way to the ping: give it the time
                // again from the last bytes it took.
                Taking::Since(t) if t > at => {
                    self.pinged = Some((tag, t));
                    Tick::Wait
                }
                _ => Tick::Dead(since(at)),
            },
            Some(_) => Tick::Wait,
            None => {
                let stuck = matches!(taking, Taking::Since(t) if since(t) >= every);
                if since(self.heard) >= every || stuck {
                    // Any tag but the reserved 0xffffffff, which would ask
                    // for no answer (RFC 7143 11.19.2).
                    self.tag = self.tag.wrapping_add(1) % 0xffff_ffff;
                    self.pinged = Some((self.tag, now));
                    Tick::Ping(self.tag)
                } else {
                    Tick::Wait
                }
            }
        }
    }
}

/// Whether the initiator has taken bytes from the socket since `at` (or
/// has taken everything).
fn reads_since(taking: Taking, at: Instant) -> bool {
    match taking {
        Taking::All => true,
        Taking::Since(t) => t >= at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const A: Taking = Taking::All;

    /// Pings after 15 s, dead 15 s later.
    fn every_15_s() -> Timers {
        Timers {
            nop_in_interval: Some(15 * S),
            nop_in_timeout: 15 * S,
            ..Timers::default()
        }
    }

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
        let timers = every_15_s();
        let mut l = Liveness::new(&timers, t0);
        assert_eq!(l.next(A), Some(t0 + 15 * S));
        assert_eq!(l.tick(t0 + 14 * S, A), Tick::Wait);
        let Tick::Ping(tag) = l.tick(t0 + 15 * S, A) else {
            panic!("no ping after 15 s of silence");
        };
        assert_ne!(tag, 0xffff_ffff, "a ping that asks for an answer");
        assert_eq!(l.next(A), Some(t0 + 30 * S));
        assert_eq!(l.tick(t0 + 29 * S, A), Tick::Wait, "one ping at a time");
        assert_eq!(
            l.tick(t0 + 30 * S, A),
            Tick::Dead(15 * S),
            "unanswered for 15 s"
        );

        let mut l = Liveness::new(&timers, t0);
        assert!(matches!(l.tick(t0 + 15 * S, A), Tick::Ping(_)));
        l.heard(t0 + 20 * S, A);
        assert_eq!(l.tick(t0 + 31 * S, A), Tick::Wait, "it answered: alive");
        assert_eq!(l.next(A), Some(t0 + 35 * S), "pinged again after silence");
    }

    #[test]
    fn without_an_interval_nobody_is_pinged() {
        let t0 = Instant::now();
        let timers = Timers {
            nop_in_interval: None,
            ..Timers::default()
        };
        let mut l = Liveness::new(&timers, t0);
        assert_eq!(l.next(A), None);
        assert_eq!(l.tick(t0 + 3600 * S, Taking::Since(t0)), Tick::Wait);
    }

    /// An initiator that talks all the time but has stopped reading: its
    /// talk does not answer the ping; it is dead once the socket has taken
    /// nothing for the interval and the timeout.
    #[test]
    fn talk_without_reading_is_not_life() {
        let t0 = Instant::now();
        let timers = every_15_s();
        let stuck = Taking::Since(t0);
        let mut l = Liveness::new(&timers, t0);
        l.heard(t0 + 10 * S, stuck);
        assert_eq!(l.next(stuck), Some(t0 + 15 * S), "stuck since t0");
        let Tick::Ping(_) = l.tick(t0 + 15 * S, stuck) else {
            panic!("no ping though nothing was taken for 15 s");
        };
        for k in 16..30 {
            l.heard(t0 + k * S, stuck);
        }
        assert_eq!(l.tick(t0 + 29 * S, stuck), Tick::Wait);
        assert!(matches!(l.tick(t0 + 30 * S, stuck), Tick::Dead(_)));
    }

    /// One reading its way slowly through a long queue keeps the socket
    /// moving: its ping's time starts again from the last bytes it took,
    /// and any PDU after them answers it.
    #[test]
    fn a_slow_reader_is_given_time_while_it_takes_bytes() {
        let t0 = Instant::now();
        let timers = every_15_s();
        let mut l = Liveness::new(&timers, t0);
        assert!(matches!(
            l.tick(t0 + 15 * S, Taking::Since(t0)),
            Tick::Ping(_)
        ));
        let moving = Taking::Since(t0 + 25 * S);
        assert_eq!(
            l.tick(t0 + 30 * S, moving),
            Tick::Wait,
            "it took bytes at 25 s"
        );
        assert_eq!(l.next(moving), Some(t0 + 40 * S));
        l.heard(t0 + 31 * S, moving);
        let later = Taking::Since(t0 + 35 * S);
        assert_eq!(
            l.tick(t0 + 41 * S, later),
            Tick::Wait,
            "answered by its PDU"
        );
        assert!(
            matches!(l.tick(t0 + 41 * S, moving), Tick::Ping(_)),
            "pinged again once the socket took nothing for 15 s"
        );
    }
}
