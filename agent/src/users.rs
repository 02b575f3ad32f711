//! Who a task runs as. A root agent never runs a task as root unless told
//! to (`--allow-root-tasks`): each attempt runs under an unprivileged uid
//! and gid, either the dedicated account (`--task-user`, `muster-task` by
//! default, which the deploy units create) or the account the allocation's
//! owner maps to in an operator-given file (`--user-map`), so that
//! `client-bob`'s jobs run as `bob`, as Slurm runs jobs as the submitting
//! user. An unprivileged agent runs tasks as itself (it can do nothing
//! else).
//!
//! ```text
//!   # /etc/muster/users: OWNER ACCOUNT (a name, or UID[:GID])
//!   bob     bob
//!   carol   60002:60002
//! ```
//!
//! The map is read once at start; every account is resolved then, so a
//! typo stops the agent instead of failing a job hours later.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The dedicated account tasks run as by default on a root agent.
pub const DEFAULT_TASK_USER: &str = "muster-task";

/// The largest user map the agent reads.
pub const MAX_MAP_BYTES: u64 = 1 << 20;

/// The longest owner or account name in a map.
pub const MAX_NAME: usize = 128;

/// An unprivileged account a task runs as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskUser {
    /// Its name (`UID:GID` for a numeric account with no passwd entry).
    pub name: String,
    /// Its uid (never 0).
    pub uid: u32,
    /// Its primary gid (never 0).
    pub gid: u32,
    /// Its supplementary groups (the primary included).
    pub groups: Vec<u32>,
}

impl TaskUser {
    /// `UID:GID:G1,G2,…`, as `muster task-exec --user` (the shim of a kept task) reads it.
    pub fn to_arg(&self) -> String {
        let groups = self.groups.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        format!("{}:{}:{groups}", self.uid, self.gid)
    }

    /// Reads [`TaskUser::to_arg`]'s form back.
    pub fn from_arg(arg: &str) -> Result<TaskUser, String> {
        let bad = || format!("--user {arg:?}: expected UID:GID:GROUPS");
        let mut parts = arg.splitn(3, ':');
        let uid = parts.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
        let gid = parts.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
        let groups = match parts.next() {
            None | Some("") => Vec::new(),
            Some(g) => g.split(',').map(|s| s.parse().map_err(|_| bad())).collect::<Result<_, _>>()?,
        };
        if uid == 0 || gid == 0 {
            return Err(format!("--user {arg:?}: a task never runs as root here"));
        }
        Ok(TaskUser { name: format!("{uid}:{gid}"), uid, gid, groups })
    }
}

/// Who each allocation's tasks run as.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunAs {
    /// Owners not in the map run as this account; `None`: as the agent's
    /// own user (an unprivileged agent, or a root one told
    /// `--allow-root-tasks`).
    pub default: Option<TaskUser>,
    /// Owner → account.
    pub map: BTreeMap<String, TaskUser>,
}

impl RunAs {
    /// Tasks run as the agent itself.
    pub fn agent() -> RunAs {
        RunAs::default()
    }

    /// The account `owner`'s tasks run as (`None`: the agent's own user).
    pub fn for_owner(&self, owner: &str) -> Option<&TaskUser> {
        self.map.get(owner).or(self.default.as_ref())
    }

    /// Every account a task may run as, for the start-up checks.
    pub fn accounts(&self) -> impl Iterator<Item = &TaskUser> {
        self.default.iter().chain(self.map.values())
    }

    /// Whether any task runs as another user than the agent.
    pub fn switches(&self) -> bool {
        self.accounts().next().is_some()
    }
}

/// What `muster agent` was told: `--task-user`, `--user-map` (its text),
/// `--allow-root-tasks`, and whether the agent runs as root.
pub fn configure(
    task_user: Option<&str>,
    user_map: Option<&str>,
    allow_root: bool,
    root: bool,
) -> Result<RunAs, String> {
    if !root {
        // An unprivileged agent can run tasks only as itself: never root,
        // and a --task-user is moot (the caller says so). A map it cannot
        // honour would merge owners the operator meant to keep apart.
        if user_map.is_some() {
            return Err("only an agent running as root can run each owner's tasks as its own account: leave out \
                        --user-map (tasks run as this agent's own user)"
                .into());
        }
        return Ok(RunAs::agent());
    }
    if allow_root && task_user.is_some() {
        return Err("--allow-root-tasks and --task-user contradict each other: unmapped owners run either as root \
                    or as the --task-user account"
            .into());
    }
    let map = user_map.map(parse_map).transpose()?.unwrap_or_default();
    let default = if allow_root {
        None
    } else {
        let name = task_user.unwrap_or(DEFAULT_TASK_USER);
        Some(resolve(name).map_err(|e| {
            if task_user.is_none() {
                format!(
                    "tasks run as the dedicated account {DEFAULT_TASK_USER} by default, and {e}: create it \
                     (useradd --system --no-create-home {DEFAULT_TASK_USER}), name another with --task-user, or \
                     run tasks as root with --allow-root-tasks"
                )
            } else {
                format!("--task-user: {e}")
            }
        })?)
    };
    Ok(RunAs { default, map })
}

/// Reads a user map: one `OWNER ACCOUNT` per line; `#` starts a comment.
pub fn parse_map(text: &str) -> Result<BTreeMap<String, TaskUser>, String> {
    if text.len() as u64 > MAX_MAP_BYTES {
        return Err(format!("--user-map: larger than {MAX_MAP_BYTES} bytes"));
    }
    let mut map = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = |why: String| format!("--user-map line {}: {why}", n + 1);
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [owner, account] = fields[..] else {
            return Err(at(format!("expected OWNER ACCOUNT, got {line:?}")));
        };
        if owner.len() > MAX_NAME || account.len() > MAX_NAME {
            return Err(at(format!("names are at most {MAX_NAME} bytes")));
        }
        let user = resolve(account).map_err(at)?;
        if map.insert(owner.to_string(), user).is_some() {
            return Err(at(format!("owner {owner:?} is mapped twice")));
        }
    }
    Ok(map)
}

/// Resolves an account: a name from the passwd database (with its groups),
/// or `UID` / `UID:GID` as numbers. Root (uid or gid 0) is refused.
pub fn resolve(account: &str) -> Result<TaskUser, String> {
    let numeric = account.split_once(':').map_or((account, None), |(u, g)| (u, Some(g)));
    let user = if let Ok(uid) = numeric.0.parse::<u32>() {
        let gid = match numeric.1 {
            Some(g) => g.parse::<u32>().map_err(|_| format!("account {account:?}: {g:?} is not a gid"))?,
            None => uid,
        };
        TaskUser { name: account.to_string(), uid, gid, groups: vec![gid] }
    } else {
        lookup(account)?
    };
    if user.uid == 0 || user.gid == 0 {
        return Err(format!("account {account:?} is root: tasks never run as root through --task-user or --user-map"));
    }
    Ok(user)
}

/// The passwd entry and group list of `name`.
fn lookup(name: &str) -> Result<TaskUser, String> {
    let c_name = CString::new(name).map_err(|_| format!("account {name:?} has a NUL byte"))?;
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut buf = vec![0u8; 16 * 1024];
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call; getpwnam_r fills `pwd`
    // with pointers into `buf`, which outlives their use below.
    let rc = unsafe { libc::getpwnam_r(c_name.as_ptr(), &mut pwd, buf.as_mut_ptr().cast(), buf.len(), &mut found) };
    if rc != 0 || found.is_null() {
        return Err(format!("account {name:?} does not exist on this node"));
    }
    let (uid, gid) = (pwd.pw_uid, pwd.pw_gid);
    let mut groups = vec![0 as libc::gid_t; 256];
    let mut count = groups.len() as libc::c_int;
    // SAFETY: `groups` has room for `count` entries; the name is the one
    // getpwnam_r found (still in `buf`).
    let rc = unsafe { libc::getgrouplist(pwd.pw_name, gid, groups.as_mut_ptr(), &mut count) };
    if rc < 0 {
        return Err(format!("account {name:?} is in more than {} groups", groups.len()));
    }
    groups.truncate(count.max(0) as usize);
    // SAFETY: pw_name points into `buf`, NUL-terminated by getpwnam_r.
    let name = unsafe { CStr::from_ptr(pwd.pw_name) }.to_string_lossy().into_owned();
    Ok(TaskUser { name, uid, gid, groups })
}

/// Whether `user` can reach `dir` (search permission on it and on every
/// directory above it), so that a task can start there; the error names
/// the directory that stops it.
pub fn reachable(dir: &Path, user: &TaskUser) -> Result<(), String> {
    let mut here = Some(dir);
    while let Some(d) = here {
        let m = std::fs::metadata(d).map_err(|e| format!("{}: {e}", d.display()))?;
        let mode = m.mode();
        let ok = if m.uid() == user.uid {
            mode & 0o100 != 0
        } else if m.gid() == user.gid || user.groups.contains(&m.gid()) {
            mode & 0o010 != 0
        } else {
            mode & 0o001 != 0
        };
        if !ok {
            return Err(format!(
                "tasks run as {} (uid {}) cannot reach {}: {} is mode {:o} (make it searchable: chmod o+x)",
                user.name,
                user.uid,
                dir.display(),
                d.display(),
                mode & 0o7777
            ));
        }
        here = d.parent();
    }
    Ok(())
}

/// Readies an agent's work dir for tasks that run as other users: the
/// dir, its `checkpoints` and its `logs` become searchable by all and
/// listable by none (0711), so a task reaches what it is given (its
/// checkpoint directory, its progress file and hostfile) and nothing else;
/// and every account must be able to reach it (a task starts there).
pub fn prepare_work_dir(work_dir: &Path, run_as: &RunAs) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if !run_as.switches() {
        return Ok(());
    }
    for d in [work_dir.to_path_buf(), work_dir.join("checkpoints"), work_dir.join("logs")] {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&d)
            .and_then(|()| std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o711)))
            .map_err(|e| format!("{}: {e}", d.display()))?;
    }
    run_as.accounts().try_for_each(|u| reachable(work_dir, u))
}

/// In the child, before exec: drops to `user` (supplementary groups, gid,
/// then uid, so nothing of root is left). Only async-signal-safe calls.
pub fn drop_to(user: &TaskUser) -> std::io::Result<()> {
    let groups: &[libc::gid_t] = &user.groups;
    // SAFETY: plain syscalls on valid pointers.
    unsafe {
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0
            || libc::setgid(user.gid) != 0
            || libc::setuid(user.uid) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_reads_names_and_numbers_and_refuses_root_and_typos() {
        let map = parse_map("# owners\nbob 60001\n\ncarol  60002:60010  # a comment\n").unwrap();
        assert_eq!(map["bob"], TaskUser { name: "60001".into(), uid: 60001, gid: 60001, groups: vec![60001] });
        assert_eq!((map["carol"].uid, map["carol"].gid), (60002, 60010));
        let err = |t: &str| parse_map(t).unwrap_err();
        assert!(err("bob root\n").contains("line 1: account \"root\" is root"), "{}", err("bob root"));
        assert!(err("bob 0:5").contains("is root"));
        assert!(err("a 1\nb\n").starts_with("--user-map line 2: expected OWNER ACCOUNT"));
        assert!(err("a 1\na 2\n").contains("owner \"a\" is mapped twice"));
        assert!(err("a no-such-account-here\n").contains("does not exist on this node"));
        assert!(err("a 5:x").contains("\"x\" is not a gid"));
    }

    #[test]
    fn a_root_agent_needs_an_account_or_an_explicit_flag() {
        let e = configure(Some("no-such-account-here"), None, false, true).unwrap_err();
        assert!(e.starts_with("--task-user: account \"no-such-account-here\" does not exist"), "{e}");
        let as_root = configure(None, None, true, true).unwrap();
        assert_eq!(as_root, RunAs::agent());
        let numeric = configure(Some("60000"), Some("bob 60001\n"), false, true).unwrap();
        assert_eq!(numeric.for_owner("bob").unwrap().uid, 60001);
        assert_eq!(numeric.for_owner("carol").unwrap().uid, 60000, "unmapped owners run as the task user");
        let mapped_root_allowed = configure(None, Some("bob 60001\n"), true, true).unwrap();
        assert_eq!(mapped_root_allowed.for_owner("carol"), None);
        assert!(configure(Some("60000"), None, true, true).unwrap_err().contains("contradict"));
        assert!(
            configure(None, Some("bob 60001\n"), false, false).unwrap_err().contains("only an agent running as root")
        );
        assert_eq!(configure(Some("60000"), None, false, false).unwrap(), RunAs::agent(), "moot, not an error");
        assert_eq!(configure(None, None, false, false).unwrap(), RunAs::agent());
        // The default account, when it is missing, says how to make it.
        if lookup(DEFAULT_TASK_USER).is_err() {
            let e = configure(None, None, false, true).unwrap_err();
            assert!(e.contains("useradd --system") && e.contains("--allow-root-tasks"), "{e}");
        }
    }

    #[test]
    fn a_named_account_carries_its_groups() {
        let root = lookup("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert!(root.groups.contains(&0));
        assert!(resolve("root").unwrap_err().contains("is root"));
    }

    #[test]
    fn the_exec_argument_round_trips_and_never_means_root() {
        let u = TaskUser { name: "x".into(), uid: 7, gid: 8, groups: vec![8, 9] };
        let back = TaskUser::from_arg(&u.to_arg()).unwrap();
        assert_eq!((back.uid, back.gid, back.groups), (7, 8, vec![8, 9]));
        assert!(TaskUser::from_arg("0:8:").unwrap_err().contains("never runs as root"));
        assert!(TaskUser::from_arg("x").is_err());
    }

    #[test]
    fn a_directory_out_of_reach_is_named() {
        use std::os::unix::fs::PermissionsExt;
        let top = tempfile::tempdir().unwrap();
        let inner = top.path().join("a/b");
        std::fs::create_dir_all(&inner).unwrap();
        let user = TaskUser { name: "t".into(), uid: 60123, gid: 60123, groups: vec![60123] };
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let e = reachable(&inner, &user).unwrap_err();
        assert!(e.contains(&format!("{} is mode 700", top.path().display())), "{e}");
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        reachable(&inner, &user).unwrap();
    }
}
