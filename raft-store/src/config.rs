//! The openraft type configuration for an application.

use std::cmp::Ordering;
use std::fmt;
use std::io::Cursor;
use std::marker::PhantomData;

use openraft::impls::OneshotResponder;
use openraft::{BasicNode, Entry, RaftTypeConfig, TokioRuntime};

use crate::{CommandBatch, StateMachineApp};

/// openraft's type configuration for the application `A`: node ids are
/// `u64`, nodes carry their gRPC address, entries carry a [`CommandBatch`]
/// and answer with one outcome per command.
///
/// A marker type: the trait impls below are written by hand so that they do
/// not require anything of `A`.
pub struct RaftConfig<A>(PhantomData<fn() -> A>);

impl<A> Clone for RaftConfig<A> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<A> Copy for RaftConfig<A> {}
impl<A> Default for RaftConfig<A> {
    fn default() -> Self {
        RaftConfig(PhantomData)
    }
}
impl<A> fmt::Debug for RaftConfig<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RaftConfig")
    }
}
impl<A> PartialEq for RaftConfig<A> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<A> Eq for RaftConfig<A> {}
impl<A> PartialOrd for RaftConfig<A> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<A> Ord for RaftConfig<A> {
    fn cmp(&self, _: &Self) -> Ordering {
        Ordering::Equal
    }
}

impl<A: StateMachineApp> RaftTypeConfig for RaftConfig<A> {
    type D = CommandBatch<A::Command>;
    type R = Vec<A::Outcome>;
    type NodeId = u64;
    type Node = BasicNode;
    type Entry = Entry<Self>;
    type SnapshotData = Cursor<Vec<u8>>;
    type AsyncRuntime = TokioRuntime;
    type Responder = OneshotResponder<Self>;
}
