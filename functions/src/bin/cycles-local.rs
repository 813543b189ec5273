//! `cycles-local`: the whole API on 127.0.0.1:7878 for development, tests and benchmarks.

fn main() -> std::process::ExitCode {
    cycles_shared::local_cli::main()
}
