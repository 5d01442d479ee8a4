//! iSCSI URIs in libiscsi's form, so users can paste what they already
//! have: `iscsi://[USER[%PASSWORD]@]HOST[:PORT]/TARGET-IQN/LUN`, with
//! `:` accepted between user and password as well, and mutual CHAP's
//! target credentials as `?target_user=NAME&target_password=SECRET`.

use std::net::SocketAddr;

use super::{percent_decode, resolve_host_port};

/// The port iSCSI targets listen on unless told otherwise.
pub const DEFAULT_PORT: u16 = 3260;

/// A parsed iSCSI URI.
#[derive(Clone, PartialEq, Eq)]
pub struct IscsiUri {
    pub portal: SocketAddr,
    /// The host as written.
    pub host: String,
    pub target: String,
    pub lun: u16,
    /// CHAP user and secret, when the URI carries them.
    pub user: Option<String>,
    pub password: Option<String>,
    /// Mutual CHAP: the target's name and secret.
    pub target_user: Option<String>,
    pub target_password: Option<String>,
}

impl std::fmt::Debug for IscsiUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Secrets never reach a log.
        write!(f, "{self}")
    }
}

impl std::fmt::Display for IscsiUri {
    /// The URI without its secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "iscsi://")?;
        if let Some(u) = &self.user {
            write!(f, "{u}@")?;
        }
        write!(f, "{}/{}/{}", self.portal, self.target, self.lun)
    }
}

impl std::str::FromStr for IscsiUri {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!(
                "{:?} is not an iSCSI URI ({why}); write \
                 iscsi://[USER[%PASSWORD]@]HOST[:PORT]/TARGET-IQN/LUN",
                redact(s)
            )
        };
        let rest = s
            .strip_prefix("iscsi://")
            .ok_or_else(|| bad("no iscsi:// scheme"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (userinfo, rest) = match rest.rsplit_once('@') {
            Some((u, r)) => (Some(u), r),
            None => (None, rest),
        };
        let mut parts = rest.splitn(3, '/');
        let authority = parts.next().unwrap_or_default();
        let target = parts
            .next()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| bad("no target IQN"))?;
        let lun = parts
            .next()
            .ok_or_else(|| bad("no LUN"))?
            .trim_end_matches('/')
            .parse::<u16>()
            .ok()
            .filter(|l| *l < 16384)
            .ok_or_else(|| bad("the LUN is not a number from 0 to 16383"))?;
        let target = percent_decode(target).ok_or_else(|| bad("bad %-escape in the target"))?;
        let portal = resolve_host_port(authority, DEFAULT_PORT).map_err(|e| bad(&e))?;
        let (user, password) = match userinfo {
            None => (None, None),
            Some(u) => {
                let (user, pw) = match u.split_once(['%', ':']) {
                    Some((a, b)) => (a, Some(b)),
                    None => (u, None),
                };
                if user.is_empty() {
                    return Err(bad("an empty user name"));
                }
                (
                    Some(percent_decode(user).ok_or_else(|| bad("bad %-escape in the user"))?),
                    pw.map(|p| {
                        percent_decode(p).ok_or_else(|| bad("bad %-escape in the password"))
                    })
                    .transpose()?,
                )
            }
        };
        let mut target_user = None;
        let mut target_password = None;
        for kv in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|kv| !kv.is_empty())
        {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| bad("a query item without ="))?;
            let v = percent_decode(v).ok_or_else(|| bad("bad %-escape in the query"))?;
            match k {
                "target_user" => target_user = Some(v),
                "target_password" => target_password = Some(v),
                other => return Err(bad(&format!("unknown parameter {other:?}"))),
            }
        }
        Ok(Self {
            portal,
            host: authority
                .rsplit_once(':')
                .filter(|(h, p)| !h.ends_with(':') && p.chars().all(|c| c.is_ascii_digit()))
                .map_or(authority, |(h, _)| h)
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            target,
            lun,
            user,
            password,
            target_user,
            target_password,
        })
    }
}

/// `s` with anything between `://` and `@` and every query value
/// replaced, for error messages.
fn redact(s: &str) -> String {
    let s = match (s.find("://"), s.rfind('@')) {
        (Some(a), Some(b)) if a + 3 <= b => format!("{}***{}", &s[..a + 3], &s[b..]),
        _ => s.to_owned(),
    };
    match s.split_once('?') {
        Some((head, _)) => format!("{head}?***"),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libiscsi_uris_parse() {
        let u: IscsiUri = "iscsi://127.0.0.1/iqn.2026-11.org.example:disk/1"
            .parse()
            .unwrap();
        assert_eq!(u.portal, "127.0.0.1:3260".parse().unwrap());
        assert_eq!(
            (u.target.as_str(), u.lun),
            ("iqn.2026-11.org.example:disk", 1)
        );
        assert_eq!(u.user, None);
        let u: IscsiUri = "iscsi://alice%s3cret@[::1]:3261/iqn.x:y/0".parse().unwrap();
        assert_eq!(u.portal, "[::1]:3261".parse().unwrap());
        assert_eq!(
            (u.user.as_deref(), u.password.as_deref()),
            (Some("alice"), Some("s3cret"))
        );
        assert_eq!(u.host, "::1");
        let u: IscsiUri =
            "iscsi://alice:p%40ss@10.0.0.1:3260/iqn.x:y/2?target_user=nas&target_password=t%26s"
                .parse()
                .unwrap();
        assert_eq!(u.password.as_deref(), Some("p@ss"));
        assert_eq!(
            (u.target_user.as_deref(), u.target_password.as_deref()),
            (Some("nas"), Some("t&s"))
        );
        assert_eq!(u.to_string(), "iscsi://alice@10.0.0.1:3260/iqn.x:y/2");
        assert_eq!(format!("{u:?}"), u.to_string(), "no secret in Debug");
        let u: IscsiUri = "iscsi://bob@10.0.0.1/iqn.x:y/3/".parse().unwrap();
        assert_eq!(
            (u.user.as_deref(), u.password, u.lun),
            (Some("bob"), None, 3)
        );
    }

    #[test]
    fn mistakes_say_what_to_write_and_hide_secrets() {
        for bad in [
            "iscsi://10.0.0.1/iqn.x:y",
            "iscsi://10.0.0.1//0",
            "iscsi://10.0.0.1/iqn.x:y/lun",
            "iscsi://10.0.0.1/iqn.x:y/99999",
            "iscsi:///iqn.x:y/0",
            "nbd://10.0.0.1/vol",
            "iscsi://:pw@10.0.0.1/iqn.x:y/0",
            "iscsi://10.0.0.1/iqn.x:y/0?color=red",
        ] {
            let e = bad.parse::<IscsiUri>().unwrap_err();
            assert!(e.contains("iscsi://[USER[%PASSWORD]@]HOST"), "{bad}: {e}");
        }
        let e = "iscsi://u%secret@10.0.0.1/iqn.x:y/x?target_password=hidden"
            .parse::<IscsiUri>()
            .unwrap_err();
        assert!(!e.contains("secret") && !e.contains("hidden"), "{e}");
    }
}
