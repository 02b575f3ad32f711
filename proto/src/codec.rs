//! The codec every generated client and server uses: prost, with a 1 KiB
//! starting buffer per stream each way instead of tonic's 8 KiB.
//!
//! A leader holds one long-lived stream per node agent, each with a decode
//! and an encode buffer allocated when the stream opens; most messages on
//! it (heartbeats, claims, reports) are well under 1 KiB. Buffers grow as a
//! larger message needs (an assignment, a batch of Raft entries), so
//! only the idle cost changes.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// The starting size of a stream's encode and decode buffers.
pub const BUFFER_BYTES: usize = 1024;

/// How much encoded data a streaming response gathers before it is sent
/// (tonic's default).
const YIELD_THRESHOLD: usize = 32 * 1024;

/// [`ProstCodec`] with [`BUFFER_BYTES`] buffers.
#[derive(Debug, Clone)]
pub struct SmallBufferCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SmallBufferCodec<T, U> {
    fn default() -> Self {
        SmallBufferCodec(PhantomData)
    }
}

fn settings() -> BufferSettings {
    BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD)
}

impl<T, U> Codec for SmallBufferCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(settings())
    }
}

#[cfg(test)]
mod tests {
    use tonic::codec::{Codec, Decoder, Encoder};

    use super::*;
    use crate::v1;

    #[test]
    fn both_directions_start_with_the_small_buffer() {
        let mut codec = SmallBufferCodec::<v1::Resources, v1::Resources>::default();
        let want = format!("buffer_size: {BUFFER_BYTES},");
        assert!(format!("{:?}", codec.encoder().buffer_settings()).contains(&want));
        assert!(format!("{:?}", codec.decoder().buffer_settings()).contains(&want));
    }
}
