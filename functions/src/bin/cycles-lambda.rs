//! The deployed artifact: every Lambda function runs this one binary, which serves the function
//! its `CYCLES_FUNCTION` names (see `template.yaml`). The per-function binaries beside it serve
//! the same code one function each, for `cargo lambda watch`.

fn main() -> Result<(), cycles_shared::lambda::Error> {
    cycles_shared::lambda::start(cycles_shared::lambda::run_named())
}
