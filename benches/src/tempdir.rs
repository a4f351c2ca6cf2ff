//! Scratch directories that disappear with the run.
//!
//! A dozen lines instead of the `tempfile` crate: the bench needs only "a fresh directory under
//! this parent, removed on drop", and every crate added here lands in the workspace lock file.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;

/// A directory this process created; removed, with everything in it, when dropped.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Creates `<parent>/<prefix><pid>-<nanos>`; fails rather than reuse an existing directory.
    pub fn new_in(parent: &Path, prefix: &str) -> anyhow::Result<Self> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let mut last_err = None;
        for attempt in 0..16u32 {
            let name = format!(
                "{prefix}{}-{}",
                std::process::id(),
                nanos.wrapping_add(attempt)
            );
            let path = parent.join(name);
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir { path }),
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.map_or_else(|| anyhow::anyhow!("no attempt made"), anyhow::Error::from))
            .with_context(|| format!("creating a scratch directory in {}", parent.display()))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_on_drop() {
        let dir = TempDir::new_in(&std::env::temp_dir(), "yutu-bench-test-").expect("create");
        let path = dir.path().to_owned();
        std::fs::write(path.join("f"), b"x").expect("write");
        drop(dir);
        assert!(!path.exists());
    }
}
