//! Shared test fixtures: an executor per test, a directory where O_DIRECT works, and the two
//! backends behind one interface so every store test runs on both.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::future::Future;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use glommio::{LocalExecutorBuilder, Placement};
use yutu_blockstore::{Bdev, RamBdev, UringBdev};

/// Runs `f` on a fresh glommio executor (as a server shard would) and propagates its panics.
pub fn run<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    raise_memlock_limit();
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(512 << 10)
        .spawn(f)
        .expect("executor starts")
        .join()
        .expect("test body completes without panicking");
}

fn raise_memlock_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim);
        }
    }
}

/// Whether files under `dir` can be opened with O_DIRECT on a disk-backed file system.
fn supports_direct_io(dir: &Path) -> bool {
    if std::fs::create_dir_all(dir).is_err() {
        return false;
    }
    let c = match std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()) {
        Ok(c) => c,
        Err(_) => return false,
    };
    // SAFETY: a zeroed statfs is a valid value of the plain C struct; statfs fills it from a
    // NUL-terminated path that outlives the call.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut fs) } != 0 || fs.f_type == libc::TMPFS_MAGIC {
        return false;
    }
    let probe = dir.join(format!(".yutu-odirect-probe-{}", std::process::id()));
    let ok = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

/// A directory for test devices where O_DIRECT really works: `$YUTU_SPDK_TEST_DIR`, else the
/// target directory's scratch space, else /var/tmp, else /tmp. Panics if none qualifies
/// (tests must not silently fall back to buffered I/O).
pub fn direct_io_dir() -> PathBuf {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("YUTU_SPDK_TEST_DIR") {
        candidates.push(d.into());
    }
    candidates.push(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("yutu-blockstore"));
    candidates.push("/var/tmp".into());
    candidates.push("/tmp".into());
    candidates
        .into_iter()
        .find(|d| supports_direct_io(d))
        .expect("no directory supporting O_DIRECT; set YUTU_SPDK_TEST_DIR")
}

/// A scratch directory removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let path = direct_io_dir().join(format!(
            "yutu-blockstore-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("create scratch dir");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A device the tests can open repeatedly (each open is a restart) and damage on purpose.
#[allow(async_fn_in_trait)]
pub trait Backend: Sized + 'static {
    type Dev: Bdev + 'static;
    /// Fresh, zeroed storage of `bytes`.
    fn create(bytes: u64) -> Self;
    /// A new handle on the same storage, as a restarted process would get.
    async fn open(&self) -> Self::Dev;
    /// Overwrites raw bytes at a device offset.
    fn poke(&self, offset: u64, bytes: &[u8]);
    /// Reads raw bytes at a device offset.
    fn peek(&self, offset: u64, len: usize) -> Vec<u8>;
}

pub struct Ram(pub RamBdev);

impl Backend for Ram {
    type Dev = RamBdev;

    fn create(bytes: u64) -> Self {
        Ram(RamBdev::new(512, bytes / 512))
    }

    async fn open(&self) -> RamBdev {
        self.0.clone()
    }

    fn poke(&self, offset: u64, bytes: &[u8]) {
        self.0.poke(offset, bytes);
    }

    fn peek(&self, offset: u64, len: usize) -> Vec<u8> {
        self.0.peek(offset, len)
    }
}

/// A preallocated file on a disk-backed file system, opened with O_DIRECT.
pub struct File {
    pub dir: TempDir,
    pub path: PathBuf,
    pub size: u64,
}

impl File {
    /// Shrinks the file to `len` bytes (a device that lost its end).
    pub fn truncate(&self, len: u64) {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.path)
            .expect("open for truncate");
        f.set_len(len).expect("truncate");
        f.sync_all().expect("sync");
    }
}

impl Backend for File {
    type Dev = UringBdev;

    fn create(bytes: u64) -> Self {
        let dir = TempDir::new("dev");
        let path = dir.path().join("nvme.img");
        File {
            dir,
            path,
            size: bytes,
        }
    }

    async fn open(&self) -> UringBdev {
        UringBdev::open_file(&self.path, self.size)
            .await
            .expect("open the device file with O_DIRECT")
    }

    fn poke(&self, offset: u64, bytes: &[u8]) {
        // Buffered write; the kernel writes dirty pages back before a later O_DIRECT read of
        // the same range, and sync_all makes sure of it.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.path)
            .expect("open for poke");
        f.write_all_at(bytes, offset).expect("poke");
        f.sync_all().expect("sync");
    }

    fn peek(&self, offset: u64, len: usize) -> Vec<u8> {
        let f = std::fs::File::open(&self.path).expect("open for peek");
        let mut buf = vec![0u8; len];
        f.read_exact_at(&mut buf, offset).expect("peek");
        buf
    }
}

/// A value whose bytes depend on `seed` everywhere, so a misplaced block shows up.
pub fn value(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Instantiates a generic async test `fn name<B: Backend>()` for both backends.
#[macro_export]
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod ram {
            $(
                #[test]
                fn $name() {
                    $crate::common::run(|| super::$name::<$crate::common::Ram>());
                }
            )*
        }
        mod uring {
            $(
                #[test]
                fn $name() {
                    $crate::common::run(|| super::$name::<$crate::common::File>());
                }
            )*
        }
    };
}
