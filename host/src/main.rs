//! The `idem` command.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

mod debug;
mod demo;

#[derive(Parser)]
#[command(name = "idem", version, about = "The idempotency layer: a guard in a WebAssembly component")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the seed's scenarios at scale through the component and prints what happened.
    Demo(demo::Args),
    /// Prints the WIT contract.
    Wit,
    /// Writes the exact component bytes this binary embeds, for other hosts to load.
    Component {
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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Wit => {
            for (name, text) in idem::component::WIT {
                println!("// wit/{name}\n{text}");
            }
            Ok(())
        }
        Command::Component { out } => {
            std::fs::write(&out, idem::component::COMPONENT).with_context(|| format!("write {}", out.display()))?;
            eprintln!("wrote {} bytes to {}", idem::component::COMPONENT.len(), out.display());
            Ok(())
        }
        Command::DebugComplete { store, key, fingerprint, body_file } => {
            let body = std::fs::read(&body_file).with_context(|| format!("read {}", body_file.display()))?;
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(debug_complete(&store, &key, &fingerprint, body))?;
            // Hold the store open, as a server would, until killed.
            loop {
                std::thread::park();
            }
        }
        Command::DebugHammer(args) => tokio::runtime::Runtime::new()?.block_on(debug::hammer(args)),
        Command::Demo(args) => {
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(demo::run(args))
        }
    }
}

async fn debug_complete(url: &str, key: &str, fingerprint: &str, body: Vec<u8>) -> anyhow::Result<()> {
    use std::io::Write;
    let store = idem::store::open(url).await?;
    let guard = idem::Guard::builder(store).build()?;
    let idem::Decision::Proceed(claim) = guard.begin(key, fingerprint).await? else {
        anyhow::bail!("key {key:?} is not free to claim");
    };
    let response = idem::Response { status: 201, headers: vec![("x-idem-test".into(), b"crash".to_vec())], body };
    guard.complete(claim, response).await.1?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "completed {key}")?;
    out.flush()?;
    // Leak the guard and store: no drop, no clean close; only the kill ends them.
    std::mem::forget(guard);
    Ok(())
}
