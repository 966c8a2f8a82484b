//! `idem-testkit`: the test rigs that must be processes of their own, kept
//! out of the product's `idem` binary. Its subcommands:
//!
//! - `soak`: the chaos soak, two gateways and a ledger killed, paused and
//!   faulted while clients retry; see `soak/mod.rs`.
//! - `complete`, `crash`, `hammer`: a process that writes to a store and
//!   then waits for a `kill -9`, or races a twin, for the tests in
//!   `tests/it/`.
//! - `idem …`: the product's own command line ([`idem::cli`]), so a rig's
//!   gateway runs exactly the code of `idem serve`, and cargo builds it with
//!   the tests (a test can only find the binaries of its own package).

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

mod crash;
mod hammer;
mod soak;

#[derive(Parser)]
#[command(
    name = "idem-testkit",
    about = "The idem test rigs: the chaos soak and the processes the crash tests kill"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Chaos soak: two gateways over one shared store in front of the ledger, with store faults
    /// and a gateway killed mid-run; checks every order ran at most once and every answer matches.
    Soak(soak::Args),
    /// Claims KEY in STORE, records BODY-FILE's bytes as its response, prints
    /// `completed KEY`, then waits to be killed.
    Complete {
        #[arg(long)]
        store: String,
        #[arg(long)]
        key: String,
        #[arg(long)]
        fingerprint: String,
        #[arg(long, value_name = "FILE")]
        body_file: PathBuf,
    },
    /// Claims shared keys against a store and prints the keys it executed (multi-process tests).
    Hammer(hammer::HammerArgs),
    /// Claims keys and stops in the handler, in `complete` or amid store
    /// writes, then waits to be killed (crash-recovery tests).
    Crash(crash::CrashArgs),
    /// Runs the product's `idem` command with these arguments, e.g. `idem serve …`.
    Idem {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Soak(args) => tokio::runtime::Runtime::new()?.block_on(soak::run(args)),
        Command::Complete {
            store,
            key,
            fingerprint,
            body_file,
        } => {
            let body = std::fs::read(&body_file)
                .with_context(|| format!("read {}", body_file.display()))?;
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(crash::complete(&store, &key, &fingerprint, body))?;
            // Hold the store open, as a server would, until killed.
            loop {
                std::thread::park();
            }
        }
        Command::Hammer(args) => tokio::runtime::Runtime::new()?.block_on(hammer::hammer(args)),
        Command::Crash(args) => {
            // Kept to the end: the halted runs are tasks on it.
            let runtime = crash::runtime(&args)?;
            runtime.block_on(crash::crash(args))?;
            // Hold the store open, as a server would, until killed.
            loop {
                std::thread::park();
            }
        }
        Command::Idem { args } => {
            let cli = <idem::cli::Cli as Parser>::parse_from(
                std::iter::once(OsString::from("idem")).chain(args),
            );
            idem::cli::run(cli)
        }
    }
}
