//! Command line of `cycles-admin`: operator tasks run against a store directly (export and
//! import of a tenant), each written to the tenant's audit log.

use std::io::{BufRead, Write};
use std::process::ExitCode;

use serde_json::Value;

use crate::config::Config;
use crate::ops::transfer;

const USAGE: &str = "cycles-admin: operator tasks against a Cycles store

USAGE: cycles-admin export --tenant ID [--redis-url URL] [--out FILE]
       cycles-admin import [--replace] [--redis-url URL] [--in FILE]

  export   every record of one tenant, read at one point, as JSON lines (a header line, then
           one line per key) on standard output or FILE
  import   restores an export into this store (the tenant keeps its id, keys, balances, open
           holds and idempotency records); refuses a tenant that exists here unless --replace
  --redis-url URL  the store (default: $REDIS_URL)";

pub fn main() -> ExitCode {
    crate::init_tracing(false);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    match runtime.block_on(run(std::env::args().skip(1).collect())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cycles-admin: {e}\n\n{USAGE}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Vec<String>) -> Result<(), String> {
    let (command, rest) = args.split_first().ok_or("no command")?;
    let mut options = std::collections::HashMap::new();
    let mut flags = Vec::new();
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--tenant" | "--redis-url" | "--out" | "--in" => {
                options.insert(a.as_str(), it.next().ok_or(format!("{a} needs a value"))?.clone());
            }
            "--replace" => flags.push("replace"),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let mut config = Config::from_env(None);
    if let Some(url) = options.get("--redis-url") {
        config.redis_url = url.clone();
    }
    let store = config.open_store().await.map_err(|e| format!("cannot connect to the store: {e}"))?;
    let now = crate::domain::now_ms();
    match command.as_str() {
        "export" => {
            let tenant = options.get("--tenant").ok_or("export needs --tenant")?;
            let lines = transfer::export(&store, tenant, now).await.map_err(|e| e.message)?;
            let mut out: Box<dyn Write> = match options.get("--out") {
                Some(path) => Box::new(std::fs::File::create(path).map_err(|e| format!("{path}: {e}"))?),
                None => Box::new(std::io::stdout().lock()),
            };
            for line in &lines {
                writeln!(out, "{line}").map_err(|e| e.to_string())?;
            }
            out.flush().map_err(|e| e.to_string())?;
            let records = lines.len() - 1;
            eprintln!("exported tenant {tenant}: {records} records");
        }
        "import" => {
            let input: Box<dyn BufRead> = match options.get("--in") {
                Some(path) => {
                    Box::new(std::io::BufReader::new(std::fs::File::open(path).map_err(|e| format!("{path}: {e}"))?))
                }
                None => Box::new(std::io::stdin().lock()),
            };
            let mut lines = Vec::new();
            for (i, line) in input.lines().enumerate() {
                let line = line.map_err(|e| e.to_string())?;
                if !line.trim().is_empty() {
                    lines.push(serde_json::from_str::<Value>(&line).map_err(|e| format!("line {}: {e}", i + 1))?);
                }
            }
            let imported = transfer::import(&store, &lines, flags.contains(&"replace")).await.map_err(|e| e.message)?;
            eprintln!("imported tenant {}: {} records", imported.tenant, imported.records);
        }
        other => return Err(format!("unknown command {other}")),
    }
    Ok(())
}
