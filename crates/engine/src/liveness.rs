//! Whether a busy path is dead or only slow.
//!
//! A reply that is late proves nothing by itself: a busy disk takes two
//! seconds for a write or a FLUSH, while a blackholed link never answers.
//! What tells them apart is the connection: when the replies stop coming,
//! the engine sends a small probe; if the kernel then sees the peer
//! acknowledge bytes (its TCP stack, so its host and link, live), or the
//! probe's own reply comes back, the path is slow and is waited for, up to
//! a limit learned from the slowest reply it has given (never less than
//! [`super::EngineConfig::slow_reply_min`], never more than
//! [`super::EngineConfig::slow_reply_max`]); if nothing answers, it is
//! failed as before. This module keeps the evidence; the engine's clock
//! (`failover.rs`) decides.

use std::time::Duration;

/// One path's evidence of life.
#[derive(Clone, Debug, Default)]
pub(crate) struct Liveness {
    /// The kernel's byte count for the path at the last sample, and when
    /// it last grew.
    wire_bytes: u64,
    wire_grew: Option<Duration>,
    /// A liveness probe is out, sent at this time.
    probe_sent: Option<Duration>,
    /// When the connection last proved alive while replies were late.
    alive_at: Option<Duration>,
    /// The slowest reply this path has given.
    slowest: Duration,
    /// The kernel's last word on the peer, and when it was read; `None`
    /// without the kernel's figures (a unix socket).
    kernel: Option<(Duration, KernelHealth)>,
}

/// What the kernel says of a path's peer (`TCP_INFO` of its connections).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelHealth {
    /// Retransmitting, or a probe of a closed window went unanswered.
    pub stalled: bool,
    /// The peer's receive window is closed: it is full and not reading.
    pub window_closed: bool,
    /// Time since the peer last sent an ACK.
    pub last_ack: Duration,
}

impl Liveness {
    /// The kernel's cumulative bytes (acknowledged by the peer, and
    /// received from it) for the path's connections.
    pub fn wire(&mut self, now: Duration, bytes: u64) {
        if bytes > self.wire_bytes {
            self.wire_grew = Some(now);
        }
        self.wire_bytes = bytes;
    }

    /// The kernel's word on the peer, read at `now`.
    pub fn kernel(&mut self, now: Duration, health: KernelHealth) {
        self.kernel = Some((now, health));
    }

    /// A reply came, after `service` on the path.
    pub fn replied(&mut self, service: Duration) {
        self.slowest = self.slowest.max(service);
        self.probe_sent = None;
        self.alive_at = None;
    }

    /// Forgets everything but what the path has shown it takes (for a
    /// path whose connections are new).
    pub fn reset(&mut self) {
        *self = Self {
            slowest: self.slowest,
            ..Self::default()
        };
    }

    /// Since when the path has shown no sign of life: its last reply, or
    /// the last time the connection proved alive.
    pub fn quiet_since(&self, last_progress: Duration) -> Duration {
        self.alive_at
            .map_or(last_progress, |a| a.max(last_progress))
    }

    pub fn probe_out(&self) -> bool {
        self.probe_sent.is_some()
    }

    /// How long the liveness probe has been out.
    pub fn probe_age(&self, now: Duration) -> Option<Duration> {
        self.probe_sent.map(|t| now.saturating_sub(t))
    }

    pub fn probe_sent(&mut self, now: Duration) {
        self.probe_sent = Some(now);
    }

    /// Whether the connection answered the probe: bytes moved after it was
    /// sent; or the peer sent an ACK after it; or the peer's window is
    /// closed (a server whose buffers are full of slow writes cannot take
    /// the probe's bytes) while every window probe is answered. A link that
    /// is down or blackholed shows none of these. The probe's own reply is
    /// seen by the caller as progress. If answered, the path counts as
    /// alive from `now`.
    pub fn answered(&mut self, now: Duration) -> bool {
        let Some(sent) = self.probe_sent else {
            return false;
        };
        let moved = self.wire_grew.is_some_and(|grew| grew > sent);
        let acked = self
            .kernel
            .is_some_and(|(at, k)| at.saturating_sub(k.last_ack) > sent);
        let full = self
            .kernel
            .is_some_and(|(_, k)| k.window_closed && !k.stalled);
        let yes = moved || acked || full;
        if yes {
            self.alive_at = Some(now);
            self.probe_sent = None;
        }
        yes
    }

    /// What the connection showed by `now`, for the reason a silent path
    /// is failed: when the probe went out, when bytes last moved, and the
    /// kernel's last word on the peer, so that a live path failed by
    /// mistake can be told from a dead one in a log.
    pub fn silence(&self, now: Duration) -> String {
        let ago = |t: Duration| now.saturating_sub(t).as_secs_f64();
        let probe = self.probe_sent.map_or("no probe out".to_owned(), |t| {
            format!("probe sent {:.2} s ago", ago(t))
        });
        let moved = self.wire_grew.map_or("no byte moved yet".to_owned(), |t| {
            format!("bytes last moved {:.2} s ago", ago(t))
        });
        let kernel = self
            .kernel
            .map_or("no kernel figures".to_owned(), |(at, k)| {
                format!(
                    "kernel {:.2} s ago: last ACK {:.2} s before that, window {}, {}",
                    ago(at),
                    k.last_ack.as_secs_f64(),
                    if k.window_closed { "closed" } else { "open" },
                    if k.stalled {
                        "retransmitting or probes unanswered"
                    } else {
                        "not stalled"
                    }
                )
            });
        format!("{probe}; {moved}; {kernel}")
    }

    /// How long a reply may take on a path whose connection lives: four
    /// times the slowest it has given, within `[min, max]`.
    pub fn patience(&self, min: Duration, max: Duration) -> Duration {
        (self.slowest * 4).clamp(min, max.max(min))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;
    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn the_silence_of_a_failed_path_says_what_was_and_was_not_seen() {
        let mut l = Liveness::default();
        assert_eq!(
            l.silence(S(1)),
            "no probe out; no byte moved yet; no kernel figures"
        );
        l.wire(MS(100), 5000);
        l.probe_sent(MS(400));
        l.kernel(
            MS(900),
            KernelHealth {
                stalled: true,
                window_closed: true,
                last_ack: MS(700),
            },
        );
        assert_eq!(
            l.silence(S(1)),
            "probe sent 0.60 s ago; bytes last moved 0.90 s ago; kernel 0.10 s ago: last ACK \
             0.70 s before that, window closed, retransmitting or probes unanswered"
        );
    }

    #[test]
    fn a_probe_counts_as_answered_only_by_bytes_after_it() {
        let mut l = Liveness::default();
        l.wire(MS(100), 5000);
        l.probe_sent(MS(200));
        l.wire(MS(250), 5000);
        assert!(!l.answered(MS(250)), "no byte moved since the probe");
        l.wire(MS(300), 5028);
        assert!(l.answered(MS(300)));
        assert!(!l.probe_out());
        assert_eq!(l.quiet_since(MS(50)), MS(300));
    }

    #[test]
    fn a_peer_that_answers_the_kernel_is_alive_and_one_that_does_not_is_not() {
        let health = |stalled, window_closed, last_ack| KernelHealth {
            stalled,
            window_closed,
            last_ack: MS(last_ack),
        };
        let mut l = Liveness::default();
        l.probe_sent(MS(200));
        assert!(
            !l.answered(MS(500)),
            "without the kernel's word, only bytes count"
        );
        // A link that is down: nothing sent, nothing retransmitted, no ACK.
        l.kernel(MS(500), health(false, false, 400));
        assert!(!l.answered(MS(500)));
        // Retransmitting into a closed window: silent.
        l.kernel(MS(500), health(true, true, 400));
        assert!(!l.answered(MS(500)));
        // A full peer answering window probes.
        l.kernel(MS(500), health(false, true, 450));
        assert!(l.answered(MS(500)));
        assert!(!l.answered(MS(600)), "no probe out, nothing to answer");
        // An ACK after the probe.
        l.probe_sent(MS(700));
        l.kernel(MS(900), health(false, false, 100));
        assert!(l.answered(MS(900)));
    }

    #[test]
    fn patience_grows_with_the_slowest_reply_within_bounds() {
        let mut l = Liveness::default();
        assert_eq!(l.patience(S(30), S(120)), S(30));
        l.replied(S(20));
        assert_eq!(l.patience(S(30), S(120)), S(80));
        l.replied(S(50));
        assert_eq!(l.patience(S(30), S(120)), S(120));
        l.reset();
        assert_eq!(l.patience(S(30), S(120)), S(120), "what it takes is kept");
    }
}
