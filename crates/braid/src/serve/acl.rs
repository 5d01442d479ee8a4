//! The iSCSI access list of `braid serve` (`--iscsi-acl FILE`, or
//! `iscsi_acl` in serve.toml): per-initiator CHAP credentials and exports,
//! discovery's own credential, and what initiators not listed get
//! (nothing, unless an `[unlisted]` table says). Read once at start,
//! checked whole: a mistake is refused with the file and line, and a file
//! holding secrets that others can read is refused as ssh refuses a key.
//!
//! ```toml
//! [discovery]
//! user = "discovery"
//! secret = "discovery-secret"
//!
//! [[initiator]]
//! name = "iqn.1994-05.com.redhat:web1"
//! user = "web1"
//! secret = "web1-chap-secret"
//! target_user = "braid"              # mutual CHAP (optional)
//! target_secret = "braid-proves-itself"
//! exports = ["vol0"]                 # default: every export
//! ```

use std::collections::HashSet;
use std::path::Path;

use anyhow::Result;
use braid_iscsi::access::{Access, Entry, Grant};
use braid_iscsi::chap::Credentials;
use serde::Deserialize;
use toml::Spanned;

use crate::cli::UsageError;
use crate::config::check_secret;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AclFile {
    discovery: Option<GrantFile>,
    unlisted: Option<GrantFile>,
    #[serde(default, rename = "initiator")]
    initiators: Vec<GrantFile>,
}

/// An `[[initiator]]`, `[unlisted]` or `[discovery]` table (the last two
/// without a name, discovery without exports).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantFile {
    name: Option<Spanned<String>>,
    user: Option<Spanned<String>>,
    secret: Option<Spanned<String>>,
    target_user: Option<Spanned<String>>,
    target_secret: Option<Spanned<String>>,
    exports: Option<Vec<Spanned<String>>>,
}

/// Where in the file a value was, for messages.
struct Place<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Place<'_> {
    fn err<T>(&self, at: &Spanned<T>, why: impl std::fmt::Display) -> anyhow::Error {
        let line = self.text[..at.span().start].matches('\n').count() + 1;
        UsageError(format!("{}, line {line}: {why}", self.path.display())).into()
    }

    fn whole(&self, why: impl std::fmt::Display) -> anyhow::Error {
        UsageError(format!("{}: {why}", self.path.display())).into()
    }
}

/// Reads the access list at `path` for a server whose exports are
/// `exports`, whose target names `target_name` makes of an export's name.
pub fn read(
    path: &Path,
    exports: &HashSet<String>,
    target_name: impl Fn(&str) -> String,
) -> Result<Access> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        UsageError(format!(
            "reading the iSCSI access list {}: {e}",
            path.display()
        ))
    })?;
    let at = Place { path, text: &text };
    let f: AclFile = toml::from_str(&text).map_err(|e| at.whole(e))?;
    let targets = |g: &GrantFile| -> Result<Option<Vec<String>>> {
        let Some(list) = &g.exports else {
            return Ok(None);
        };
        list.iter()
            .map(|e| {
                if exports.contains(e.get_ref()) {
                    Ok(target_name(e.get_ref()))
                } else {
                    let mut known: Vec<&String> = exports.iter().collect();
                    known.sort();
                    Err(at.err(
                        e,
                        format!(
                            "export {:?} is not served here (exports: {known:?})",
                            e.get_ref()
                        ),
                    ))
                }
            })
            .collect::<Result<_>>()
            .map(Some)
    };
    let mut initiators: Vec<Entry> = Vec::new();
    for g in &f.initiators {
        let Some(name) = &g.name else {
            return Err(at.whole("an [[initiator]] without a name (its InitiatorName)"));
        };
        braid_iscsi::names::check(name.get_ref())
            .map_err(|e| at.err(name, format!("initiator {:?} {e}", name.get_ref())))?;
        if initiators
            .iter()
            .any(|e| e.initiator.eq_ignore_ascii_case(name.get_ref()))
        {
            return Err(at.err(
                name,
                format!("initiator {:?} is listed twice", name.get_ref()),
            ));
        }
        initiators.push(Entry {
            initiator: name.get_ref().clone(),
            grant: Grant {
                chap: credentials(&at, g)?,
                targets: targets(g)?,
            },
        });
    }
    let others = match &f.unlisted {
        Some(g) => {
            if let Some(n) = &g.name {
                return Err(at.err(
                    n,
                    "[unlisted] takes no name: it is every initiator not listed",
                ));
            }
            Some(Grant {
                chap: credentials(&at, g)?,
                targets: targets(g)?,
            })
        }
        None => None,
    };
    let discovery = match &f.discovery {
        Some(g) => {
            if let Some(n) = &g.name {
                return Err(at.err(n, "[discovery] takes no name"));
            }
            if let Some(e) = g.exports.as_ref().and_then(|e| e.first()) {
                return Err(at.err(
                    e,
                    "[discovery] takes no exports: each initiator's own decide what it lists",
                ));
            }
            let c = credentials(&at, g)?;
            if c.is_none() {
                return Err(at.whole("[discovery] needs user and secret"));
            }
            c
        }
        None => None,
    };
    let access = Access {
        initiators,
        others,
        discovery,
    };
    if access.any_chap() {
        private(path)?;
    }
    Ok(access)
}

/// A table's CHAP credentials: user and secret, or neither; mutual CHAP's
/// target_user and target_secret both, or neither.
fn credentials(at: &Place, g: &GrantFile) -> Result<Option<Credentials>> {
    let secret = |s: &Spanned<String>, what: &str| {
        check_secret(what, s.get_ref()).map_err(|why| at.err(s, why))
    };
    let pair = |u: &Option<Spanned<String>>, s: &Option<Spanned<String>>, names: (&str, &str)| {
        match (u, s) {
            (Some(u), Some(s)) => Ok(Some((u.get_ref().clone(), secret(s, names.1)?))),
            (None, None) => Ok(None),
            (Some(v), None) | (None, Some(v)) => Err(at.err(
                v,
                format!(
                    "{} and {} go together: give both or neither",
                    names.0, names.1
                ),
            )),
        }
    };
    let Some((user, secret)) = pair(&g.user, &g.secret, ("user", "secret"))? else {
        if let Some(v) = g.target_user.as_ref().or(g.target_secret.as_ref()) {
            return Err(at.err(v, "mutual CHAP needs the initiator's user and secret too"));
        }
        return Ok(None);
    };
    let mutual = pair(
        &g.target_user,
        &g.target_secret,
        ("target_user", "target_secret"),
    )?;
    if let (Some((_, s)), Some(at_s)) = (&mutual, &g.target_secret) {
        if *s == secret {
            return Err(at.err(at_s, "target_secret must differ from secret (RFC 7143)"));
        }
    }
    Ok(Some(Credentials {
        user,
        secret,
        mutual,
    }))
}

/// Refuses a file of secrets that users other than its owner may read.
fn private(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map_err(|e| UsageError(format!("{}: {e}", path.display())))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(UsageError(format!(
            "{}: holds CHAP secrets but its mode is {:04o}, open to users other than its owner; \
             chmod 600 {0}",
            path.display(),
            mode & 0o7777
        ))
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn exports() -> HashSet<String> {
        ["vol0".to_owned(), "vol1".to_owned()].into()
    }

    fn write(dir: &Path, body: &str, mode: u32) -> std::path::PathBuf {
        let p = dir.join("acl.toml");
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn refused(body: &str, mode: u32) -> String {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), body, mode);
        read(&p, &exports(), |e| format!("iqn.x:{e}"))
            .unwrap_err()
            .to_string()
    }

    const ENTRY: &str = "[[initiator]]\nname = \"iqn.2026-11.org.example:a\"\n\
                         user = \"a\"\nsecret = \"twelve-bytes\"\n";

    #[test]
    fn a_list_reads_into_entries_with_target_names() {
        let dir = tempfile::tempdir().unwrap();
        let body = format!(
            "{ENTRY}exports = [\"vol1\"]\n[unlisted]\nexports = [\"vol0\"]\n\
             [discovery]\nuser = \"d\"\nsecret = \"discovery-secret\"\n"
        );
        let p = write(dir.path(), &body, 0o600);
        let a = read(&p, &exports(), |e| format!("iqn.x:{e}")).unwrap();
        assert!(a.sees("iqn.2026-11.org.example:a", "iqn.x:vol1"));
        assert!(!a.sees("iqn.2026-11.org.example:a", "iqn.x:vol0"));
        assert!(a.sees("iqn.2026-11.org.example:b", "iqn.x:vol0"));
        assert_eq!(a.discovery.as_ref().map(|c| c.user.as_str()), Some("d"));
        // Secrets stay out of what a log would print.
        assert!(!format!("{a:?}").contains("twelve-bytes"), "{a:?}");
    }

    #[test]
    fn mistakes_are_refused_with_the_file_and_line() {
        let e = refused(ENTRY, 0o644);
        assert!(
            e.contains("acl.toml: holds CHAP secrets but its mode is 0644")
                && e.contains("chmod 600"),
            "{e}"
        );
        let e = refused(&ENTRY.replace("twelve-bytes", "eleven-byte"), 0o600);
        assert!(
            e.contains(
                "acl.toml, line 4: secret is 11 bytes; CHAP secrets must be 12 to 255 bytes"
            ),
            "{e}"
        );
        let e = refused(&format!("{ENTRY}exports = [\"vol9\"]\n"), 0o600);
        assert!(
            e.contains("line 5: export \"vol9\" is not served here"),
            "{e}"
        );
        let e = refused(&format!("{ENTRY}{ENTRY}"), 0o600);
        assert!(
            e.contains("line 6: initiator \"iqn.2026-11.org.example:a\" is listed twice"),
            "{e}"
        );
        let e = refused("[[initiator]]\nname = \"host a\"\n", 0o600);
        assert!(e.contains("line 2: initiator \"host a\""), "{e}");
        let e = refused(
            "[[initiator]]\nname = \"iqn.2026-11.org.example:a\"\nuser = \"a\"\n",
            0o600,
        );
        assert!(e.contains("line 3: user and secret go together"), "{e}");
        let e = refused(
            &format!("{ENTRY}target_user = \"t\"\ntarget_secret = \"twelve-bytes\"\n"),
            0o600,
        );
        assert!(e.contains("line 6: target_secret must differ"), "{e}");
        // No secrets: nothing to hide, any mode.
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            "[[initiator]]\nname = \"iqn.2026-11.org.example:a\"\n",
            0o644,
        );
        assert!(read(&p, &exports(), |e| e.to_owned()).is_ok());
    }
}
