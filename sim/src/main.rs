//! `cargo run --release -p sim -- [--whole] [--seeds N] [--seed S] [--secs T] [--stop]`: runs
//! seeds (of the whole node with `--whole`, see `sim::whole`)
//! S, S+1, ... (N of them, or until T seconds passed; `--seed S` alone runs one and prints its
//! trace hash). Each violation prints its seed and a reproduction command; `--stop` ends the
//! run at the first one. The last line is `N seeds, V violations, E events, F faults, X
//! seeds/s`. Exit code 1 on any violation.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
struct Args {
    seeds: Option<u64>,
    seed: Option<u64>,
    secs: Option<u64>,
    stop: bool,
    whole: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut num = |name: &str| -> Result<u64, String> {
            let v = it.next().ok_or_else(|| format!("{name} needs a number"))?;
            v.parse()
                .map_err(|_| format!("{name}: {v:?} is not a number"))
        };
        match flag.as_str() {
            "--seeds" => a.seeds = Some(num("--seeds")?),
            "--seed" => a.seed = Some(num("--seed")?),
            "--secs" => a.secs = Some(num("--secs")?),
            "--stop" => a.stop = true,
            "--whole" => a.whole = true,
            _ => return Err(format!("unknown argument {flag:?}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sim: {e}\nusage: sim [--whole] [--seeds N] [--seed S] [--secs T] [--stop]");
            return ExitCode::from(2);
        }
    };
    sim::quiet_panics();
    let single = args.seeds.is_none() && args.secs.is_none();
    let first = args.seed.unwrap_or(1);
    let count = args.seeds.unwrap_or(if single { 1 } else { u64::MAX });
    let deadline = args.secs.map(Duration::from_secs);
    let t0 = Instant::now();
    let (mut n, mut v, mut e, mut f) = (0u64, 0u64, 0u64, 0u64);
    for seed in first..first.saturating_add(count) {
        if deadline.is_some_and(|d| t0.elapsed() >= d) {
            break;
        }
        let r = if args.whole {
            sim::whole::run_seed(seed)
        } else {
            sim::run_seed(seed)
        };
        n += 1;
        e += r.events;
        f += r.faults;
        if single {
            println!(
                "seed {seed}: trace {:016x}, {} steps, {} events, {} faults",
                r.hash, r.steps, r.events, r.faults
            );
            let counts: Vec<String> = r.counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
            println!("  {}", counts.join(", "));
        }
        if let Some(msg) = &r.violation {
            v += 1;
            println!("VIOLATION seed {seed}: {msg}");
            let whole = if args.whole { " --whole" } else { "" };
            println!("  reproduce: cargo run --release -p sim --{whole} --seed {seed}");
            if args.stop {
                println!("first violation after {n} seeds");
                break;
            }
        }
    }
    let rate = n as f64 / t0.elapsed().as_secs_f64().max(1e-9);
    println!("{n} seeds, {v} violations, {e} events, {f} faults, {rate:.1} seeds/s");
    if v > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
