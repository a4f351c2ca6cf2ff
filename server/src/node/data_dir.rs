//! The data directory holds tenants' bytes (`nvme.img`, the bucket catalog, the node's token
//! key), so nobody but the node's own user may read it, whatever the umask it was started
//! with: the directory is 0700 and its files 0600.
//!
//! [`secure`] runs once at start, before anything is written: it sets the process umask to
//! 077 (everything the node creates later, in any thread, is private), creates the directory
//! 0700, and tightens what an earlier start (or an operator) left open to the group or to
//! others, saying in the log what it changed. A file outside the directory (an `--nvme` path
//! elsewhere) is tightened the same way when it is a regular file; a block device's mode is
//! the operator's (udev rules), so it only draws a warning.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode bits that let the group or others in.
const OPEN_BITS: u32 = 0o077;

/// Why the data directory cannot be made private.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct DataDirError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// What [`secure`] changed: paths whose group or other permissions it removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Tightened {
    pub paths: Vec<PathBuf>,
}

/// Sets the umask to 077, creates `dir` (0700) if needed, and removes group and other
/// permissions from it and everything under it, and from `extra` files (the NVMe file when it
/// lives elsewhere).
pub fn secure(dir: &Path, extra: &[&Path]) -> Result<Tightened, DataDirError> {
    // SAFETY: umask only sets the process's file-creation mask; it touches no memory and
    // cannot fail. Called before the shards start, it covers every file the node creates.
    unsafe {
        libc::umask(OPEN_BITS as libc::mode_t);
    }
    let err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DataDirError { path, source }
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(err(dir))?;
    let mut tightened = Tightened::default();
    tighten_tree(dir, &mut tightened)?;
    for path in extra {
        match std::fs::metadata(path) {
            Ok(m) if m.is_file() => tighten(path, &m, &mut tightened)?,
            Ok(m) if m.permissions().mode() & OPEN_BITS != 0 => tracing::warn!(
                path = %path.display(), mode = format!("{:o}", m.permissions().mode() & 0o777),
                "the NVMe device is open to other users of this host: they can read stored objects"
            ),
            // Missing: it is created later, under the umask.
            _ => {}
        }
    }
    for path in &tightened.paths {
        tracing::warn!(
            path = %path.display(),
            "was readable or writable by other users of this host: tightened to owner-only"
        );
    }
    Ok(tightened)
}

/// [`tighten`] on `dir` and, recursively, on what it holds (symbolic links are not followed:
/// their targets are not the node's).
fn tighten_tree(dir: &Path, out: &mut Tightened) -> Result<(), DataDirError> {
    let err = |source| DataDirError {
        path: dir.to_path_buf(),
        source,
    };
    let meta = std::fs::symlink_metadata(dir).map_err(err)?;
    tighten(dir, &meta, out)?;
    for entry in std::fs::read_dir(dir).map_err(err)? {
        let entry = entry.map_err(err)?;
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).map_err(|source| DataDirError {
            path: path.clone(),
            source,
        })?;
        if meta.is_dir() {
            tighten_tree(&path, out)?;
        } else if meta.is_file() {
            tighten(&path, &meta, out)?;
        }
    }
    Ok(())
}

fn tighten(path: &Path, meta: &std::fs::Metadata, out: &mut Tightened) -> Result<(), DataDirError> {
    let mode = meta.permissions().mode();
    if mode & OPEN_BITS == 0 {
        return Ok(());
    }
    std::fs::set_permissions(
        path,
        std::fs::Permissions::from_mode(mode & !OPEN_BITS & 0o7777),
    )
    .map_err(|source| DataDirError {
        path: path.to_path_buf(),
        source,
    })?;
    out.paths.push(path.to_path_buf());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_directories_and_files_are_tightened_and_new_files_are_private() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let file = dir.join("buckets.json");
        std::fs::write(&file, b"{}").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let outside = root.path().join("nvme.img");
        std::fs::write(&outside, b"").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o666)).unwrap();

        let t = secure(&dir, &[&outside]).unwrap();
        assert_eq!(t.paths, vec![dir.clone(), file.clone(), outside.clone()]);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            (mode(&dir), mode(&file), mode(&outside)),
            (0o700, 0o600, 0o600)
        );
        // Under the new umask, what the node creates is private.
        let new = dir.join("new");
        std::fs::write(&new, b"x").unwrap();
        assert_eq!(mode(&new), 0o600);
        assert_eq!(secure(&dir, &[]).unwrap(), Tightened::default());
    }
}
