//! The `idem` command; all of it is [`idem::cli`].

fn main() -> anyhow::Result<()> {
    idem::cli::main()
}
