//! The flags of the commands that ask or steer a running serve or attach:
//! status, policy, path, clear-loss and alua.

use std::path::PathBuf;

use clap::Args;

use super::PolicyName;

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Refresh in place every --interval seconds
    #[arg(long)]
    pub watch: bool,
    /// Seconds between refreshes with --watch
    #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
    pub interval: f64,
    /// Stop after this many refreshes
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Print JSON for scripts
    #[arg(long)]
    pub json: bool,
    /// Ask only this control socket
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

pub(super) const CLEAR_LOSS_HELP: &str = "\
A volume is lost when its target restarted and braid could not give it back
every write it had acknowledged since the last FLUSH: more had been written
than --replay-window holds, or the replay failed. From then on every FLUSH
and FUA write of the volume fails with EIO, on every client, so that no file
system or database is told its data is safe when some of it may be gone.
`braid status` shows when the loss began and why.

Clear it only once what may have been lost is dealt with: the file system
checked (fsck) or the database recovered, or the data restored. Clearing
makes FLUSH succeed again; it gives nothing back. Detaching the volume
clears it too.

Example:
  braid clear-loss vol";

#[derive(Args, Debug)]
pub struct ClearLossArgs {
    /// The attached volume's name
    pub volume: String,
    /// The attach's control socket [default: found in /run/braid/ctl]
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct PolicyArgs {
    /// The attached volume's name
    pub volume: String,
    /// The policy to switch to
    #[arg(value_enum)]
    pub policy: PolicyName,
    /// The attach's control socket [default: found in /run/braid/ctl]
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

pub(super) const ALUA_EXAMPLES: &str = "\
Each iSCSI portal of braid serve is its own target port group. Initiators
that follow ALUA (Linux multipath with prio alua, Windows MPIO, VMware's
VMW_SATP_ALUA) move I/O off a portal in standby or unavailable and back
when it is active again; every session is told with a unit attention.

Examples:
  braid alua 10.0.1.5:3260 standby            drain the portal
  braid alua 10.0.1.5:3260 active-optimized   and take it back
  braid status                                shows each portal's state";

/// An ALUA asymmetric access state (SPC-5 5.16.2.4).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AluaState {
    /// Full speed: the initiator's preferred paths
    ActiveOptimized,
    /// Works, but initiators use it only when no optimized path is left
    ActiveNonOptimized,
    /// Answers only inquiries (NOT READY to I/O): drained
    Standby,
    /// Answers only inquiries, and is not expected back soon
    Unavailable,
    /// Changing state: initiators retry I/O elsewhere or later
    Transitioning,
}

impl AluaState {
    /// The name the control socket uses.
    pub fn as_str(self) -> &'static str {
        match self {
            AluaState::ActiveOptimized => "active-optimized",
            AluaState::ActiveNonOptimized => "active-non-optimized",
            AluaState::Standby => "standby",
            AluaState::Unavailable => "unavailable",
            AluaState::Transitioning => "transitioning",
        }
    }
}

#[derive(Args, Debug)]
pub struct AluaArgs {
    /// The iSCSI portal, ADDR:PORT as `braid status` shows it
    pub portal: String,
    /// Its new access state
    #[arg(value_enum)]
    pub state: AluaState,
    /// The serve's control socket [default: the serve that has the portal]
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct PathArgs {
    /// The attached volume's name
    pub volume: String,
    /// The path number, as `braid status` shows it
    pub path: usize,
    /// enable, disable, or knobs to set: priority=N, weight=N, standby=yes|no,
    /// relative-throughput=N, repeat-count=N, queue-depth=N (0: no limit)
    #[arg(required = true, num_args = 1..)]
    pub action: Vec<String>,
    /// The attach's control socket [default: found in /run/braid/ctl]
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}
