//! The `cachex` command-line tool; see `cache_facade::cli`.

fn main() -> std::process::ExitCode {
    cache_facade::cli::main()
}
