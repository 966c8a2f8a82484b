//! The `idem` command; all of it is [`idem::cli`].

fn main() -> std::process::ExitCode {
    idem::cli::main()
}
