//! `cycles-admin`: operator tasks against a store (export and import of a tenant).

fn main() -> std::process::ExitCode {
    cycles_shared::admin_cli::main()
}
