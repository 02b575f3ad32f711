//! The log of `muster server`, `agent` and `dev`: stderr, filtered by
//! level (`RUST_LOG` or the command's default), and only errors once the
//! process is shutting down on purpose.

use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::Layer;
use tracing_subscriber::filter::FilterExt as _;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::registry::LookupSpan;

/// Set once a process is shutting down on purpose (`muster dev` after
/// Ctrl-C): from then on only errors are logged, not the warnings every
/// replica and agent gives as its peers go away one by one.
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);

/// Logs only errors from now on (see [`SHUTTING_DOWN`]).
pub(crate) fn quiet() {
    SHUTTING_DOWN.store(true, Ordering::Relaxed);
}

/// Logs to stderr what `default` (or `RUST_LOG`) enables.
pub(crate) fn init(default: &str) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let env = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default.into());
    tracing_subscriber::registry().with(layer(env, &SHUTTING_DOWN, std::io::stderr, ansi)).init();
}

/// The log layer: what `env` enables, and only errors once `quiet` is set,
/// written to `writer`.
///
/// The two filters are one (`and`), so the level filter's "never" for a
/// callsite it disables is cached at that callsite, and a disabled span
/// (h2's and tonic's per-message `trace` spans) costs nothing. Layered as
/// two filters, the shutdown switch (which can only be asked at run time)
/// made every callsite ask on every call, and each disabled span was still
/// built in the registry: 9.7 % of a saturated leader's samples.
fn layer<S, W>(env: tracing_subscriber::EnvFilter, quiet: &'static AtomicBool, writer: W, ansi: bool) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let loud = tracing_subscriber::filter::filter_fn(move |m| {
        !quiet.load(Ordering::Relaxed) || *m.level() == tracing::Level::ERROR
    });
    tracing_subscriber::fmt::layer().with_writer(writer).with_ansi(ansi).with_filter(env.and(loud))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt as _;

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Buffer {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// A span the level filter disables is never built (it has no id),
    /// the filter's levels hold, and once quiet only errors are written.
    #[test]
    fn disabled_spans_are_never_built_and_a_quiet_log_keeps_only_errors() {
        static QUIET: AtomicBool = AtomicBool::new(false);
        let out = Buffer::default();
        let writer = out.clone();
        let env = tracing_subscriber::EnvFilter::new("info,muster_noisy=warn");
        let subscriber = tracing_subscriber::registry().with(layer(env, &QUIET, move || writer.clone(), false));
        tracing::subscriber::with_default(subscriber, || {
            // The same callsite twice: the second call reads the cached
            // interest.
            for _ in 0..2 {
                let span = tracing::trace_span!("per_message");
                assert!(span.is_disabled(), "a disabled span was built in the registry");
                assert!(tracing::debug_span!("per_call").is_disabled());
            }
            assert!(!tracing::info_span!("kept").is_disabled());
            tracing::info!("an info line");
            tracing::debug!("a debug line");
            tracing::info!(target: "muster_noisy", "a noisy info line");
            tracing::warn!(target: "muster_noisy", "a noisy warning");
            QUIET.store(true, Ordering::Relaxed);
            tracing::warn!("a warning while quiet");
            tracing::error!("an error while quiet");
        });
        let text = out.text();
        for (line, kept) in [
            ("an info line", true),
            ("a debug line", false),
            ("a noisy info line", false),
            ("a noisy warning", true),
            ("a warning while quiet", false),
            ("an error while quiet", true),
        ] {
            assert_eq!(text.contains(line), kept, "{line:?} in:\n{text}");
        }
    }
}
