//! Replacing a small state file so that a power cut leaves either the old
//! text or the new, never a mix: written beside it, synced, renamed over
//! it, and its directory synced.

use std::io::{self, Write};
use std::path::Path;

/// Replaces `path`'s contents with `text`; `before_sync` runs between the
/// write and its fsync (a test's slow disk).
pub(crate) fn replace(path: &Path, text: &[u8], before_sync: impl FnOnce()) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("new");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text)?;
    before_sync();
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}
