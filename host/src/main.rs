//! The `idem` command.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

mod debug;
mod demo;
mod options;
mod soak;

#[derive(Parser)]
#[command(
    name = "idem",
    version,
    about = "The idempotency layer: a guard in a WebAssembly component"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the HTTP idempotency gateway in front of an upstream service.
    Serve(Box<options::ServeOptions>),
    /// Runs the demo ledger service (an upstream to put behind the gateway).
    Ledger {
        /// Where the ledger listens (address:port); the gateway's --upstream points here.
        #[arg(
            long,
            env = "IDEM_LEDGER_LISTEN",
            default_value = "127.0.0.1:8081",
            value_name = "ADDR"
        )]
        listen: String,
        /// Units in stock at start.
        #[arg(long, default_value_t = 1_000_000)]
        stock: i64,
        /// Simulated work per order, e.g. 20ms.
        #[arg(long, default_value = "0ms", value_parser = idem::server::parse_duration)]
        latency: std::time::Duration,
    },
    /// Runs the ledger behind the gateway with misbehaving clients, then checks every order ran exactly once.
    Demo(demo::Args),
    /// Chaos soak: two gateways over one shared store in front of the ledger, with store faults
    /// and a gateway killed mid-run; checks every order ran at most once and every answer matches.
    Soak(soak::Args),
    /// The operator console: live keys, leases, faults and decisions of an `idem serve`.
    Tui {
        /// The admin API's base URL.
        #[arg(long, env = "IDEM_ADMIN_URL", default_value = "http://127.0.0.1:9090")]
        admin: String,
        /// The admin API's bearer token.
        #[arg(long, env = "IDEM_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Prints the WIT contract.
    Wit,
    /// Writes the exact component bytes this binary embeds, for other hosts to load.
    Component {
        /// The file to write the component to (e.g. guard.wasm); an existing file is replaced.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Test support: claims KEY in STORE, records BODY-FILE's bytes as its
    /// response, prints `completed KEY`, then waits to be killed.
    #[command(hide = true)]
    DebugComplete {
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
    #[command(hide = true)]
    DebugHammer(debug::HammerArgs),
    /// Claims keys and stops in the handler, in `complete` or amid store
    /// writes, then waits to be killed (crash-recovery tests).
    #[command(hide = true)]
    DebugCrash(debug::CrashArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Tui { admin, token } => {
            tokio::runtime::Runtime::new()?.block_on(idem_tui::run(&admin, token))?;
            Ok(())
        }
        Command::Wit => {
            for (name, text) in idem::component::WIT {
                println!("// wit/{name}\n{text}");
            }
            Ok(())
        }
        Command::Component { out } => {
            std::fs::write(&out, idem::component::COMPONENT)
                .with_context(|| format!("write {}", out.display()))?;
            eprintln!(
                "wrote {} bytes to {}",
                idem::component::COMPONENT.len(),
                out.display()
            );
            Ok(())
        }
        Command::DebugComplete {
            store,
            key,
            fingerprint,
            body_file,
        } => {
            let body = std::fs::read(&body_file)
                .with_context(|| format!("read {}", body_file.display()))?;
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(debug::complete(&store, &key, &fingerprint, body))?;
            // Hold the store open, as a server would, until killed.
            loop {
                std::thread::park();
            }
        }
        Command::DebugHammer(args) => tokio::runtime::Runtime::new()?.block_on(debug::hammer(args)),
        Command::DebugCrash(args) => {
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(debug::crash(args))?;
            // Hold the store open, as a server would, until killed.
            loop {
                std::thread::park();
            }
        }
        Command::Serve(options) => {
            tokio::runtime::Runtime::new()?.block_on(options::serve(*options))
        }
        Command::Ledger {
            listen,
            stock,
            latency,
        } => tokio::runtime::Runtime::new()?.block_on(async move {
            let listener = tokio::net::TcpListener::bind(&listen)
                .await
                .with_context(|| format!("listen on {listen}"))?;
            eprintln!(
                "idem ledger: http://{}/orders, http://{}/ledger",
                listener.local_addr()?,
                listener.local_addr()?
            );
            idem::ledger::run(
                idem::ledger::Ledger::new(stock, latency),
                listener,
                options::shutdown_signal(),
            )
            .await?;
            Ok(())
        }),
        Command::Soak(args) => tokio::runtime::Runtime::new()?.block_on(soak::run(args)),
        Command::Demo(args) => {
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(demo::run(args))
        }
    }
}
