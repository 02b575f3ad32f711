//! The versioned postcard codec for everything this crate persists or sends.
//!
//! Every value is written as `version byte ‖ postcard(value)`. A reader that
//! meets a version it does not know refuses the value with a clear error
//! instead of misreading it; a format change bumps [`FORMAT_VERSION`] and
//! keeps a decoder for the old one.

use serde::{Serialize, de::DeserializeOwned};
use thiserror::Error;

/// The format version this build writes.
pub const FORMAT_VERSION: u8 = 1;

/// Why bytes could not be decoded.
#[derive(Debug, Error)]
pub enum CodecError {
    /// Zero bytes: not even a version.
    #[error("empty value: no format version byte")]
    Empty,
    /// A version this build does not read.
    #[error("format version {found} is not supported (this build reads {FORMAT_VERSION})")]
    UnsupportedVersion {
        /// The version found.
        found: u8,
    },
    /// The body is not valid postcard for the expected type.
    #[error("value does not decode: {0}")]
    Postcard(#[from] postcard::Error),
}

/// Encodes `value` behind the version byte.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![FORMAT_VERSION];
    out.extend_from_slice(&postcard::to_stdvec(value)?);
    Ok(out)
}

/// Decodes a value written by [`encode`].
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if version != FORMAT_VERSION {
        return Err(CodecError::UnsupportedVersion { found: version });
    }
    Ok(postcard::from_bytes(body)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CommandBatch;

    #[test]
    fn round_trips_an_entry_payload() {
        let p = CommandBatch { time_ms: 1_700_000_000_123, commands: vec!["a".to_string(), "b".to_string()] };
        let bytes = encode(&p).unwrap();
        assert_eq!(bytes[0], FORMAT_VERSION);
        let back: CommandBatch<String> = decode(&bytes).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn refuses_unknown_version_empty_and_garbage() {
        let mut bytes = encode(&42u64).unwrap();
        bytes[0] = 9;
        assert!(matches!(decode::<u64>(&bytes), Err(CodecError::UnsupportedVersion { found: 9 })));
        assert!(matches!(decode::<u64>(&[]), Err(CodecError::Empty)));
        assert!(matches!(decode::<CommandBatch<String>>(&[FORMAT_VERSION, 0xff]), Err(CodecError::Postcard(_))));
    }
}
