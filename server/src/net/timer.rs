//! A hyper timer on glommio's timers, so that hyper can enforce its header read timeout
//! (slow-loris protection) without a timer thread.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper::rt::{Sleep, Timer};

/// Hands out glommio timers. hyper requires `Send + Sync`; the timer has no state at all.
#[derive(Clone, Copy, Debug, Default)]
pub struct GlommioTimer;

struct GlommioSleep(glommio::timer::Timer);

// SAFETY: hyper requires `Sleep: Send + Sync` for multi-threaded runtimes, but every HTTP/1
// connection here is served by a task spawned with `spawn_local` on one shard's executor;
// hyper creates, polls and drops its sleeps inside that connection future, so a
// `GlommioSleep` never leaves the thread that created it and is never shared.
unsafe impl Send for GlommioSleep {}
// SAFETY: as above; no reference to it is ever used from another thread.
unsafe impl Sync for GlommioSleep {}

impl Future for GlommioSleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx).map(|_| ())
    }
}

impl Sleep for GlommioSleep {}

impl Timer for GlommioTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn Sleep>> {
        Box::pin(GlommioSleep(glommio::timer::Timer::new(duration)))
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn Sleep>> {
        self.sleep(deadline.saturating_duration_since(Instant::now()))
    }
}
