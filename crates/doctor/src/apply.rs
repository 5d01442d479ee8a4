//! Running fixes, for `--apply`: only the commands of findings that are not
//! `ok`, only [`Fix::Run`] ones (a [`Fix::Manual`] is advice), each command
//! once even when several findings share it, each through `sh -c` with a
//! deadline. Whether to run them at all is the caller's question to ask.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::finding::{Fix, Report};

/// How long one fix command may take.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// One command to run and the findings it fixes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub command: String,
    /// `check (subject)` of each finding it fixes.
    pub fixes: Vec<String>,
}

/// What running one command gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    pub command: String,
    pub ok: bool,
    /// Its standard output and error, or why it did not run.
    pub output: String,
}

/// The commands `--apply` would run, in report order, each once.
pub fn plan(report: &Report) -> Vec<Planned> {
    let mut out: Vec<Planned> = Vec::new();
    for f in report.problems() {
        let Some(cmd) = f.fix.as_ref().and_then(Fix::runnable) else {
            continue;
        };
        let what = format!("{} ({})", f.check, f.subject);
        match out.iter_mut().find(|p| p.command == cmd) {
            Some(p) => p.fixes.push(what),
            None => out.push(Planned {
                command: cmd.to_owned(),
                fixes: vec![what],
            }),
        }
    }
    out
}

/// Problems whose fix is not a command: left for the operator.
pub fn manual(report: &Report) -> usize {
    report
        .problems()
        .filter(|f| f.fix.as_ref().and_then(Fix::runnable).is_none())
        .count()
}

/// Runs each planned command in order; a failing one does not stop the
/// others (they fix other findings).
pub fn run(plan: &[Planned]) -> Vec<Applied> {
    plan.iter().map(|p| run_one(&p.command)).collect()
}

fn run_one(command: &str) -> Applied {
    let spawned = Command::new("sh")
        .args(["-c", command])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            return Applied {
                command: command.to_owned(),
                ok: false,
                output: format!("cannot start sh: {e}"),
            }
        }
    };
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                // Our own child, not yet reaped: its PID is still ours.
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let mut output = String::new();
    for pipe in [
        child.stdout.take().map(|p| Box::new(p) as Box<dyn Read>),
        child.stderr.take().map(|p| Box::new(p) as Box<dyn Read>),
    ]
    .into_iter()
    .flatten()
    {
        let mut buf = String::new();
        // The child has exited; its pipes hold what it wrote (fix commands
        // write a line or two, far below a pipe's buffer, so it could not
        // have blocked on a full pipe).
        let mut pipe = pipe;
        let _ = pipe.read_to_string(&mut buf);
        output.push_str(&buf);
    }
    match status {
        Some(s) => Applied {
            command: command.to_owned(),
            ok: s.success(),
            output: if s.success() {
                output.trim().to_owned()
            } else {
                format!("{s}: {}", output.trim())
            },
        },
        None => Applied {
            command: command.to_owned(),
            ok: false,
            output: format!("no result within {} s; stopped", COMMAND_TIMEOUT.as_secs()),
        },
    }
}

/// Whether an answer to "run these?" means yes.
pub fn is_yes(answer: &str) -> bool {
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::finding::{Finding, Severity, Subject};

    #[test]
    fn plan_takes_commands_of_problems_once() {
        let cmd = Fix::Run("true".into());
        let r = Report {
            findings: vec![
                Finding::new("a", Severity::Warn, Subject::Host, "x").fix(cmd.clone()),
                Finding::new("b", Severity::Fail, Subject::Interface("e".into()), "x")
                    .fix(cmd.clone()),
                Finding::ok("c", Subject::Host, "fine").fix(Fix::Run("false".into())),
                Finding::new("d", Severity::Warn, Subject::Host, "x")
                    .fix(Fix::Manual("by hand".into())),
            ],
        };
        let p = plan(&r);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].fixes, ["a (host)", "b (interface e)"]);
        assert_eq!(manual(&r), 1);
    }

    #[test]
    fn commands_report_their_outcome() {
        let done = run(&[
            Planned {
                command: "echo hi".into(),
                fixes: vec![],
            },
            Planned {
                command: "echo no >&2; exit 3".into(),
                fixes: vec![],
            },
        ]);
        assert!(done[0].ok && done[0].output == "hi");
        assert!(
            !done[1].ok && done[1].output.contains("no"),
            "{:?}",
            done[1]
        );
        assert!(is_yes("Y\n") && is_yes("yes") && !is_yes("") && !is_yes("n"));
    }
}
