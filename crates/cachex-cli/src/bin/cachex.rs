//! The `cachex` command-line tool; see `cachex_cli::cli`.

fn main() -> std::process::ExitCode {
    cachex_cli::main()
}
