//! Uploading from stdin: spool to an unlinked temporary file first.
//!
//! S3's PutObject needs the length before the body, and a pipe has none until it ends.
//! Holding the data in memory would cap uploads at RAM size, so it goes to a temporary file
//! whose name is removed right after creation: the space is reclaimed when the process exits
//! however it exits, and nothing is left behind in the temp directory.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};

/// Copies `input` to an anonymous temporary file; returns it rewound, with its length.
pub fn spool(mut input: impl Read) -> Result<(File, u64)> {
    let path = temp_path();
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .with_context(|| format!("creating spool file {}", path.display()))?;
    // Unlink now; the open handle keeps the data reachable until we drop it.
    let _ = std::fs::remove_file(&path);
    let len = io::copy(&mut input, &mut file).context("reading stdin")?;
    file.seek(SeekFrom::Start(0))
        .context("rewinding spool file")?;
    Ok((file, len))
}

fn temp_path() -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    std::env::temp_dir().join(format!("yutu-stdin-{}-{nanos}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spools_and_rewinds() {
        let (mut f, len) = spool(&b"streamed data"[..]).unwrap();
        assert_eq!(len, 13);
        let mut back = String::new();
        f.read_to_string(&mut back).unwrap();
        assert_eq!(back, "streamed data");
    }
}
