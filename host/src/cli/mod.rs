//! The `idem` command: `serve`, `demo`, `ledger`, `tui`, `wit` and
//! `component`, behind the `cli` feature. `src/main.rs` only calls [`main`];
//! the test rigs (`idem-testkit`, in `testkit/`) call [`run`] too, so the
//! gateways their tests start and kill run exactly this code.
//!
//! ```no_run
//! use clap::Parser;
//! idem::cli::run(idem::cli::Cli::parse_from(["idem", "wit"])).unwrap();
//! ```

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

mod demo;
mod log_line;
mod log_writer;
mod options;
mod telemetry;

pub use log_writer::{Batched, Flush};
pub use telemetry::{LogFormat, log_lines};

#[derive(Parser)]
#[command(
    name = "idem",
    // The crate's version, which is the workspace's: it moves with every release.
    version = env!("CARGO_PKG_VERSION"),
    about = "The idempotency layer: a guard in a WebAssembly component"
)]
pub struct Cli {
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
        #[arg(long, default_value = "0ms", value_parser = crate::server::parse_duration)]
        latency: std::time::Duration,
        /// The store guarding `POST /fulfilments` (as `idem serve --store`):
        /// `memory:`, `sqlite:PATH`, `redis://…`, `postgres://…`, `dynamodb://…`.
        #[arg(
            long,
            env = "IDEM_LEDGER_STORE",
            default_value = "memory:",
            value_name = "URL"
        )]
        store: String,
        /// The lease of a fulfilment's claim: how soon a killed holder's
        /// order can be taken over. Store calls time out after half of it
        /// (at most 5 s), so a renewal always lands inside the lease.
        #[arg(long, default_value = "30s", value_parser = crate::server::parse_duration)]
        lease: std::time::Duration,
        /// Keep the books in this file (JSON), across restarts; without it they live in memory.
        #[arg(long, value_name = "FILE")]
        books: Option<std::path::PathBuf>,
    },
    /// Runs the ledger behind the gateway with misbehaving clients, then checks every order ran exactly once.
    Demo(demo::Args),
    /// The operator console: live keys, leases, faults and decisions of an `idem serve`.
    Tui {
        /// The admin API's base URL.
        #[arg(long, env = "IDEM_ADMIN_URL", default_value = "http://127.0.0.1:9090")]
        admin: String,
        /// The admin API's bearer token (on the command line it shows in `ps`: prefer IDEM_ADMIN_TOKEN or --token-file).
        #[arg(long, env = "IDEM_ADMIN_TOKEN", hide_env_values = true)]
        token: Option<String>,
        /// A file holding the bearer token (one trailing newline is dropped); not with --token.
        #[arg(long, env = "IDEM_ADMIN_TOKEN_FILE", value_name = "FILE")]
        token_file: Option<PathBuf>,
    },
    /// Prints the WIT contract.
    Wit,
    /// Writes the exact component bytes this binary embeds, for other hosts to load.
    Component {
        /// The file to write the component to (e.g. guard.wasm); an existing file is replaced.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
}

/// Parses this process's arguments and runs the command. An error is
/// printed with its chain of causes (`error: what: why`) and exits 1; never
/// with a backtrace, whatever `RUST_BACKTRACE` says (a backtrace locates a
/// bug in the program, not a mistake in its input).
pub fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs one parsed command to its end (`serve` and `ledger`: until a
/// shutdown signal).
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Tui {
            admin,
            token,
            token_file,
        } => {
            let token =
                idem_tui::token_from(token, token_file.as_deref()).map_err(anyhow::Error::msg)?;
            tokio::runtime::Runtime::new()?.block_on(idem_tui::run(&admin, token))?;
            Ok(())
        }
        Command::Wit => {
            for (name, text) in crate::component::WIT {
                println!("// wit/{name}\n{text}");
            }
            Ok(())
        }
        Command::Component { out } => {
            std::fs::write(&out, crate::component::COMPONENT)
                .with_context(|| format!("write {}", out.display()))?;
            eprintln!(
                "wrote {} bytes to {}",
                crate::component::COMPONENT.len(),
                out.display()
            );
            Ok(())
        }
        Command::Serve(options) => {
            tokio::runtime::Runtime::new()?.block_on(options::serve(*options))
        }
        Command::Ledger {
            listen,
            stock,
            latency,
            store,
            lease,
            books,
        } => tokio::runtime::Runtime::new()?.block_on(async move {
            let mut ledger = crate::ledger::Ledger::new(stock, latency);
            if let Some(books) = books {
                ledger = ledger.with_books_file(books)?;
            }
            // Listening first: connections wait in the backlog, not refused,
            // while the guard compiles the component.
            let listener = tokio::net::TcpListener::bind(&listen)
                .await
                .with_context(|| format!("listen on {listen}"))?;
            let guard = crate::GuardBuilder::from_arc(crate::store::open(&store).await?)
                .lease(lease)
                .store_timeout((lease / 2).min(crate::guard::DEFAULT_STORE_TIMEOUT))
                .build()
                .context("the guard of /fulfilments (--store, --lease)")?;
            let ledger = ledger.with_guard(guard);
            let addr = listener.local_addr()?;
            eprintln!(
                "idem ledger: http://{addr}/orders, http://{addr}/fulfilments (store {store}), http://{addr}/ledger"
            );
            crate::ledger::run(ledger, listener, options::shutdown_signal()).await?;
            Ok(())
        }),
        Command::Demo(args) => {
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(demo::run(args))
        }
    }
}
