//! `--output text|json` for client commands.

use clap::ValueEnum;

/// How a client command prints its result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned text for people.
    #[default]
    Text,
    /// One JSON document for scripts.
    Json,
}
