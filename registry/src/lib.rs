//! Container images for Muster's agents: pulls from OCI registries through
//! `oci-client`, a content-addressed layer cache shared by every job on a
//! node, and an unpacker that treats layers as the untrusted input they are
//! (docs/containers.md).

pub mod unpack;

pub use unpack::{UnpackError, UnpackPolicy, Unpacked, unpack};

pub mod client;

pub use client::{DockerAuth, ImageConfig, Manifest, PullError, Registry, RegistryConfig, is_loopback};

pub mod cache;

pub use cache::{CachedImage, ImageCache, PullProgress, PulledImage};
