//! Where `get` writes: stdout, or a file that appears only once it is complete.
//!
//! A download into a file goes to a hidden temporary sibling and is renamed over the target
//! at the end, so an interrupted transfer never leaves a truncated file under the real name
//! (and never destroys an existing one). Writing to stdout treats a closed pipe
//! (`yutu get b/k | head`) as the reader being done, not as a failure.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// A file being written under a temporary name; removed on drop unless committed.
pub struct PendingFile {
    temp: PathBuf,
    target: PathBuf,
    file: Option<BufWriter<File>>,
}

impl PendingFile {
    pub fn create(target: &Path) -> Result<PendingFile> {
        let name = target
            .file_name()
            .with_context(|| format!("{} is not a file name", target.display()))?;
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".yutu-{}.part", std::process::id()));
        let temp = target.with_file_name(temp_name);
        let file = File::create(&temp).with_context(|| format!("creating {}", temp.display()))?;
        Ok(PendingFile {
            temp,
            target: target.to_path_buf(),
            file: Some(BufWriter::with_capacity(1 << 20, file)),
        })
    }

    /// Flushes and moves the file to its real name.
    pub fn commit(mut self) -> Result<()> {
        if let Some(w) = self.file.take() {
            let file = w
                .into_inner()
                .map_err(|e| e.into_error())
                .with_context(|| format!("writing {}", self.temp.display()))?;
            file.sync_all()
                .with_context(|| format!("syncing {}", self.temp.display()))?;
        }
        std::fs::rename(&self.temp, &self.target).with_context(|| {
            format!(
                "renaming {} to {}",
                self.temp.display(),
                self.target.display()
            )
        })
    }
}

impl Write for PendingFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.file {
            Some(f) => f.write(buf),
            None => Err(io::Error::other("file already committed")),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.file {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

impl Drop for PendingFile {
    fn drop(&mut self) {
        if self.file.is_some() {
            self.file = None;
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// Stdout that remembers whether the reader went away.
pub struct Stdout {
    out: BufWriter<io::StdoutLock<'static>>,
    closed: bool,
}

impl Stdout {
    pub fn new() -> Stdout {
        Stdout {
            out: BufWriter::with_capacity(1 << 16, io::stdout().lock()),
            closed: false,
        }
    }

    /// True once a write failed because nobody reads stdout any more.
    pub fn closed(&self) -> bool {
        self.closed
    }

    /// Flushes; a closed pipe is not an error.
    pub fn finish(mut self) -> io::Result<()> {
        match self.flush() {
            Err(_) if self.closed => Ok(()),
            other => other,
        }
    }

    fn note<T>(&mut self, r: io::Result<T>) -> io::Result<T> {
        if let Err(e) = &r {
            if e.kind() == io::ErrorKind::BrokenPipe {
                self.closed = true;
            }
        }
        r
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let r = self.out.write(buf);
        self.note(r)
    }

    fn flush(&mut self) -> io::Result<()> {
        let r = self.out.flush();
        self.note(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("yutu-sink-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn committed_file_appears_whole() {
        let dir = scratch_dir("commit");
        let target = dir.join("out.bin");
        let mut f = PendingFile::create(&target).unwrap();
        f.write_all(b"data").unwrap();
        assert!(!target.exists());
        f.commit().unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"data");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn dropped_file_leaves_nothing_and_keeps_the_old_one() {
        let dir = scratch_dir("drop");
        let target = dir.join("out.bin");
        std::fs::write(&target, b"old").unwrap();
        let mut f = PendingFile::create(&target).unwrap();
        f.write_all(b"partial").unwrap();
        drop(f);
        assert_eq!(std::fs::read(&target).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
