//! Present so that the build-dependencies, which unify the features of
//! build scripts' and proc-macros' dependencies, take part in the build.

fn main() {}
