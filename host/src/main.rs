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
        Command::DebugHammer(args) => tokio::runtime::Runtime::new()?.block_on(debug::hammer(args)),
        Command::Demo(args) => {
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(demo::run(args))
        }
    }
}
