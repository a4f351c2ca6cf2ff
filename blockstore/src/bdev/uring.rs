//! The io_uring backend: a file or a raw block device opened with O_DIRECT through glommio's
//! [`DmaFile`].
//!
//! O_DIRECT moves blocks between the device and our (aligned) buffers without the page cache:
//! no second copy in the kernel, no write-back surprises, and `flush` (fdatasync) means what it
//! says. glommio submits the I/O on the shard's own io_uring and wakes the awaiting task from
//! its reactor, so many writes and reads can be in flight from one thread without blocking it.
//!
//! The backend refuses a path where O_DIRECT is silently unavailable (glommio falls back to
//! buffered I/O on tmpfs); a store whose flushes do not reach a disk would lie about
//! durability.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::io::{DmaBuffer, DmaFile, OpenOptions, ReadResult};

use super::{check_io, Bdev};
use crate::error::BdevError;

/// A file or block device accessed with O_DIRECT over io_uring. Open one per shard thread:
/// a `DmaFile` belongs to the executor that opened it.
pub struct UringBdev {
    file: DmaFile,
    path: PathBuf,
    block_size: usize,
    block_count: u64,
}

/// The bytes of a completed read; borrowed from glommio's buffer without a copy.
pub struct UringRead(ReadResult);

impl AsRef<[u8]> for UringRead {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl UringBdev {
    /// Opens an existing regular file or block device for reading and writing.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, BdevError> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .dma_open(path)
            .await
            .map_err(|e| BdevError::io("open", path.display().to_string(), e.into()))?;
        Self::from_file(file, path).await
    }

    /// Opens the regular file at `path`, first creating it and preallocating it to `size`
    /// bytes if it is missing or smaller. Existing contents are kept, so a restarted node
    /// finds its records. Preallocation (fallocate) reserves the extents up front, so a full
    /// file system shows up here rather than as a failed write much later.
    ///
    /// The preparation uses blocking system calls: it runs once, before the shard serves.
    /// With several shards on one file, call [`UringBdev::prepare_file`] once before starting
    /// them and [`UringBdev::open`] in each, so no shard prepares the file while another is
    /// already writing to it.
    pub async fn open_file(path: impl AsRef<Path>, size: u64) -> Result<Self, BdevError> {
        let path = path.as_ref();
        Self::prepare_file(path, size)?;
        Self::open(path).await
    }

    /// Creates the file at `path` (or grows it) to `size` bytes, preallocated, with its first
    /// block written (see the note on glommio's poll probe in the source). Blocking; for the
    /// process's start-up, before the shards' executors open the file.
    pub fn prepare_file(path: impl AsRef<Path>, size: u64) -> Result<(), BdevError> {
        let path = path.as_ref();
        prepare_file(path, size).map_err(|e| BdevError::io("create", path.display().to_string(), e))
    }

    async fn from_file(file: DmaFile, path: &Path) -> Result<Self, BdevError> {
        let name = path.display().to_string();
        let fd = file.as_raw_fd();
        let kind = device_kind(fd).map_err(|e| match e {
            SizeError::Io(source) => BdevError::io("stat", name.clone(), source),
            SizeError::Kind => BdevError::Unusable {
                path: path.to_owned(),
                reason: "neither a regular file nor a block device".to_owned(),
            },
        })?;
        // SAFETY: F_GETFL reads the open file description's flags; `fd` is open for the
        // lifetime of `file`.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(BdevError::io(
                "fcntl",
                name,
                std::io::Error::last_os_error(),
            ));
        }
        let (size, block_size) = match kind {
            DeviceKind::File { size } => {
                if flags & libc::O_DIRECT == 0 {
                    return Err(BdevError::NoDirectIo {
                        path: path.to_owned(),
                    });
                }
                (size, usize::try_from(file.alignment()).unwrap_or(4096))
            }
            DeviceKind::Block { size, logical } => {
                // glommio decides about O_DIRECT from the file system holding the path, and
                // a device node lives on devtmpfs, which it takes for tmpfs: set the flag
                // ourselves. The logical block size comes from the device, not from glommio
                // (which looks at the device holding the node).
                if flags & libc::O_DIRECT == 0 {
                    // SAFETY: F_SETFL on an open descriptor; no memory is passed.
                    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_DIRECT) } != 0 {
                        return Err(BdevError::NoDirectIo {
                            path: path.to_owned(),
                        });
                    }
                }
                (size, logical)
            }
        };
        let block_size = block_size.max(512);
        let block_count = size / block_size as u64;
        if block_count == 0 {
            return Err(BdevError::Unusable {
                path: path.to_owned(),
                reason: format!("{size} bytes is smaller than one {block_size}-byte block"),
            });
        }
        Ok(UringBdev {
            file,
            path: path.to_owned(),
            block_size,
            block_count,
        })
    }

    /// The path this device was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io_err(&self, op: &'static str, e: glommio::GlommioError<()>) -> BdevError {
        BdevError::io(op, self.path.display().to_string(), e.into())
    }
}

/// Creates or grows the file to `size` bytes with its first block really written.
///
/// The written first block matters: when glommio opens a file it probes whether the device
/// supports polled I/O by reading the file's first block on its poll ring, and it remembers
/// the answer for the whole device (per thread). On an empty file, or over a hole or an
/// unwritten extent, that read completes without touching the device and the probe wrongly
/// concludes "pollable"; every later read then fails with EOPNOTSUPP.
fn prepare_file(path: &Path, size: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    let current = file.metadata()?.len();
    if current >= size {
        return Ok(());
    }
    let len =
        libc::off_t::try_from(size).map_err(|_| std::io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: fallocate on an open descriptor; no memory is passed.
    if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EOPNOTSUPP) {
            return Err(err);
        }
        file.set_len(size)?;
    }
    if current == 0 {
        let first = vec![0u8; 4096.min(size as usize)];
        file.write_all_at(&first, 0)?;
    }
    file.sync_all()
}

enum SizeError {
    Io(std::io::Error),
    Kind,
}

enum DeviceKind {
    File { size: u64 },
    Block { size: u64, logical: usize },
}

/// Whether `fd` is a regular file or a block device, and its size (and, for a device, its
/// logical block size: BLKGETSIZE64 and BLKSSZGET).
fn device_kind(fd: libc::c_int) -> Result<DeviceKind, SizeError> {
    // SAFETY: an all-zero `stat` is a valid value of the plain C struct; fstat fills it.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is an open descriptor and `st` a valid, writable stat struct.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(SizeError::Io(std::io::Error::last_os_error()));
    }
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => Ok(DeviceKind::File {
            size: st.st_size as u64,
        }),
        libc::S_IFBLK => {
            let mut bytes: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points to a
            // live, writable u64.
            if unsafe { libc::ioctl(fd, BLKGETSIZE64, &mut bytes as *mut u64) } != 0 {
                return Err(SizeError::Io(std::io::Error::last_os_error()));
            }
            let mut logical: libc::c_int = 0;
            // SAFETY: BLKSSZGET writes one int through the pointer, which points to a live,
            // writable c_int.
            if unsafe { libc::ioctl(fd, BLKSSZGET, &mut logical as *mut libc::c_int) } != 0 {
                return Err(SizeError::Io(std::io::Error::last_os_error()));
            }
            Ok(DeviceKind::Block {
                size: bytes,
                logical: usize::try_from(logical).unwrap_or(512),
            })
        }
        _ => Err(SizeError::Kind),
    }
}

/// `_IOR(0x12, 114, size_t)`: the size of a block device in bytes (linux/fs.h).
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// `_IO(0x12, 104)`: the logical block size of a block device (linux/fs.h).
const BLKSSZGET: libc::c_ulong = 0x1268;

impl Bdev for UringBdev {
    type Buf = DmaBuffer;
    type ReadBuf = UringRead;

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn block_count(&self) -> u64 {
        self.block_count
    }

    fn name(&self) -> String {
        self.path.display().to_string()
    }

    fn alloc_buf(&self, len: usize) -> DmaBuffer {
        let mut buf = self.file.alloc_dma_buffer(len);
        // glommio hands out uninitialised memory; zero it so no stale heap bytes can reach
        // the disk through padding.
        buf.as_bytes_mut().fill(0);
        buf
    }

    async fn write_blocks(&self, lba: u64, buf: Rc<DmaBuffer>) -> Result<(), BdevError> {
        let len = buf.len();
        check_io(lba, len as u64, self.block_size, self.block_count)?;
        let pos = lba * self.block_size as u64;
        let done = self
            .file
            .write_rc_at(buf, pos)
            .await
            .map_err(|e| self.io_err("write", e))?;
        if done != len {
            return Err(BdevError::Short {
                op: "write",
                done,
                expected: len,
            });
        }
        Ok(())
    }

    async fn read_blocks(&self, lba: u64, nblocks: u64) -> Result<UringRead, BdevError> {
        let len = nblocks.saturating_mul(self.block_size as u64);
        check_io(lba, len, self.block_size, self.block_count)?;
        let expected = usize::try_from(len).map_err(|_| BdevError::OutOfRange {
            lba,
            end: lba.saturating_add(nblocks),
            block_count: self.block_count,
        })?;
        let pos = lba * self.block_size as u64;
        let read = self
            .file
            .read_at_aligned(pos, expected)
            .await
            .map_err(|e| self.io_err("read", e))?;
        if read.len() != expected {
            return Err(BdevError::Short {
                op: "read",
                done: read.len(),
                expected,
            });
        }
        Ok(UringRead(read))
    }

    async fn flush(&self) -> Result<(), BdevError> {
        self.file
            .fdatasync()
            .await
            .map_err(|e| self.io_err("fdatasync", e))
    }
}
