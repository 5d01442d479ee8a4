//! What an export is made from: `NAME=SOURCE` as users write it, and byte
//! sizes such as `1GiB`.

use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Where an export's data lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A regular file or block device.
    File(PathBuf),
    /// Sparse memory of this many bytes, gone when the server stops.
    Mem(u64),
    /// An image in a Ceph cluster (`rbd:POOL/[NAMESPACE/]IMAGE[@SNAP]`), or one of its
    /// snapshots (always read-only).
    Rbd(RbdSpec),
}

/// `rbd:POOL/[NAMESPACE/]IMAGE[@SNAP]`, as the `rbd` command writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RbdSpec {
    pub pool: String,
    /// The RADOS namespace inside the pool (`rbd namespace create`); `None`
    /// is the pool's default namespace.
    pub namespace: Option<String>,
    pub image: String,
    pub snap: Option<String>,
}

impl RbdSpec {
    /// `POOL/[NAMESPACE/]IMAGE`, as the `rbd` command takes the image.
    pub fn rbd_name(&self) -> String {
        format!("{}/{}", self.rbd_dir(), self.image)
    }

    /// `POOL[/NAMESPACE]`, as `rbd ls` takes where the image lives.
    pub fn rbd_dir(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/{ns}", self.pool),
            None => self.pool.clone(),
        }
    }
}

impl std::fmt::Display for RbdSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rbd:{}", self.rbd_name())?;
        match &self.snap {
            Some(s) => write!(f, "@{s}"),
            None => Ok(()),
        }
    }
}

impl FromStr for RbdSpec {
    type Err = String;

    /// Parses what follows `rbd:`.
    fn from_str(s: &str) -> Result<Self, String> {
        let example = "write rbd:POOL/IMAGE, rbd:POOL/NAMESPACE/IMAGE, or either with \
                       @SNAPSHOT, e.g. rbd:rbd/vol or rbd:rbd/tenant1/vol@monday";
        let (pool, rest) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} names no pool: {example}"))?;
        let (namespace, rest) = match rest.split_once('/') {
            Some((ns, rest)) => (Some(ns), rest),
            None => (None, rest),
        };
        if rest.contains('/') {
            return Err(format!(
                "{s:?} has more than pool, namespace and image: {example}"
            ));
        }
        let (image, snap) = match rest.split_once('@') {
            Some((i, s)) => (i, Some(s)),
            None => (rest, None),
        };
        if pool.is_empty()
            || namespace.is_some_and(str::is_empty)
            || image.is_empty()
            || snap.is_some_and(str::is_empty)
        {
            return Err(format!(
                "{s:?} has an empty pool, namespace, image or snapshot name: {example}"
            ));
        }
        Ok(Self {
            pool: pool.to_owned(),
            namespace: namespace.map(str::to_owned),
            image: image.to_owned(),
            snap: snap.map(str::to_owned),
        })
    }
}

/// One `NAME=SOURCE` argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportSpec {
    pub name: String,
    pub source: Source,
}

/// A user-facing parse error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(pub String);

impl FromStr for ExportSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, SpecError> {
        let (name, source) = s.split_once('=').ok_or_else(|| {
            SpecError(format!(
                "export {s:?} has no source: write NAME=SOURCE, e.g. vol=/srv/disk.img, \
                 vol=mem:1GiB or vol=rbd:rbd/vol"
            ))
        })?;
        check_export_name(name)?;
        if source.is_empty() {
            return Err(SpecError(format!(
                "export {name:?} has an empty source: give a file, a block device, mem:SIZE or \
                 rbd:POOL/[NAMESPACE/]IMAGE"
            )));
        }
        let source = if let Some(size) = source.strip_prefix("mem:") {
            Source::Mem(parse_size(size).map_err(|e| {
                SpecError(format!("export {name:?}: bad memory size {size:?}: {e}"))
            })?)
        } else if let Some(rbd) = source.strip_prefix("rbd:") {
            Source::Rbd(
                rbd.parse()
                    .map_err(|e| SpecError(format!("export {name:?}: {e}")))?,
            )
        } else {
            Source::File(PathBuf::from(source))
        };
        Ok(Self {
            name: name.to_owned(),
            source,
        })
    }
}

/// Checks an export name as clients will send it: non-empty UTF-8 within
/// the spec's 4096 bytes, without NUL, `=` or control characters.
///
/// # Errors
///
/// A message naming the problem.
pub fn check_export_name(name: &str) -> Result<(), SpecError> {
    if name.is_empty() {
        return Err(SpecError("export name is empty".into()));
    }
    if name.len() > braid_proto::wire::MAX_STRING_LEN {
        return Err(SpecError(format!(
            "export name of {} bytes is longer than NBD's 4096",
            name.len()
        )));
    }
    if name.chars().any(|c| c.is_control() || c == '=') {
        return Err(SpecError(format!(
            "export name {name:?} contains '=' or a control character"
        )));
    }
    Ok(())
}

/// Parses `4096`, `512K`, `64MiB`, `1G`, `1.5GiB`, `2T`: binary units (K =
/// KiB = 1024), an optional `B`, decimals allowed when the result is whole.
///
/// # Errors
///
/// A message saying what is wrong.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err("expected a number, e.g. 1GiB".into());
    }
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        other => {
            return Err(format!(
                "unknown unit {other:?}; use K, M, G, T (powers of 1024)"
            ))
        }
    };
    let scale = 1u128 << shift;
    let bytes = if let Some((whole, frac)) = num.split_once('.') {
        let whole: u128 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| "bad number".to_string())?
        };
        let digits = frac.len() as u32;
        if digits > 9 {
            return Err("too many decimal places".into());
        }
        let frac_v: u128 = frac.parse().map_err(|_| "bad number".to_string())?;
        let den = 10u128.pow(digits);
        let total = whole * scale * den + frac_v * scale;
        if !total.is_multiple_of(den) {
            return Err("not a whole number of bytes".into());
        }
        total / den
    } else {
        num.parse::<u128>().map_err(|_| "bad number".to_string())? * scale
    };
    u64::try_from(bytes).map_err(|_| "larger than 16 EiB".to_string())
}

/// `1073741824` → `1 GiB`, for logs and listings.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 || v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[unit])
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

impl Source {
    /// A short description for logs: the path, or `memory`.
    pub fn describe(&self) -> String {
        match self {
            Self::File(p) => p.display().to_string(),
            Self::Mem(size) => format!("memory ({})", format_size(*size)),
            Self::Rbd(spec) => spec.to_string(),
        }
    }

    /// The path, for file sources.
    pub fn path(&self) -> Option<&Path> {
        match self {
            Self::File(p) => Some(p),
            Self::Mem(_) | Self::Rbd(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1.5K"), Ok(1536));
        assert_eq!(parse_size("512 KiB"), Ok(512 << 10));
        assert!(parse_size("1.1B").is_err());
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("3 furlongs").is_err());
        assert!(parse_size("99999999P").is_err());
        assert_eq!(format_size(1 << 30), "1 GiB");
        assert_eq!(format_size(1536), "1.50 KiB");
        assert_eq!(format_size(10), "10 B");
    }

    #[test]
    fn export_specs() {
        assert_eq!(
            "vol=mem:1GiB".parse::<ExportSpec>().unwrap(),
            ExportSpec {
                name: "vol".into(),
                source: Source::Mem(1 << 30)
            }
        );
        assert_eq!(
            "d=/dev/sdb".parse::<ExportSpec>().unwrap().source,
            Source::File("/dev/sdb".into())
        );
        assert_eq!(
            "v=rbd:pool/img@snap".parse::<ExportSpec>().unwrap().source,
            Source::Rbd(RbdSpec {
                pool: "pool".into(),
                namespace: None,
                image: "img".into(),
                snap: Some("snap".into())
            })
        );
        for (spec, rbd_name) in [
            ("rbd:p/ns/img", "p/ns/img"),
            ("rbd:p/ns/img@s", "p/ns/img"),
            ("rbd:p/img@s", "p/img"),
        ] {
            let Source::Rbd(parsed) = format!("v={spec}").parse::<ExportSpec>().unwrap().source
            else {
                panic!("{spec} is no rbd: source");
            };
            assert_eq!(
                parsed.to_string(),
                spec,
                "written back as the rbd command does"
            );
            assert_eq!(parsed.rbd_name(), rbd_name);
        }
        assert_eq!(
            "v=rbd:rbd/vol"
                .parse::<ExportSpec>()
                .unwrap()
                .source
                .describe(),
            "rbd:rbd/vol"
        );
        for bad in [
            "vol",
            "=x",
            "vol=",
            "vol=mem:lots",
            "a\tb=/x",
            "v=rbd:vol",
            "v=rbd:/vol",
            "v=rbd:p/",
            "v=rbd:p//vol",
            "v=rbd:p/ns/vol/x",
            "v=rbd:p/ns/",
            "v=rbd:p/vol@",
        ] {
            let e = bad.parse::<ExportSpec>().unwrap_err();
            assert!(!e.0.is_empty(), "{bad}");
        }
    }
}
