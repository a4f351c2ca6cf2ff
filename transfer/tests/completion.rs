//! The three ways to complete a batch: poll, block, or await, including from a glommio
//! executor (the storage node's shards), whose futures are `!Send` and whose tasks are woken
//! here from the engine's worker threads.

mod common;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use common::{pair, pattern, read, segment};
use yutu_transfer::{BatchResult, TransferRequest, TransportKind};

#[test]
fn a_glommio_task_awaits_a_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), true);
    let srv = segment(&server, 4 << 20);
    let cli = segment(&client, 4 << 20);
    srv.region().write_at(0, &pattern(8, 4 << 20)).unwrap();
    let d = srv.descriptor(0, 4 << 20).unwrap();
    let local = cli.clone();
    let shard = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
        .name("test-shard")
        .io_memory(2 << 20)
        .spawn(move || async move {
            // Something !Send held across the await, as shard state is.
            let shard_state = std::rc::Rc::new(42);
            let batch = client
                .submit([TransferRequest::read(&local, 0, &d)])
                .unwrap();
            let result = batch.await;
            assert_eq!(*shard_state, 42);
            result
        })
        .expect("start a glommio executor");
    let result = shard.join().expect("the executor finishes");
    let done = result.into_result().unwrap();
    assert_eq!(done[0].transport, TransportKind::Shm);
    assert!(read(&cli, 0, 4 << 20) == pattern(8, 4 << 20));
}

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// The smallest executor: poll, park until woken.
fn block_on<F: Future>(f: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Poll::Ready(out) = f.as_mut().poll(&mut cx) {
            return out;
        }
        assert!(Instant::now() < deadline, "future never completed");
        std::thread::park_timeout(Duration::from_secs(1));
    }
}

#[test]
fn poll_wait_and_await_agree() {
    let dir = tempfile::tempdir().unwrap();
    let (client, server) = pair(dir.path(), false);
    let srv = segment(&server, 2 << 20);
    let cli = segment(&client, 2 << 20);
    srv.region().write_at(0, &pattern(9, 2 << 20)).unwrap();
    let d = srv.descriptor(0, 2 << 20).unwrap();
    let req = || [TransferRequest::read(&cli, 0, &d)];

    let awaited: BatchResult = block_on(client.submit(req()).unwrap());
    let waited = client.submit(req()).unwrap().wait();
    let handle = client.submit(req()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let polled = loop {
        if let Some(result) = handle.try_result() {
            break result;
        }
        assert!(Instant::now() < deadline);
        std::thread::yield_now();
    };
    let timed = client
        .submit(req())
        .unwrap()
        .wait_timeout(Duration::from_secs(60))
        .unwrap();
    for result in [awaited, waited, polled, timed] {
        let done = result.into_result().unwrap();
        assert_eq!(done[0].transport, TransportKind::Tcp);
        assert_eq!(done[0].bytes, 2 << 20);
    }
    assert!(handle.is_done());
    assert!(read(&cli, 0, 2 << 20) == pattern(9, 2 << 20));
}

#[test]
fn engine_handles_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<yutu_transfer::TransferEngine>();
    send_sync::<yutu_transfer::LocalSegment>();
    send_sync::<yutu_transfer::MemoryRegion>();
    send::<yutu_transfer::BatchHandle>();
}
