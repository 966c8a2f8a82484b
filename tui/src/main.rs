//! `idem-tui --admin URL [--token T | --token-file FILE]`: the operator console.

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
    /// Bearer token, if the admin API asks for one (on the command line it shows in `ps`: prefer IDEM_ADMIN_TOKEN or --token-file).
    #[arg(
        long,
        env = "IDEM_ADMIN_TOKEN",
        value_name = "T",
        hide_env_values = true
    )]
    token: Option<String>,
    /// A file holding the bearer token (one trailing newline is dropped); not with --token.
    #[arg(long, env = "IDEM_ADMIN_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let token = match idem_tui::token_from(args.token, args.token_file.as_deref()) {
        Ok(token) => token,
        Err(e) => {
            eprintln!("idem-tui: {e}");
            return ExitCode::from(2);
        }
    };
    // A wrong URL is named before the terminal is touched.
    if let Err(e) = idem_tui::check_admin_url(&args.admin) {
        eprintln!("idem-tui: {e}");
        return ExitCode::from(2);
    }
    if !std::io::stdout().is_terminal() {
        eprintln!(
            "idem-tui: stdout is not a terminal; the console needs one (the admin API itself is plain JSON)"
        );
        return ExitCode::FAILURE;
    }
    match idem_tui::run(&args.admin, token).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idem-tui: {e}");
            ExitCode::FAILURE
        }
    }
}
