//! Timers that are reused rather than made anew for every request.
//!
//! A connection arms the same deadlines over and over: hyper its wait for
//! each request's head, the proxy its wait for each upstream answer. A fresh
//! tokio sleep for each is entered into the runtime's timer wheel on its
//! first poll and taken out again when dropped, under the wheel's lock. A
//! [`SleepSlot`] instead keeps the sleep a request is done with, still
//! entered, for the next one, which only moves its deadline later: an
//! atomic store, with the wheel finding out when the old deadline comes.
//! (A kept sleep that reaches its old deadline wakes the task that last
//! waited on it once, which then finds nothing to do.)

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::time::Sleep;

/// One connection's spare sleep.
#[derive(Default)]
pub(crate) struct SleepSlot {
    spare: Mutex<Option<Pin<Box<Sleep>>>>,
}

impl SleepSlot {
    pub(crate) fn new() -> Arc<SleepSlot> {
        Arc::new(SleepSlot::default())
    }

    /// A sleep until `deadline`: the spare one, moved, or a new one when it
    /// is in use.
    pub(crate) fn until(self: &Arc<Self>, deadline: tokio::time::Instant) -> Reused {
        let spare = self.spare.lock().ok().and_then(|mut s| s.take());
        let sleep = match spare {
            Some(mut sleep) => {
                sleep.as_mut().reset(deadline);
                sleep
            }
            None => Box::pin(tokio::time::sleep_until(deadline)),
        };
        Reused {
            sleep: Some(sleep),
            slot: Arc::clone(self),
        }
    }

    /// A sleep of `duration` from now.
    pub(crate) fn sleep(self: &Arc<Self>, duration: Duration) -> Reused {
        self.until(tokio::time::Instant::now() + duration)
    }
}

/// A sleep from a [`SleepSlot`], which goes back to it when dropped.
pub(crate) struct Reused {
    sleep: Option<Pin<Box<Sleep>>>,
    slot: Arc<SleepSlot>,
}

impl Future for Reused {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.sleep.as_mut() {
            Some(sleep) => sleep.as_mut().poll(cx),
            None => Poll::Ready(()),
        }
    }
}

impl Drop for Reused {
    fn drop(&mut self) {
        if let Some(sleep) = self.sleep.take()
            && let Ok(mut spare) = self.slot.spare.lock()
            && spare.is_none()
        {
            *spare = Some(sleep);
        }
    }
}

impl hyper::rt::Sleep for Reused {}

/// hyper's timer for one connection: its sleeps come from one slot, so the
/// wait for each request head reuses the last one's.
pub(crate) struct ConnectionTimer(Arc<SleepSlot>);

impl ConnectionTimer {
    pub(crate) fn new() -> ConnectionTimer {
        ConnectionTimer(SleepSlot::new())
    }
}

impl hyper::rt::Timer for ConnectionTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.0.sleep(duration))
    }

    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.0.until(deadline.into()))
    }

    fn now(&self) -> Instant {
        // The runtime's clock, which tests pause and advance.
        tokio::time::Instant::now().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_reused_sleep_ends_at_its_new_deadline_not_its_old_one() {
        let slot = SleepSlot::new();
        let start = tokio::time::Instant::now();
        // Armed, polled (so entered in the wheel) and given back early.
        let mut first = Box::pin(slot.sleep(Duration::from_secs(1)));
        let polled = std::future::poll_fn(|cx| Poll::Ready(first.as_mut().poll(cx))).await;
        assert!(polled.is_pending());
        drop(first);
        assert!(slot.spare.lock().is_ok_and(|s| s.is_some()), "kept");

        let second = slot.sleep(Duration::from_secs(30));
        assert!(slot.spare.lock().is_ok_and(|s| s.is_none()), "taken");
        second.await;
        assert_eq!(start.elapsed(), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sleep_taken_while_the_spare_is_in_use_is_a_new_one() {
        let slot = SleepSlot::new();
        let start = tokio::time::Instant::now();
        let long = slot.sleep(Duration::from_secs(10));
        let short = slot.sleep(Duration::from_secs(2));
        short.await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        long.await;
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        // The one dropped last found the slot taken.
        assert!(slot.spare.lock().is_ok_and(|s| s.is_some()));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reused_sleep_that_had_ended_sleeps_again() {
        let slot = SleepSlot::new();
        slot.sleep(Duration::from_secs(1)).await;
        let start = tokio::time::Instant::now();
        slot.sleep(Duration::from_secs(5)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }
}
