//! Checks of the volume's shape that no single module's tests can make.

use std::path::Path;

/// Everything of `text` but its comments and its `#[cfg(test)]`
/// items (each to the brace that closes it, so code after a test
/// module is still read).
fn code(text: &str) -> String {
    let text: Vec<&str> = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect();
    let mut out = String::new();
    let mut rest = text.join("\n");
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let mut depth = 0usize;
        let mut end = item.len();
        for (i, c) in item.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 1 => {
                    end = i + 1;
                    break;
                }
                '}' => depth = depth.saturating_sub(1),
                ';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
        }
        // Lines stay where they were, for the message.
        out.extend(item[..end].chars().filter(|&c| c == '\n'));
        rest = item[end..].to_owned();
    }
    out.push_str(&rest);
    out
}

/// The volume's middle (its core, recovery, opening, events, reports,
/// this trait) names no protocol: a new one is a module of its own
/// beside `nbd.rs` and `iscsi/`, and an arm where `Volume::open`
/// reads the URI.
#[test]
fn the_volumes_middle_names_no_protocol() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/volume");
    let middle = [
        "core.rs",
        "core/reads.rs",
        "recover.rs",
        "open.rs",
        "report.rs",
        "events.rs",
        "timeline.rs",
        "admin.rs",
        "transport.rs",
        "link.rs",
    ];
    let words = ["nbd", "Nbd", "iscsi", "Iscsi", "ConnHandle", "Isid"];
    let mut found = Vec::new();
    for file in middle {
        let text = std::fs::read_to_string(dir.join(file)).expect("a volume module");
        for (n, line) in code(&text).lines().enumerate() {
            if let Some(w) = words.iter().find(|w| line.contains(*w)) {
                found.push(format!("volume/{file}:{}: {w}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "the volume's middle names a protocol (move it to that protocol's transport):\n{}",
        found.join("\n")
    );
}
