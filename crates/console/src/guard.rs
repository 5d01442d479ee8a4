//! Who may read the console and who may act through it, decided from a
//! request's head alone (no I/O, so every rule is tested here):
//!
//! - reads need no token while the listener is on loopback, but the Host
//!   header must then name loopback, so a page elsewhere cannot reach the
//!   console by pointing a name of its own at 127.0.0.1 (DNS rebinding);
//!   on any other address they need the token;
//! - actions are off unless a token was configured, need the token in a
//!   header (never a cookie or the URL: a browser adds neither to a
//!   forged cross-site request), and are refused from another origin
//!   (`Origin`, `Sec-Fetch-Site`).

use hyper::header::{HeaderMap, AUTHORIZATION, HOST, ORIGIN};
use hyper::StatusCode;

/// The header the page sends the token in.
pub const TOKEN_HEADER: &str = "x-braid-token";

/// Why a request was refused; its text is what the client is told.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("this console needs its token: open it as /?token=TOKEN (the contents of the --http-token file)")]
    NeedToken,
    #[error("wrong token")]
    BadToken,
    #[error(
        "this console listens on a non-loopback address and has no token, so it shows nothing \
         here: start the daemon with --http-token FILE, or listen on 127.0.0.1"
    )]
    NoTokenConfigured,
    #[error("Host {0:?} is not a loopback name: open the console as http://127.0.0.1:PORT/")]
    ForeignHost(String),
    #[error("actions are off: start the daemon with --http-token FILE to allow them")]
    ActionsOff,
    #[error("an action needs the token in the X-Braid-Token header")]
    TokenNotInHeader,
    #[error("refused: the request came from another site ({0})")]
    CrossOrigin(String),
}

impl Denied {
    pub fn status(&self) -> StatusCode {
        match self {
            Self::NeedToken | Self::BadToken | Self::TokenNotInHeader => StatusCode::UNAUTHORIZED,
            _ => StatusCode::FORBIDDEN,
        }
    }
}

/// The rules of one listener.
#[derive(Clone, Debug)]
pub struct Guard {
    token: Option<String>,
    loopback: bool,
    scheme: &'static str,
}

impl Guard {
    /// `loopback`: the listener's address is a loopback one.
    pub fn new(token: Option<String>, loopback: bool, tls: bool) -> Self {
        Self {
            token: token.filter(|t| !t.is_empty()),
            loopback,
            scheme: if tls { "https" } else { "http" },
        }
    }

    /// Whether actions can be allowed at all.
    pub fn actions_on(&self) -> bool {
        self.token.is_some()
    }

    /// May this request read pages and the push stream? `query` is the
    /// URL's query string.
    ///
    /// # Errors
    ///
    /// Why not.
    pub fn read(&self, headers: &HeaderMap, query: Option<&str>) -> Result<(), Denied> {
        let given = header_token(headers).or_else(|| query_token(query));
        match (&self.token, given) {
            (Some(want), Some(got)) if same(want, &got) => Ok(()),
            (_, Some(_)) => Err(Denied::BadToken),
            _ if self.loopback => {
                let host = host(headers);
                if loopback_host(&host) {
                    Ok(())
                } else {
                    Err(Denied::ForeignHost(host))
                }
            }
            (Some(_), None) => Err(Denied::NeedToken),
            (None, None) => Err(Denied::NoTokenConfigured),
        }
    }

    /// May this request act?
    ///
    /// # Errors
    ///
    /// Why not.
    pub fn action(&self, headers: &HeaderMap) -> Result<(), Denied> {
        let Some(want) = &self.token else {
            return Err(Denied::ActionsOff);
        };
        if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
            if !matches!(site, "same-origin" | "none") {
                return Err(Denied::CrossOrigin(format!("Sec-Fetch-Site: {site}")));
            }
        }
        if let Some(origin) = headers.get(ORIGIN) {
            let own = format!("{}://{}", self.scheme, host(headers));
            let origin = origin.to_str().unwrap_or("(not text)");
            if !origin.eq_ignore_ascii_case(&own) {
                return Err(Denied::CrossOrigin(format!("Origin: {origin}")));
            }
        }
        match header_token(headers) {
            Some(got) if same(want, &got) => Ok(()),
            Some(_) => Err(Denied::BadToken),
            None => Err(Denied::TokenNotInHeader),
        }
    }
}

fn host(headers: &HeaderMap) -> String {
    headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// `127.0.0.1:9810`, `[::1]:9810`, `localhost:9810`, with or without the
/// port.
fn loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn header_token(headers: &HeaderMap) -> Option<String> {
    let given = match headers.get(TOKEN_HEADER) {
        Some(t) => t.to_str().ok()?,
        None => headers
            .get(AUTHORIZATION)?
            .to_str()
            .ok()?
            .strip_prefix("Bearer ")?,
    };
    // An empty header is no token at all.
    Some(given.trim().to_owned()).filter(|t| !t.is_empty())
}

fn query_token(query: Option<&str>) -> Option<String> {
    query?
        .split('&')
        .find_map(|kv| kv.strip_prefix("token="))
        .map(percent_decode)
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (b[i], b.get(i + 1).copied(), b.get(i + 2).copied()) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b'+', _, _) => {
                out.push(b' ');
                i += 1;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Compares in time that does not depend on where they differ.
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn loopback_reads_are_open_to_loopback_hosts_only() {
        let g = Guard::new(None, true, false);
        for host in ["127.0.0.1:9810", "localhost:1", "[::1]:9810", "127.0.0.2"] {
            assert_eq!(g.read(&head(&[("host", host)]), None), Ok(()), "{host}");
        }
        let rebound = head(&[("host", "evil.example:9810")]);
        assert!(matches!(
            g.read(&rebound, None),
            Err(Denied::ForeignHost(_))
        ));
    }

    #[test]
    fn other_addresses_need_the_token_to_read() {
        let g = Guard::new(Some("s3cret".into()), false, false);
        let h = head(&[("host", "10.0.0.5:9810")]);
        assert_eq!(g.read(&h, None), Err(Denied::NeedToken));
        assert_eq!(g.read(&h, Some("a=1&token=s3cret")), Ok(()));
        assert_eq!(g.read(&h, Some("token=s3cre")), Err(Denied::BadToken));
        let bearer = head(&[("host", "x"), ("authorization", "Bearer s3cret")]);
        assert_eq!(g.read(&bearer, None), Ok(()));
        let none = Guard::new(None, false, false);
        assert_eq!(none.read(&h, None), Err(Denied::NoTokenConfigured));
        // Percent-encoded tokens are read as their characters.
        let g = Guard::new(Some("a/b+c".into()), false, false);
        assert_eq!(g.read(&h, Some("token=a%2Fb%2Bc")), Ok(()));
    }

    #[test]
    fn actions_need_a_token_in_a_header_from_the_same_origin() {
        let off = Guard::new(None, true, false);
        let same_origin = [
            ("host", "127.0.0.1:9810"),
            ("origin", "http://127.0.0.1:9810"),
            ("sec-fetch-site", "same-origin"),
        ];
        assert_eq!(off.action(&head(&same_origin)), Err(Denied::ActionsOff));
        let g = Guard::new(Some("tok".into()), true, false);
        assert_eq!(g.action(&head(&same_origin)), Err(Denied::TokenNotInHeader));
        let mut ok = same_origin.to_vec();
        ok.push(("x-braid-token", "tok"));
        assert_eq!(g.action(&head(&ok)), Ok(()));
        let mut wrong = same_origin.to_vec();
        wrong.push(("x-braid-token", "tik"));
        assert_eq!(g.action(&head(&wrong)), Err(Denied::BadToken));
        // A right token from another site is still refused.
        let forged = head(&[
            ("host", "127.0.0.1:9810"),
            ("origin", "http://evil.example"),
            ("x-braid-token", "tok"),
        ]);
        assert!(matches!(g.action(&forged), Err(Denied::CrossOrigin(_))));
        let cross = head(&[
            ("host", "127.0.0.1:9810"),
            ("sec-fetch-site", "cross-site"),
            ("x-braid-token", "tok"),
        ]);
        assert!(matches!(g.action(&cross), Err(Denied::CrossOrigin(_))));
        // Under TLS the page's own origin is https.
        let tls = Guard::new(Some("tok".into()), false, true);
        let h = head(&[
            ("host", "gw:9811"),
            ("origin", "https://gw:9811"),
            ("x-braid-token", "tok"),
        ]);
        assert_eq!(tls.action(&h), Ok(()));
        // A tool with no Origin (curl) acts with the token alone.
        assert_eq!(
            g.action(&head(&[("host", "127.0.0.1"), ("x-braid-token", "tok")])),
            Ok(())
        );
    }
}
