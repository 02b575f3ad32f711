//! The nouns of the state machine: nodes, allocations, tasks and their statuses.
//!
//! Everything here is plain data, one file per entity. Transitions live in `state/`; validation of
//! user input lives in `validate.rs`.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use serde::{Deserialize, Serialize};

mod allocation;
mod array;
mod checkpoint;
mod dependency;
mod image;
mod node;
mod placement;
mod resources;
mod spec;
mod task;
mod teardown;
mod token;
mod wait;
mod workflow;

pub use allocation::*;
pub use array::*;
pub use checkpoint::*;
pub use dependency::*;
pub use image::*;
pub use node::*;
pub use placement::*;
pub use resources::*;
pub use spec::*;
pub use task::*;
pub use teardown::*;
pub use token::*;
pub use wait::*;
pub use workflow::*;
