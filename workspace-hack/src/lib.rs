//! Holds no code: its dependencies pin one set of features for every build
//! of the workspace (see its `Cargo.toml`).
