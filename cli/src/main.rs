//! `muster`: one binary for the simulator today, and the server, agent and
//! admin CLI as they land.

mod simulate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Muster: a Raft-replicated batch scheduler for GPU and HPC clusters.
#[derive(Parser, Debug)]
#[command(name = "muster", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the deterministic scheduler simulator (synthetic workload or a real trace).
    Simulate(simulate::SimulateArgs),
    /// Print what this machine would register as a node (CPUs, memory, GPUs).
    Probe,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Simulate(args) => simulate::run(&args),
        Cmd::Probe => probe(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("muster: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn probe() -> anyhow::Result<()> {
    let r = muster_agent::probe_resources()?;
    println!("cpus     {}", r.cpus);
    println!("mem_mb   {}", r.mem_mb);
    println!("gpus     {}", r.gpus);
    println!("vram_mb  {}", r.vram_mb);
    Ok(())
}
