//! What a check finds: its name, how bad it is, what it is about, the
//! values it read and where, why that matters, and the command that fixes
//! it. These types are the `--json` output (`{"findings": [...]}`), so
//! their serde shape is the interface scripts read.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How bad a finding is. Ordered: `Ok < Warn < Fail`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Looked at and found as it should be.
    Ok,
    /// Costs speed or resilience; worth fixing.
    Warn,
    /// Breaks a promise of multipath storage (a path that is not one, data
    /// that is not durable) or makes a path fail.
    Fail,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ok => "ok",
            Self::Warn => "warn",
            Self::Fail => "fail",
        })
    }
}

/// What a finding is about. In JSON it is one string, e.g. `path 2
/// (10.0.2.2%eth2 → 10.0.2.5:10809)`, `volume 10.0.1.5:10809/vol`,
/// `interface eth1`, `device md0`, `export vol`, `host`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Subject {
    /// A volume, by its URI (`nbd://10.0.1.5:10809/vol`).
    Volume(String),
    /// One path of a volume: its number and how it goes (`local → portal`).
    Path { index: usize, via: String },
    /// A network interface.
    Interface(String),
    /// A block device (`md0`, `sda`, `nbd0`).
    Device(String),
    /// An export of this storage host.
    Export(String),
    /// The host as a whole (sysctls, modules).
    Host,
}

impl Subject {
    /// The interface, device or export named, or the path's number.
    pub fn name(&self) -> String {
        match self {
            Self::Path { index, .. } => index.to_string(),
            Self::Volume(n) | Self::Interface(n) | Self::Device(n) | Self::Export(n) => n.clone(),
            Self::Host => String::new(),
        }
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Path { index, via } if via.is_empty() => write!(f, "path {index}"),
            Self::Path { index, via } => write!(f, "path {index} ({via})"),
            Self::Volume(n) => write!(f, "volume {n}"),
            Self::Interface(n) => write!(f, "interface {n}"),
            Self::Device(n) => write!(f, "device {n}"),
            Self::Export(n) => write!(f, "export {n}"),
            Self::Host => f.write_str("host"),
        }
    }
}

impl From<Subject> for String {
    fn from(s: Subject) -> String {
        s.to_string()
    }
}

impl FromStr for Subject {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "host" {
            return Ok(Self::Host);
        }
        let (kind, rest) = s
            .split_once(' ')
            .ok_or_else(|| format!("subject {s:?}: expected `KIND NAME`"))?;
        match kind {
            "volume" => Ok(Self::Volume(rest.to_owned())),
            "interface" => Ok(Self::Interface(rest.to_owned())),
            "device" => Ok(Self::Device(rest.to_owned())),
            "export" => Ok(Self::Export(rest.to_owned())),
            "path" => {
                let (n, via) = match rest.split_once(" (") {
                    Some((n, via)) => (n, via.strip_suffix(')').unwrap_or(via)),
                    None => (rest, ""),
                };
                let index = n
                    .parse()
                    .map_err(|_| format!("subject {s:?}: path number {n:?}"))?;
                Ok(Self::Path {
                    index,
                    via: via.to_owned(),
                })
            }
            _ => Err(format!("subject {s:?}: unknown kind {kind:?}")),
        }
    }
}

impl TryFrom<String> for Subject {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

/// One value a check read, and where it read it: a file
/// (`/sys/class/net/eth1/speed`), a netlink answer (`rtnetlink
/// RTM_GETROUTE`), a measurement (`probe: ICMP echo`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Evidence {
    pub source: String,
    pub value: String,
}

impl Evidence {
    pub fn new(source: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            source: source.into(),
            value: value.into(),
        }
    }
}

/// How to fix a finding. In JSON it is one string of shell: a command
/// (`sysctl -w net.ipv4.conf.eth1.arp_ignore=1`), or, where no command can
/// do it (moving an export off tmpfs), a shell comment saying what to do
/// (`# move ...`), which `--apply` never runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", from = "String")]
pub enum Fix {
    /// Shell commands, one a line, that `--apply` runs (after asking).
    Run(String),
    /// What to do by hand.
    Manual(String),
}

impl Fix {
    /// Several commands, run in order.
    pub fn commands<I, S>(lines: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let v: Vec<String> = lines.into_iter().map(Into::into).collect();
        Self::Run(v.join("\n"))
    }

    /// The commands `--apply` would run, if any.
    pub fn runnable(&self) -> Option<&str> {
        match self {
            Self::Run(c) => Some(c),
            Self::Manual(_) => None,
        }
    }
}

impl fmt::Display for Fix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Run(c) => f.write_str(c),
            Self::Manual(m) => write!(f, "# {m}"),
        }
    }
}

impl From<Fix> for String {
    fn from(f: Fix) -> String {
        f.to_string()
    }
}

impl From<String> for Fix {
    fn from(s: String) -> Fix {
        match s.strip_prefix("# ") {
            Some(m) => Fix::Manual(m.to_owned()),
            None => Fix::Run(s),
        }
    }
}

/// One finding of one check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Finding {
    /// The check's name (`md-stripe-cache`, `arp-flux`, ...).
    pub check: String,
    pub severity: Severity,
    pub subject: Subject,
    /// The values read, with where they were read.
    pub evidence: Vec<Evidence>,
    /// What it means for multipath storage, in one sentence (for `ok`,
    /// what was confirmed).
    pub why: String,
    /// Absent when there is nothing to fix.
    pub fix: Option<Fix>,
}

impl Finding {
    /// A finding with no evidence and no fix yet.
    pub fn new(check: &str, severity: Severity, subject: Subject, why: impl Into<String>) -> Self {
        Self {
            check: check.to_owned(),
            severity,
            subject,
            evidence: Vec::new(),
            why: why.into(),
            fix: None,
        }
    }

    /// An `ok` finding: what was checked and found right.
    pub fn ok(check: &str, subject: Subject, what: impl Into<String>) -> Self {
        Self::new(check, Severity::Ok, subject, what)
    }

    /// Adds one value read and where.
    pub fn read(mut self, source: impl Into<String>, value: impl Into<String>) -> Self {
        self.evidence.push(Evidence::new(source, value));
        self
    }

    /// Adds evidence already made.
    pub fn with(mut self, evidence: impl IntoIterator<Item = Evidence>) -> Self {
        self.evidence.extend(evidence);
        self
    }

    /// Sets the fix.
    pub fn fix(mut self, fix: Fix) -> Self {
        self.fix = Some(fix);
        self
    }
}

/// Everything one run found: the `--json` document.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Report {
    pub findings: Vec<Finding>,
}

impl Report {
    /// The worst severity found (`Ok` for an empty report).
    pub fn worst(&self) -> Severity {
        self.findings
            .iter()
            .map(|f| f.severity)
            .max()
            .unwrap_or(Severity::Ok)
    }

    /// Findings that are not `ok`.
    pub fn problems(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.severity != Severity::Ok)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_round_trip_through_their_string() {
        for s in [
            Subject::Path {
                index: 2,
                via: "10.0.2.2%eth2 → 10.0.2.5:10809".into(),
            },
            Subject::Path {
                index: 1,
                via: String::new(),
            },
            Subject::Volume("10.0.1.5:10809/vol".into()),
            Subject::Interface("eth1".into()),
            Subject::Device("md0".into()),
            Subject::Export("vol".into()),
            Subject::Host,
        ] {
            assert_eq!(s.to_string().parse::<Subject>().unwrap(), s);
        }
        assert!("nonsense".parse::<Subject>().is_err());
        assert!("path x".parse::<Subject>().is_err());
    }

    #[test]
    fn json_has_the_documented_shape() {
        let f = Finding::new(
            "link-speed",
            Severity::Warn,
            Subject::Interface("eth1".into()),
            "slow",
        )
        .read("/sys/class/net/eth1/speed", "100")
        .fix(Fix::Run("ethtool -s eth1 autoneg on".into()));
        let manual = Finding::new("export-backing", Severity::Fail, Subject::Host, "x")
            .fix(Fix::Manual("move it".into()));
        let r = Report {
            findings: vec![f, manual],
        };
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        let keys: Vec<&str> = v["findings"][0]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut want = ["check", "severity", "subject", "evidence", "why", "fix"];
        want.sort_unstable();
        let mut got = keys.clone();
        got.sort_unstable();
        assert_eq!(got, want);
        assert_eq!(v["findings"][0]["severity"], "warn");
        assert_eq!(v["findings"][0]["subject"], "interface eth1");
        assert_eq!(v["findings"][1]["fix"], "# move it");
        let back: Report = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.worst(), Severity::Fail);
    }
}
