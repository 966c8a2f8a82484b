//! `idem-tui --admin URL [--token T]`: the operator console.

use clap::Parser;
use std::io::IsTerminal;
use std::process::ExitCode;

/// The idem operator console: live keys and leases, store faults, decisions.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// The admin API, e.g. http://127.0.0.1:9090.
    #[arg(long, env = "IDEM_ADMIN_URL", value_name = "URL")]
    admin: String,
    /// Bearer token, if the admin API asks for one.
    #[arg(
        long,
        env = "IDEM_ADMIN_TOKEN",
        value_name = "T",
        hide_env_values = true
    )]
    token: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    // A wrong URL is named before the terminal is touched.
    if let Err(e) = idem_tui::client::Client::new(&args.admin, None) {
        eprintln!("idem-tui: {e}");
        return ExitCode::from(2);
    }
    if !std::io::stdout().is_terminal() {
        eprintln!(
            "idem-tui: stdout is not a terminal; the console needs one (the admin API itself is plain JSON)"
        );
        return ExitCode::FAILURE;
    }
    match idem_tui::run(&args.admin, args.token).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idem-tui: {e}");
            ExitCode::FAILURE
        }
    }
}
