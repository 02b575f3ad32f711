//! `muster`: one binary for the replica server, the admin and client CLI,
//! and the simulator.

/// `println!` that ends the process quietly when stdout is a closed pipe
/// (`muster alloc list | head`) instead of panicking. SIGPIPE itself stays
/// ignored: a replica or agent must survive a peer closing a socket.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout().lock(), $($arg)*) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                std::process::exit(0);
            }
            panic!("cannot write to stdout: {e}");
        }
    }};
}

/// jemalloc, not glibc's malloc. At a million tasks through 10,000 agent
/// streams, glibc's thread arenas grew the leader's resident memory 20–36 %
/// past its 100,000-task figure while a heap profile held the live data
/// flat; with jemalloc the same runs stay within 12–20 %, and the leader's
/// allocation-heavy paths (stream syncs, applies) run faster
/// (docs/performance.md, "Fleet scale"). `muster_allocator_*` export its
/// figures.
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read before `main`: one arena per CPU, each thread
/// allocating from the arena of the CPU it runs on (jemalloc's default is
/// four arenas per CPU, threads bound to them in turn). Memory one thread
/// frees is then reused by whatever runs on that CPU next, so a leader's
/// resident memory follows its live data more closely, with as many arenas
/// as the machine has cores (docs/performance.md, "Fleet scale"). An
/// operator's `_RJEM_MALLOC_CONF` is read after this and overrides it.
#[used]
// SAFETY: jemalloc declares this symbol weak and reads it as a C string;
// this defines it once, as a NUL-terminated static.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8; 20] = b"percpu_arena:percpu\0";

mod agent_cmd;
mod alloc;
mod args;
mod audit;
mod chaos;
mod client;
mod cluster;
mod dev;
mod history;
mod image_cmd;
mod images;
mod logging;
mod node;
mod output;
mod replay;
mod restore;
mod server;
mod simulate;
mod submit;
mod tls;
mod token;
mod vcluster;
mod workflow;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::output::Output;

/// Muster: a Raft-replicated batch scheduler for GPU and HPC clusters.
#[derive(Parser, Debug)]
#[command(
    name = "muster",
    version,
    about,
    after_help = "Examples:
  muster dev --demo                                   a whole cluster in one process, with a demo gang
  export MUSTER_SCHEDULER=127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003
  muster submit --gang-size 4 --gpus 1 --class 5 -- python train.py
  muster alloc watch 1                                follow it until it ends
  muster alloc explain 2                              why is it pending?
  muster node list --output json
  muster node drain gpu-07 --timeout 2h --reason \"kernel upgrade\"
  muster cluster status
  muster history --owner alice --since 7d --output csv
  muster usage --since 30d --by owner

Exit codes: 0 success; 1 the command failed or was refused (one line on stderr says why);
2 the command line itself is wrong."
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// How client commands find the cluster.
#[derive(Args, Debug)]
struct ConnArgs {
    /// Scheduler replicas, host:port[,host:port…]; leader hints are followed.
    #[arg(long, env = "MUSTER_SCHEDULER", default_value = "127.0.0.1:7001", global = true)]
    scheduler: String,
    #[command(flatten)]
    tls: client::TlsArgs,
    /// Which certificate in the TLS dir to use (e.g. admin-alice); default:
    /// the only admin certificate there, else the only client one.
    #[arg(long, env = "MUSTER_IDENTITY", global = true)]
    identity: Option<String>,
    /// A bearer token (`muster token create`): calls are made with its role
    /// instead of the certificate's.
    #[arg(long, env = "MUSTER_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
}

impl ConnArgs {
    fn cluster(&self) -> anyhow::Result<client::Cluster> {
        let tls = self.tls.load_client(self.identity.as_deref())?;
        let bearer = client::Bearer::new(self.token.as_deref())?;
        Ok(client::Cluster::new(client::parse_addresses(&self.scheduler)?, tls).with_token(bearer))
    }
}

/// How client commands find the cluster and print results.
#[derive(Args, Debug)]
struct ClientArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Text, global = true)]
    output: Output,
}

impl ClientArgs {
    fn cluster(&self) -> anyhow::Result<client::Cluster> {
        self.conn.cluster()
    }
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run a whole cluster in this process: 3 replicas and 4 agents on loopback.
    Dev(dev::DevArgs),
    /// Run one scheduler replica.
    Server(server::ServerArgs),
    /// Run the node agent for this machine.
    Agent(agent_cmd::AgentArgs),
    /// Submit an allocation: muster submit [options] -- COMMAND [ARGS…].
    Submit {
        #[command(flatten)]
        client: ClientArgs,
        #[command(flatten)]
        args: submit::SubmitArgs,
    },
    /// Inspect allocations.
    Alloc {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        cmd: alloc::AllocCmd,
    },
    /// Inspect nodes and manage their lifecycle (drain, cancel-drain, stop,
    /// restart, terminate, scale-down).
    Node {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        cmd: node::NodeCmd,
    },
    /// Container images: warm nodes' caches ahead of a large gang (prefetch).
    Image {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        cmd: image_cmd::ImageCmd,
    },
    /// vClusters: named slices of the cluster with a type, home nodes,
    /// quotas and a borrowing limit (create, update, get, list).
    Vcluster {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        cmd: vcluster::VClusterCmd,
    },
    /// The job history: finished allocations, kept after the live state
    /// forgets them (filter by owner, vCluster, status and time).
    History {
        #[command(flatten)]
        conn: ConnArgs,
        #[command(flatten)]
        args: history::HistoryArgs,
    },
    /// GPU-hours and job counts per owner and vCluster over a period, from
    /// the job history.
    Usage {
        #[command(flatten)]
        conn: ConnArgs,
        #[command(flatten)]
        args: history::UsageArgs,
    },
    /// Inspect and change the cluster of scheduler replicas.
    Cluster {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        cmd: cluster::ClusterCmd,
    },
    /// Prepare an empty data dir to start a new cluster from a backup
    /// (`muster cluster backup`); offline, once per member.
    Restore(restore::RestoreArgs),
    /// Run the deterministic scheduler simulator (synthetic workload or a real trace).
    Simulate(simulate::SimulateArgs),
    /// Replay a cluster's real workload (from a backup, a data dir or a job
    /// history) through the simulator, as recorded and under what-if settings.
    Replay(replay::ReplayArgs),
    /// Check offline that a committed log kept every promise: replicas'
    /// data dirs replayed entry by entry with every invariant checked, or a
    /// backup's state.
    Audit(audit::AuditArgs),
    /// Chaos test: real replicas and agents under kills, pauses and
    /// partitions, then checks that nothing acknowledged was lost.
    Chaos(chaos::ChaosArgs),
    /// Bearer tokens for admins, clients and readers: create, list, revoke.
    Token {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        cmd: token::TokenCmd,
    },
    /// Certificates for mutual TLS: a cluster CA and role certificates.
    Tls {
        #[command(subcommand)]
        cmd: tls::TlsCmd,
    },
    /// Print what this machine would register as a node (CPUs, memory, GPUs).
    Probe,
    /// Report progress from inside a task (feeds its stall watchdog): appends
    /// to $MUSTER_PROGRESS_FILE.
    Beat,
    /// Run a task under the agent's shim (what `muster agent --keep-tasks`
    /// starts): wait for COMMAND, write its exit status to the file, exit
    /// the same way.
    #[command(name = "task-shim", hide = true)]
    TaskShim {
        /// Where the exit status goes (`code N` or `signal N`).
        #[arg(long)]
        status: std::path::PathBuf,
        /// The task's command.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// The shim of a task that runs as another user (kept across agent
    /// restarts): stays the agent's, starts COMMAND as the user, waits for
    /// it and writes its exit status.
    #[command(name = "task-exec", hide = true)]
    TaskExec {
        /// UID:GID:GROUPS, never root.
        #[arg(long)]
        user: String,
        /// Where the exit status goes (`code N` or `signal N`).
        #[arg(long)]
        status: std::path::PathBuf,
        /// The task's command.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Run a task in its container image (what an agent starts for a task
    /// with --image): namespaces, the image's overlay root, pivot_root, the
    /// command; waits for it and exits the same way (docs/containers.md).
    #[command(name = "task-container", hide = true)]
    TaskContainer {
        /// The plan the agent wrote.
        #[arg(long)]
        plan: std::path::PathBuf,
    },
    /// One rank of a chaos-test gang (what `muster chaos` runs as each
    /// task): beats with its gang's master over the chaos fabric and
    /// journals its life; see muster_chaos::rank.
    #[command(name = "chaos-rank", hide = true)]
    ChaosRank {
        /// Beats (250 ms each) the gang runs once every rank has joined.
        #[arg(long)]
        beats: u64,
    },
    /// The daemon a rank of the daemonising chaos workload leaves behind:
    /// beats in the journal as its attempt until killed; see
    /// muster_chaos::rank::daemon.
    #[command(name = "chaos-daemon", hide = true)]
    ChaosDaemon,
    /// Print a shell completion script: muster completions bash > /etc/bash_completion.d/muster
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Parses the command line; a `submit` whose command was not put after
/// `--` gets a hint saying so (clap's own message names only the first
/// word it did not expect).
fn parse_cli() -> Cli {
    Cli::try_parse().unwrap_or_else(|e| {
        let args: Vec<String> = std::env::args().collect();
        let submit = args.iter().skip(1).any(|a| a == "submit");
        if e.kind() == clap::error::ErrorKind::UnknownArgument && submit && !args.iter().any(|a| a == "--") {
            let _ = e.print();
            eprintln!("\nhint: put the task's command after `--`: muster submit [OPTIONS] -- python3 train.py");
            std::process::exit(2);
        }
        e.exit()
    })
}

fn main() -> ExitCode {
    let cli = parse_cli();
    let result = match cli.command {
        Cmd::Simulate(args) => simulate::run(&args),
        Cmd::Replay(args) => replay::run(&args),
        Cmd::Audit(args) => audit::run(&args),
        Cmd::Probe => probe(),
        Cmd::Restore(args) => restore::run(&args),
        Cmd::Tls { cmd } => tls::run(cmd),
        Cmd::Beat => beat(),
        Cmd::TaskShim { status, command } => {
            let code = muster_agent::executor::run_shim(&status, &command);
            return ExitCode::from(u8::try_from(code).unwrap_or(1));
        }
        Cmd::TaskExec { user, status, command } => {
            let code = match muster_agent::users::TaskUser::from_arg(&user) {
                Ok(user) => muster_agent::executor::run_task_exec(&user, &status, &command),
                Err(e) => {
                    eprintln!("muster task-exec: {e}");
                    126
                }
            };
            return ExitCode::from(u8::try_from(code).unwrap_or(1));
        }
        Cmd::TaskContainer { plan } => {
            let code = muster_agent::container::run_container(&plan);
            return ExitCode::from(u8::try_from(code).unwrap_or(1));
        }
        Cmd::ChaosRank { beats } => {
            let code = muster_chaos::rank::main(beats);
            return ExitCode::from(u8::try_from(code).unwrap_or(1));
        }
        Cmd::ChaosDaemon => {
            let code = muster_chaos::rank::daemon();
            return ExitCode::from(u8::try_from(code).unwrap_or(1));
        }
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "muster", &mut std::io::stdout());
            Ok(())
        }
        other => async_main(other),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // One rule: 2 for a command line that cannot be run as given (clap's
        // own errors, and values our parsers refuse), 1 for anything else
        // (a refused request, an unreachable cluster, a failed job).
        Err(e) if e.downcast_ref::<BadCommandLine>().is_some() => {
            eprintln!("muster: error: {e:#}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("muster: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// A flag's value that cannot be used as given: the command exits 2, as for
/// clap's own errors.
#[derive(Debug)]
pub(crate) struct BadCommandLine(pub(crate) String);

impl std::fmt::Display for BadCommandLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadCommandLine {}

/// Returns a [`BadCommandLine`] error: `usage!("--peers: {x:?} is not host:port")`.
#[macro_export]
macro_rules! usage {
    ($($arg:tt)*) => {
        return Err(anyhow::Error::new($crate::BadCommandLine(format!($($arg)*))))
    };
}

fn async_main(cmd: Cmd) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        match cmd {
            Cmd::Server(args) => {
                logging::init(SERVER_LOG_FILTER);
                server::run(args).await
            }
            Cmd::Agent(args) => {
                logging::init("info");
                agent_cmd::run(args).await
            }
            Cmd::Chaos(args) => {
                logging::init("warn");
                chaos::run_chaos(args).await
            }
            Cmd::Dev(args) => {
                logging::init(DEV_LOG_FILTER);
                dev::run(args).await
            }
            Cmd::Submit { client, args } => {
                let mut cluster = client.cluster()?;
                submit::submit(&mut cluster, args, client.output).await
            }
            Cmd::Alloc { client, cmd } => {
                let mut cluster = client.cluster()?;
                alloc::alloc(&mut cluster, cmd, client.output).await
            }
            Cmd::Node { client, cmd } => {
                let mut cluster = client.cluster()?;
                node::run(&mut cluster, cmd, client.output).await
            }
            Cmd::Image { client, cmd } => {
                let mut cluster = client.cluster()?;
                image_cmd::run(&mut cluster, cmd, client.output).await
            }
            Cmd::Token { client, cmd } => {
                let mut cluster = client.cluster()?;
                token::run(&mut cluster, cmd, client.output).await
            }
            Cmd::Vcluster { client, cmd } => {
                let mut cluster = client.cluster()?;
                vcluster::run(&mut cluster, cmd, client.output).await
            }
            Cmd::Cluster { client, cmd } => {
                let mut cluster = client.cluster()?;
                cluster::run(&mut cluster, cmd, client.output).await
            }
            Cmd::History { conn, args } => history::history(&mut conn.cluster()?, args).await,
            Cmd::Usage { conn, args } => history::usage(&mut conn.cluster()?, args).await,
            Cmd::Simulate(_)
            | Cmd::Replay(_)
            | Cmd::Audit(_)
            | Cmd::Probe
            | Cmd::Beat
            | Cmd::Completions { .. }
            | Cmd::Tls { .. }
            | Cmd::TaskShim { .. }
            | Cmd::TaskExec { .. }
            | Cmd::TaskContainer { .. }
            | Cmd::ChaosRank { .. }
            | Cmd::ChaosDaemon
            | Cmd::Restore(_) => {
                unreachable!("run synchronously")
            }
        }
    })
}

/// openraft's modules that log every retry to a down peer (twice a second,
/// with the whole tonic error chain) and every routine vote: the server's
/// network layer says instead, once, when a peer goes and comes back.
macro_rules! openraft_quiet {
    () => {
        "openraft::replication=off,openraft::engine::handler::replication_handler=off,openraft::core::raft_core=off"
    };
}

/// The default log filter of `muster server` (`RUST_LOG` replaces it).
const SERVER_LOG_FILTER: &str = concat!("info,openraft=warn,", openraft_quiet!());

/// The default log filter of `muster dev`: its own story on stdout, and
/// only what needs a person on stderr.
const DEV_LOG_FILTER: &str = concat!("warn,openraft=error,", openraft_quiet!());

/// Appends one byte to the task's progress file: any change to it is a beat.
fn beat() -> anyhow::Result<()> {
    use std::io::Write;
    let path = std::env::var_os("MUSTER_PROGRESS_FILE")
        .ok_or_else(|| anyhow::anyhow!("MUSTER_PROGRESS_FILE is not set: run muster beat from inside a task"))?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", std::path::Path::new(&path).display()))?;
    f.write_all(b".")?;
    Ok(())
}

fn probe() -> anyhow::Result<()> {
    let r = muster_agent::probe_resources()?;
    out!("cpus     {}", r.cpus);
    out!("mem_mb   {}", r.mem_mb);
    out!("gpus     {}", r.gpus);
    out!("vram_mb  {}", r.vram_mb);
    for (k, v) in muster_agent::probe_labels() {
        out!("label    {k}={v}");
    }
    Ok(())
}
