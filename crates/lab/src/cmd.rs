//! Running external programs with a deadline, and the guard that stops a
//! spawned process by its PID. Every wait here is bounded: a hung `ip` or a
//! server that ignores SIGTERM cannot hang a test.

use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::LabError;

/// How long `ip`, `tc` and `nft` get; they normally take milliseconds.
pub(crate) const TOOL_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a stopped process gets between SIGTERM and SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// A spawned process that is stopped (SIGTERM, then SIGKILL after
/// [`STOP_GRACE`]) and reaped when the guard is dropped, unless it has
/// already exited and been waited for.
#[derive(Debug)]
pub struct ChildGuard {
    child: Child,
    command: String,
    status: Option<ExitStatus>,
}

impl ChildGuard {
    /// Guards an already spawned child; `command` names it in errors.
    pub fn new(child: Child, command: impl Into<String>) -> Self {
        ChildGuard {
            child,
            command: command.into(),
            status: None,
        }
    }

    /// The child's PID.
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The command line, for messages.
    pub fn command(&self) -> &str {
        &self.command
    }

    /// The child itself, e.g. to take its stdout. Do not wait for it through
    /// this handle: the guard would no longer know that it has exited.
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// Waits up to `timeout` for the child to exit; `None` if it is still
    /// running.
    ///
    /// # Errors
    /// [`LabError::Io`] if the child cannot be waited for.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<ExitStatus>, LabError> {
        if self.status.is_none() {
            self.status = wait_deadline(&mut self.child, timeout)
                .map_err(|e| LabError::io(format!("waiting for `{}`", self.command), e))?;
        }
        Ok(self.status)
    }

    /// Stops the child now (SIGTERM, then SIGKILL after [`STOP_GRACE`]) and
    /// returns how it ended.
    ///
    /// # Errors
    /// [`LabError::Io`] if the child cannot be waited for.
    pub fn stop(mut self) -> Result<ExitStatus, LabError> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<ExitStatus, LabError> {
        if let Some(status) = self.wait_timeout(Duration::ZERO)? {
            return Ok(status);
        }
        // Safe to signal by PID: the child has not been reaped (we hold it
        // and have not seen it exit), so the PID cannot have been reused.
        signal(self.child.id(), libc::SIGTERM);
        if let Some(status) = self.wait_timeout(STOP_GRACE)? {
            return Ok(status);
        }
        tracing::warn!(pid = self.child.id(), command = %self.command, "ignored SIGTERM; killing");
        signal(self.child.id(), libc::SIGKILL);
        // SIGKILL cannot be ignored; the bound only guards against a process
        // stuck in the kernel (D state).
        self.wait_timeout(STOP_GRACE)?
            .ok_or_else(|| LabError::Timeout {
                command: self.command.clone(),
                after: STOP_GRACE,
            })
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Err(e) = self.stop_inner() {
            tracing::warn!(error = %e, "could not stop a lab process");
        }
    }
}

/// Sends `sig` to `pid`; errors (already gone) are of no interest here.
pub(crate) fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours.
        unsafe { libc::kill(pid, sig) };
    }
}

/// The command line as a shell would show it, for messages.
pub(crate) fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Spawns `cmd`, mapping "not found" to an install hint.
pub(crate) fn spawn(cmd: &mut Command) -> Result<Child, LabError> {
    cmd.spawn().map_err(|source| {
        let tool = cmd.get_program().to_string_lossy().into_owned();
        if source.kind() == std::io::ErrorKind::NotFound {
            let package = match tool.as_str() {
                "ip" | "tc" => "iproute2",
                "nft" => "nftables",
                "iperf3" => "iperf3",
                _ => "that provides it",
            };
            LabError::ToolMissing { tool, package }
        } else {
            LabError::Spawn {
                command: describe(cmd),
                source,
            }
        }
    })
}

/// Runs `cmd` to completion, feeding it `stdin`, killing it after `timeout`.
/// The exit status is not checked; see [`run_ok`].
pub(crate) fn run(
    mut cmd: Command,
    stdin: Option<&str>,
    timeout: Duration,
) -> Result<Output, LabError> {
    let command = describe(&cmd);
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = ChildGuard::new(spawn(&mut cmd)?, command.clone());
    let deadline = Instant::now() + timeout;
    if let (Some(text), Some(mut pipe)) = (stdin, child.child.stdin.take()) {
        // Batch input is a few hundred bytes, far below the pipe buffer, so
        // this write cannot block on a child that is not reading.
        pipe.write_all(text.as_bytes())
            .map_err(|e| LabError::io(format!("writing to `{command}`"), e))?;
    }
    let stdout = reader(child.child.stdout.take());
    let stderr = reader(child.child.stderr.take());
    let Some(status) = child.wait_timeout(timeout)? else {
        return Err(LabError::Timeout {
            command,
            after: timeout,
        });
    };
    // A grandchild could hold the pipes open after the child exited; do not
    // let that block us past the deadline (plus a little for the last read).
    let left = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(1);
    Ok(Output {
        status,
        stdout: stdout.recv_timeout(left).unwrap_or_default(),
        stderr: stderr.recv_timeout(left).unwrap_or_default(),
    })
}

/// Runs `cmd` like [`run`] and fails with [`LabError::Command`] unless it
/// exits with status 0; returns its stdout.
pub(crate) fn run_ok(cmd: Command, stdin: Option<&str>) -> Result<String, LabError> {
    let command = describe(&cmd);
    let out = run(cmd, stdin, TOOL_TIMEOUT)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(LabError::Command {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// `ip`, `tc` or another tool with these arguments, ready for [`run_ok`].
pub(crate) fn tool<I, S>(program: &str, args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let mut c = Command::new(program);
    c.args(args);
    c
}

fn reader<R: Read + Send + 'static>(pipe: Option<R>) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    if let Some(mut pipe) = pipe {
        thread::spawn(move || {
            let mut buf = Vec::new();
            // A read error just ends the capture; the exit status tells the
            // caller whether the command worked.
            let _ = pipe.read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
    }
    rx
}

/// Polls until the child exits or `timeout` passes.
fn wait_deadline(child: &mut Child, timeout: Duration) -> std::io::Result<Option<ExitStatus>> {
    let deadline = Instant::now() + timeout;
    let mut nap = Duration::from_micros(500);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        thread::sleep(nap.min(deadline - now));
        nap = (nap * 2).min(Duration::from_millis(20));
    }
}
