//! The tests' cluster CA: every `muster` process a test starts runs over
//! mutual TLS with certificates from one directory (`MUSTER_TLS_DIR`), so
//! the secure path is the tested path.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use muster_tls::{Role, TlsMaterial};

/// The test process's TLS dir: a CA, servers 1-5 and `admin-dev`.
pub fn dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("muster-test-tls-{}", std::process::id()));
        let roles: Vec<Role> = (1..=5).map(Role::Server).chain([Role::Admin(muster_local::DEV_ADMIN.into())]).collect();
        muster_local::ensure_certs(&dir, &roles).expect("test CA");
        dir
    })
}

/// The admin's material, for the tests' own gRPC clients.
pub fn admin() -> TlsMaterial {
    muster_local::ensure_certs(dir(), &[Role::Admin(muster_local::DEV_ADMIN.into())]).unwrap().remove(0)
}

/// Material for any role (issued when missing), e.g. an agent's.
pub fn material(role: Role) -> TlsMaterial {
    muster_local::ensure_certs(dir(), &[role]).unwrap().remove(0)
}

/// A local cluster's config that issues its certificates from the tests' CA.
pub fn local_config() -> muster_local::LocalConfig {
    muster_local::LocalConfig { tls_dir: Some(dir().to_path_buf()), ..muster_local::LocalConfig::default() }
}

/// The tests' usual local cluster: `agents` agents heartbeating every
/// 500 ms, stopping tasks with a `stop_grace` grace, certificates from the
/// tests' CA. Each area overrides what it is about.
pub fn quick_cluster(agents: u32, stop_grace: std::time::Duration) -> muster_local::LocalConfig {
    muster_local::LocalConfig { agents, heartbeat: std::time::Duration::from_millis(500), stop_grace, ..local_config() }
}
