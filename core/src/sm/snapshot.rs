//! Snapshot encoding and the state digest.
//!
//! A snapshot is `MAGIC ‖ format version (u16, little endian) ‖ postcard(State)`.
//! postcard encodes a `BTreeMap` in key order and a `Vec` in index order, so
//! the encoding is canonical: equal states give equal bytes. The digest is
//! SHA-256 over those bytes, stable across builds and machines (never
//! `DefaultHasher`).

use std::fmt;

use sha2::{Digest as _, Sha256};
use thiserror::Error;

use super::state::State;

/// The first bytes of every snapshot.
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"MUSTERSM";

/// The snapshot format this build writes and reads.
pub const SNAPSHOT_FORMAT_VERSION: u16 = 24;

/// Why a snapshot could not be decoded.
#[derive(Debug, Error)]
pub enum SnapshotError {
    /// The bytes do not start with [`SNAPSHOT_MAGIC`].
    #[error("not a Muster state snapshot (bad magic)")]
    BadMagic,
    /// A format this build does not know.
    #[error("snapshot format version {found} is not supported (this build reads {supported})")]
    UnsupportedVersion {
        /// The version in the header.
        found: u16,
        /// The version this build reads.
        supported: u16,
    },
    /// The body does not decode.
    #[error("snapshot body does not decode: {0}")]
    Decode(#[from] postcard::Error),
    /// The body decodes to a state that breaks an invariant.
    #[error("snapshot holds an inconsistent state: {0}")]
    Inconsistent(String),
}

/// A SHA-256 state digest.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StateDigest(pub [u8; 32]);

impl fmt::Display for StateDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for StateDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StateDigest({self})")
    }
}

impl State {
    fn canonical_body(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("encoding a State into memory cannot fail")
    }

    /// Encodes the state as a versioned snapshot.
    pub fn to_snapshot(&self) -> Vec<u8> {
        let body = self.canonical_body();
        let mut out = Vec::with_capacity(SNAPSHOT_MAGIC.len() + 2 + body.len());
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&SNAPSHOT_FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Decodes a snapshot written by [`State::to_snapshot`], rebuilding the
    /// derived indexes and checking every invariant.
    pub fn from_snapshot(bytes: &[u8]) -> Result<State, SnapshotError> {
        let rest = bytes.strip_prefix(SNAPSHOT_MAGIC.as_slice()).ok_or(SnapshotError::BadMagic)?;
        let (version, body) = rest.split_at_checked(2).ok_or(SnapshotError::BadMagic)?;
        let found = u16::from_le_bytes([version[0], version[1]]);
        if found != SNAPSHOT_FORMAT_VERSION {
            return Err(SnapshotError::UnsupportedVersion { found, supported: SNAPSHOT_FORMAT_VERSION });
        }
        let mut state: State = postcard::from_bytes(body)?;
        state.rebuild_indexes();
        state.check_invariants().map_err(SnapshotError::Inconsistent)?;
        Ok(state)
    }

    /// SHA-256 over the canonical encoding (format version included).
    pub fn state_digest(&self) -> StateDigest {
        let mut h = Sha256::new();
        h.update(SNAPSHOT_FORMAT_VERSION.to_le_bytes());
        h.update(self.canonical_body());
        StateDigest(h.finalize().into())
    }
}
