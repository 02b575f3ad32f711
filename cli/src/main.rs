//! `muster`: one binary for the replica server, the admin and client CLI,
//! and the simulator.

mod alloc;
mod client;
mod cluster;
mod output;
mod server;
mod simulate;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::output::Output;

/// Muster: a Raft-replicated batch scheduler for GPU and HPC clusters.
#[derive(Parser, Debug)]
#[command(name = "muster", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

/// How client commands find the cluster and print results.
#[derive(Args, Debug)]
struct ClientArgs {
    /// Scheduler replicas, host:port[,host:port…]; leader hints are followed.
    #[arg(long, env = "MUSTER_SCHEDULER", default_value = "127.0.0.1:7001", global = true)]
    scheduler: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Text, global = true)]
    output: Output,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run one scheduler replica.
    Server(server::ServerArgs),
    /// Submit an allocation: muster submit [options] -- COMMAND [ARGS…].
    Submit {
        #[command(flatten)]
        client: ClientArgs,
        #[command(flatten)]
        args: alloc::SubmitArgs,
    },
    /// Inspect allocations.
    Alloc {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        cmd: alloc::AllocCmd,
    },
    /// Inspect and change the cluster of scheduler replicas.
    Cluster {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        cmd: cluster::ClusterCmd,
    },
    /// Run the deterministic scheduler simulator (synthetic workload or a real trace).
    Simulate(simulate::SimulateArgs),
    /// Print what this machine would register as a node (CPUs, memory, GPUs).
    Probe,
}

fn main() -> ExitCode {
    // Die quietly when stdout is a closed pipe (`muster alloc list | head`)
    // instead of panicking in println!.
    // SAFETY: called first thing, before any other thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Simulate(args) => simulate::run(&args),
        Cmd::Probe => probe(),
        other => async_main(other),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("muster: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn async_main(cmd: Cmd) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        match cmd {
            Cmd::Server(args) => {
                tracing_subscriber::fmt()
                    .with_env_filter(
                        tracing_subscriber::EnvFilter::try_from_default_env()
                            .unwrap_or_else(|_| "info,openraft=warn".into()),
                    )
                    .with_writer(std::io::stderr)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                    .init();
                server::run(args).await
            }
            Cmd::Submit { client, args } => {
                let mut cluster = client::Cluster::new(client::parse_addresses(&client.scheduler)?);
                alloc::submit(&mut cluster, args, client.output).await
            }
            Cmd::Alloc { client, cmd } => {
                let mut cluster = client::Cluster::new(client::parse_addresses(&client.scheduler)?);
                alloc::alloc(&mut cluster, cmd, client.output).await
            }
            Cmd::Cluster { client, cmd } => {
                let mut cluster = client::Cluster::new(client::parse_addresses(&client.scheduler)?);
                cluster::run(&mut cluster, cmd, client.output).await
            }
            Cmd::Simulate(_) | Cmd::Probe => unreachable!("run synchronously"),
        }
    })
}

fn probe() -> anyhow::Result<()> {
    let r = muster_agent::probe_resources()?;
    println!("cpus     {}", r.cpus);
    println!("mem_mb   {}", r.mem_mb);
    println!("gpus     {}", r.gpus);
    println!("vram_mb  {}", r.vram_mb);
    Ok(())
}
