//! `#[needs("root", "tgtd")]` on an integration test: the one way a test
//! says what it needs beyond cargo, in place of a `cfg_attr` per need and
//! a check at the top of its body.
//!
//! It expands to `#[test]` (unless the function names its own harness,
//! `#[tokio::test]`), one `#[cfg_attr(braid_skip = "NEED", ignore =
//! "REASON")]` per need (the test crate's `build.rs` sets `braid_skip`
//! for each need this machine lacks, and never under CI), so the harness
//! reports such a test as ignored with its reason rather than passed; and
//! a first statement `if !braid_lab::needs(&[...]) { return; }`,
//! which checks again at run time and, under CI, fails the test for a
//! missing need instead of skipping it.
//!
//! Written with `proc_macro` alone: the input is a list of string
//! literals and a function whose last brace group is its body.

use proc_macro::{Delimiter, Group, Span, TokenStream, TokenTree};

include!("needs.rs");

/// What each need asks of whoever runs the tests, as the ignore reason.
fn reason(need: &str) -> Option<String> {
    match need {
        "root" => Some(
            "needs root (namespaces, mounts, raw devices): run as root, or scripts/test-all".into(),
        ),
        "libiscsi-dev" => Some(
            "needs libiscsi's headers: install libiscsi-dev (scripts/test-all installs every \
             package the tests use)"
                .into(),
        ),
        t if TOOLS.contains(&t) || OTHERS.iter().any(|(n, _)| *n == t) => Some(format!(
            "needs {t}: install it (scripts/test-all installs every tool the tests use)"
        )),
        _ => None,
    }
}

fn error(msg: &str, span: Span) -> TokenStream {
    let mut e: TokenStream = format!("compile_error!({msg:?});").parse().expect("tokens");
    e = e
        .into_iter()
        .map(|mut t| {
            t.set_span(span);
            t
        })
        .collect();
    e
}

#[proc_macro_attribute]
pub fn needs(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut needs = Vec::new();
    for t in attr {
        match &t {
            TokenTree::Literal(l) => {
                let text = l.to_string();
                let Some(need) = text.strip_prefix('"').and_then(|s| s.strip_suffix('"')) else {
                    return error(
                        "#[needs] takes string literals: #[needs(\"root\", \"tgtd\")]",
                        l.span(),
                    );
                };
                if reason(need).is_none() {
                    return error(
                        &format!(
                            "#[needs]: {need:?} is not a need this workspace knows: add it to \
                             crates/test-needs/src/needs.rs"
                        ),
                        l.span(),
                    );
                }
                needs.push(need.to_owned());
            }
            TokenTree::Punct(p) if p.as_char() == ',' => {}
            other => return error("#[needs] takes string literals", other.span()),
        }
    }
    if needs.is_empty() {
        return error("#[needs] names at least one need", Span::call_site());
    }
    let mut attrs = String::new();
    for n in &needs {
        let r = reason(n).expect("checked above");
        attrs.push_str(&format!(
            "#[cfg_attr(braid_skip = {n:?}, ignore = {r:?})]\n"
        ));
    }
    let mut items: Vec<TokenTree> = item.into_iter().collect();
    // An async test names its own harness attribute (`#[tokio::test]`).
    let has_harness = items.windows(2).any(|w| {
        matches!((&w[0], &w[1]), (TokenTree::Punct(p), TokenTree::Group(g))
            if p.as_char() == '#' && g.delimiter() == Delimiter::Bracket
                && g.stream().to_string().replace(' ', "").starts_with("tokio::test"))
    });
    if !has_harness {
        attrs.push_str("#[test]\n");
    }
    let list: Vec<String> = needs.iter().map(|n| format!("{n:?}")).collect();
    let check: TokenStream = format!(
        "if !::braid_lab::needs(&[{}]) {{ return; }}",
        list.join(", ")
    )
    .parse()
    .expect("tokens");

    let Some(body) = items
        .iter()
        .rposition(|t| matches!(t, TokenTree::Group(g) if g.delimiter() == Delimiter::Brace))
    else {
        return error("#[needs] goes on a test function", Span::call_site());
    };
    let TokenTree::Group(g) = &items[body] else {
        unreachable!("found as a brace group")
    };
    let mut inner = check;
    inner.extend(g.stream());
    let mut with_check = Group::new(Delimiter::Brace, inner);
    with_check.set_span(g.span());
    items[body] = TokenTree::Group(with_check);

    let mut out: TokenStream = attrs.parse().expect("attributes");
    out.extend(items);
    out
}
