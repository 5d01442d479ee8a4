//! `braid-lab`: the network lab at a shell. Builds a persistent lab (it stays
//! after the command exits), changes it, measures it and tears it down. Each
//! lab's description lives in `/run/braid-lab/<name>.json` so that later
//! commands find it. Only glue: the work is in the `braid_lab` library.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use braid_lab::{Addressing, Cut, Lab, LabConfig, LabSpec, Rate, Shaping, Side};
use clap::{Parser, Subcommand};

/// Where persistent labs' descriptions are kept (tmpfs: gone at reboot,
/// like the namespaces they describe).
const STATE_DIR: &str = "/run/braid-lab";

/// Network lab for braid: namespaces joined by shaped veth links.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// Which lab (namespaces braid-NAME-s and braid-NAME-c).
    #[arg(long, global = true, default_value = "lab")]
    name: String,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Build a lab and leave it running.
    Up {
        /// One rate per path, e.g. 1gbit,100mbit (or unlimited).
        #[arg(long, value_delimiter = ',', required = true)]
        rates: Vec<Rate>,
        /// split (a /24 per path), same-subnet (one /24, source routing)
        /// or flux (one /24, client routes everything via path 1).
        #[arg(long, default_value = "split")]
        addressing: Addressing,
        /// gso (tbf over GSO super-packets with wire overhead charged: the
        /// lab's reference) or frames (tbf over MTU-sized packets with a
        /// 64 KiB bucket: a coarser shaper).
        #[arg(long, default_value = "gso")]
        shaping: Shaping,
    },
    /// Tear a lab down.
    Down,
    /// Cut path N: link down, or with --blackhole drop all its packets.
    Cut {
        /// Path number, from 1.
        path: usize,
        /// Drop packets silently instead of taking the link down.
        #[arg(long)]
        blackhole: bool,
    },
    /// Undo a cut of path N.
    Restore {
        /// Path number, from 1.
        path: usize,
    },
    /// Change path N's rate.
    Rate {
        /// Path number, from 1.
        path: usize,
        /// New rate, e.g. 100mbit or unlimited.
        rate: Rate,
    },
    /// Show the lab: paths, addresses, rates, cuts, byte counters.
    Status,
    /// iperf3 on each path alone, then on all paths at once.
    Iperf {
        /// Length of each measurement.
        #[arg(long, default_value_t = 5)]
        seconds: u32,
        /// Measure storage-to-client (reads) instead of client-to-storage.
        #[arg(long)]
        reverse: bool,
    },
    /// Run a command inside one side's namespace.
    Exec {
        /// client or storage.
        side: Side,
        /// The command and its arguments (after --).
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // A closed stderr must not turn the exit status into a panic's.
            let _ = writeln!(std::io::stderr(), "braid-lab: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let name = cli.name;
    match cli.command {
        Cmd::Up {
            rates,
            addressing,
            shaping,
        } => up(&name, rates, addressing, shaping),
        Cmd::Down => {
            let lab = adopt(&name)?;
            lab.down().context("tearing the lab down")?;
            std::fs::remove_file(state_file(&name)).context("removing the lab's state file")?;
            println!("lab {name} is down");
            Ok(())
        }
        Cmd::Cut { path, blackhole } => {
            let how = if blackhole {
                Cut::Blackhole
            } else {
                Cut::LinkDown
            };
            with_lab(&name, |lab| Ok(lab.cut(path, how)?))?;
            println!(
                "path {path} cut ({})",
                if blackhole { "blackhole" } else { "link down" }
            );
            Ok(())
        }
        Cmd::Restore { path } => {
            with_lab(&name, |lab| Ok(lab.restore(path)?))?;
            println!("path {path} restored");
            Ok(())
        }
        Cmd::Rate { path, rate } => {
            with_lab(&name, |lab| Ok(lab.set_rate(path, rate)?))?;
            println!("path {path} now {rate}");
            Ok(())
        }
        Cmd::Status => with_lab(&name, status),
        Cmd::Iperf { seconds, reverse } => with_lab(&name, |lab| iperf(lab, seconds, reverse)),
        Cmd::Exec { side, command } => exec(&name, side, &command),
    }
}

fn up(name: &str, rates: Vec<Rate>, addressing: Addressing, shaping: Shaping) -> Result<()> {
    if state_file(name).exists() {
        bail!("lab {name} already exists; `braid-lab down --name {name}` first, or pick another --name");
    }
    let cfg = LabConfig {
        rates,
        addressing,
        shaping,
        name: Some(name.to_owned()),
    };
    let started = std::time::Instant::now();
    let lab = Lab::up(cfg).context("building the lab")?;
    // Saved before `keep`: if this fails, dropping `lab` removes it again.
    save(&lab.spec())?;
    let spec = lab.keep();
    println!(
        "lab {name} up in {} ms ({} addressing, {} shaping)",
        started.elapsed().as_millis(),
        spec.addressing,
        spec.shaping
    );
    println!("  storage namespace: {}", spec.storage_ns);
    println!("  client namespace:  {}", spec.client_ns);
    print_paths(&spec);
    println!(
        "run a command inside:  ip netns exec {} CMD...",
        spec.client_ns
    );
    println!("                  or:  braid-lab --name {name} exec client -- CMD...");
    println!("tear down:             braid-lab --name {name} down");
    Ok(())
}

fn status(lab: &Lab) -> Result<()> {
    let spec = lab.spec();
    println!(
        "lab {} ({} addressing): storage {}, client {}",
        spec.tag, spec.addressing, spec.storage_ns, spec.client_ns
    );
    println!("  path  rate       state      client                  storage                 client tx/rx bytes");
    for p in &spec.paths {
        let state = match lab.cut_state(p.index)? {
            None => "up",
            Some(Cut::LinkDown) => "link-down",
            Some(Cut::Blackhole) => "blackhole",
        };
        let c = lab.counters(p.index)?;
        println!(
            "  {:<5} {:<10} {:<10} {:<23} {:<23} {}/{}",
            p.index,
            p.rate.to_string(),
            state,
            endpoint(&p.client_iface, p.client_addr),
            endpoint(&p.storage_iface, p.storage_addr),
            c.tx_bytes,
            c.rx_bytes
        );
    }
    Ok(())
}

fn iperf(lab: &Lab, seconds: u32, reverse: bool) -> Result<()> {
    let paths: Vec<usize> = lab.paths().iter().map(|p| p.index).collect();
    let dir = if reverse {
        "storage -> client"
    } else {
        "client -> storage"
    };
    println!("iperf3, one stream per path, {dir}, {seconds} s each, MB/s = 10^6 bytes/s");
    for p in lab.paths() {
        let r = lab.iperf3(&[p.index], seconds, reverse)?;
        println!("  path {} alone ({}): {:.1} MB/s", p.index, p.rate, r[0]);
    }
    if paths.len() > 1 {
        let r = lab.iperf3(&paths, seconds, reverse)?;
        let each: Vec<String> = r.iter().map(|v| format!("{v:.1}")).collect();
        println!(
            "  all at once: {} = {:.1} MB/s",
            each.join(" + "),
            r.iter().sum::<f64>()
        );
    }
    Ok(())
}

fn exec(name: &str, side: Side, command: &[String]) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let spec = load(name)?;
    // `ip netns exec` (rather than the library's setns) so that /sys shows
    // the namespace's interfaces too, as an interactive user expects.
    let err = std::process::Command::new("ip")
        .args(["netns", "exec", spec.ns(side)])
        .args(command)
        .exec();
    Err(err).context("running ip netns exec")
}

/// Runs `f` on the named lab, leaving the lab up afterwards whatever happens,
/// and saves its description again (rates may have changed).
fn with_lab(name: &str, f: impl FnOnce(&Lab) -> Result<()>) -> Result<()> {
    let lab = adopt(name)?;
    let result = f(&lab);
    let spec = lab.keep();
    save(&spec)?;
    result
}

fn adopt(name: &str) -> Result<Lab> {
    Lab::adopt(load(name)?).with_context(|| format!("lab {name} is described but gone"))
}

fn state_file(name: &str) -> PathBuf {
    PathBuf::from(STATE_DIR).join(format!("{name}.json"))
}

fn load(name: &str) -> Result<LabSpec> {
    let file = state_file(name);
    let text = match std::fs::read_to_string(&file) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("no lab named {name} ({} missing); start one with `braid-lab --name {name} up --rates 1gbit,1gbit`", file.display())
        }
        other => other.with_context(|| format!("reading {}", file.display()))?,
    };
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a lab description", file.display()))
}

fn save(spec: &LabSpec) -> Result<()> {
    let name = spec
        .name
        .as_deref()
        .context("a CLI lab always has a name")?;
    std::fs::create_dir_all(STATE_DIR).with_context(|| format!("creating {STATE_DIR}"))?;
    let file = state_file(name);
    let text = serde_json::to_string_pretty(spec).context("encoding the lab description")?;
    std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))
}

fn print_paths(spec: &LabSpec) {
    println!("  path  rate       client                  storage");
    for p in &spec.paths {
        println!(
            "  {:<5} {:<10} {:<23} {}",
            p.index,
            p.rate.to_string(),
            endpoint(&p.client_iface, p.client_addr),
            endpoint(&p.storage_iface, p.storage_addr)
        );
    }
}

/// "iface addr", as one column.
fn endpoint(iface: &str, addr: std::net::Ipv4Addr) -> String {
    format!("{iface} {addr}")
}
