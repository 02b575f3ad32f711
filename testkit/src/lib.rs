//! What every test crate of the workspace waits with.
//!
//! A test that waits for something a cluster, an agent or a process will do
//! polls for it with [`eventually`] (async), [`eventually_async`] (an async
//! check) or [`eventually_blocking`] (no runtime), and fails after a
//! generous timeout naming what never came: the machine may be a loaded
//! 2-core one. None of them proves that something did *not* happen: a test
//! that must show an absence waits for a later event that would follow it
//! (or uses paused tokio time or the manual clock).
//!
//! ```text
//!   eventually("the task to start", WAIT, || started().then_some(()))
//!     check ─ Some(v) ─▶ v
//!       └─ None ─ sleep POLL ─▶ check … ─ past timeout ─▶ panic "timed out after 60 s waiting for the task to start"
//! ```

#![deny(missing_docs)]

pub mod registry;

use std::future::Future;
use std::time::{Duration, Instant};

/// The timeout most waits use: generous, since the machine may be loaded.
pub const WAIT: Duration = Duration::from_secs(60);

/// How often a check is repeated.
pub const POLL: Duration = Duration::from_millis(50);

/// What a check gives: `Some(v)` / `Ok(v)` when what it waits for has
/// come, `None` / `Err(why not yet)` when not (the last `why` is in the
/// failure's message).
pub trait Check<T> {
    /// The value, or why not yet.
    fn outcome(self) -> Result<T, Option<String>>;
}

impl<T> Check<T> for Option<T> {
    fn outcome(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

impl<T> Check<T> for Result<T, String> {
    fn outcome(self) -> Result<T, Option<String>> {
        self.map_err(Some)
    }
}

/// Where a wait stands: its deadline and the last reason it gave.
struct Waiting<'a> {
    what: &'a str,
    timeout: Duration,
    deadline: Instant,
}

impl Waiting<'_> {
    /// The value, `None` to try again, or the failure once past the deadline.
    fn judge<T>(&self, outcome: Result<T, Option<String>>) -> Option<T> {
        match outcome {
            Ok(v) => Some(v),
            Err(why) if Instant::now() >= self.deadline => {
                let last = why.map(|w| format!("; last: {w}")).unwrap_or_default();
                panic!("timed out after {} s waiting for {}{last}", self.timeout.as_secs_f64(), self.what)
            }
            Err(_) => None,
        }
    }
}

fn waiting(what: &str, timeout: Duration) -> Waiting<'_> {
    Waiting { what, timeout, deadline: Instant::now() + timeout }
}

/// Repeats `check` every [`POLL`] until it gives its value, and returns
/// that; panics after `timeout`, naming `what` (and the last reason the
/// check gave).
pub async fn eventually<T, C: Check<T>>(what: &str, timeout: Duration, mut check: impl FnMut() -> C) -> T {
    let w = waiting(what, timeout);
    loop {
        if let Some(v) = w.judge(check().outcome()) {
            return v;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`eventually`] with an async check (an RPC, a file read on the runtime).
pub async fn eventually_async<T, C: Check<T>, F: Future<Output = C>>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> F,
) -> T {
    let w = waiting(what, timeout);
    loop {
        if let Some(v) = w.judge(check().await.outcome()) {
            return v;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`eventually`] for a test without a runtime: the thread sleeps between
/// checks.
pub fn eventually_blocking<T, C: Check<T>>(what: &str, timeout: Duration, mut check: impl FnMut() -> C) -> T {
    let w = waiting(what, timeout);
    loop {
        if let Some(v) = w.judge(check().outcome()) {
            return v;
        }
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_check_that_comes_true_returns_its_value() {
        let mut n = 0;
        let got = eventually("the third try", WAIT, || {
            n += 1;
            (n == 3).then_some(n)
        })
        .await;
        assert_eq!(got, 3);
        let mut m = 0;
        let got = eventually_async("the second try", WAIT, || {
            m += 1;
            let v = m;
            async move { (v == 2).then_some("two") }
        })
        .await;
        assert_eq!(got, "two");
        let mut k = 0;
        assert!(eventually_blocking("the first try", WAIT, || {
            k += 1;
            Some(k == 1)
        }));
    }

    #[tokio::test]
    #[should_panic(expected = "timed out after 0.2 s waiting for what never comes")]
    async fn a_check_that_never_comes_true_fails_naming_it() {
        eventually("what never comes", Duration::from_millis(200), || None::<()>).await;
    }

    #[tokio::test]
    #[should_panic(expected = "waiting for the count to reach 9; last: at 3")]
    async fn a_failure_names_the_last_reason_the_check_gave() {
        let mut n = 0;
        eventually_async("the count to reach 9", Duration::from_millis(200), || {
            n = (n + 1).min(3);
            let at = n;
            async move { if at == 9 { Ok(()) } else { Err(format!("at {at}")) } }
        })
        .await;
    }

    #[test]
    #[should_panic(expected = "waiting for a blocking thing")]
    fn a_blocking_check_that_never_comes_true_fails_naming_it() {
        eventually_blocking("a blocking thing", Duration::from_millis(100), || None::<()>);
    }
}
