//! `braid doctor`: turns the flags (or a configuration, or the running
//! `braid serve`) into what to check, runs the checks of `braid-doctor`,
//! prints the report, and with `--apply` runs its fixes after asking.

use std::io::{BufRead, IsTerminal, Write};
use std::net::IpAddr;

use anyhow::{Context, Result};
use braid_doctor::{apply, render, ClientScope, ExportRef, Report, Root, ServeScope, Severity};
use braid_store::portal::ListenSpec;

use crate::cli::{DoctorArgs, Exit, UsageError};
use crate::config::{self, AttachFile, ServeFile};
use crate::ctl::Status;
use crate::out::{err, errln, out, outln};
use crate::{control, multipath};

fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

pub fn run(args: DoctorArgs) -> Result<()> {
    if args.apply && args.root.is_some() {
        return Err(usage(
            "--apply changes this host, and --root reads another tree: use one or the other",
        ));
    }
    let root = match &args.root {
        Some(dir) if !dir.join("sys").is_dir() && !dir.join("proc").is_dir() => {
            return Err(usage(format!(
                "--root {}: no sys/ or proc/ below it",
                dir.display()
            )))
        }
        Some(dir) => Root::at(dir),
        None => Root::host(),
    };
    let config = args.config.as_deref().map(read_config).transpose()?;
    let serve = args.serve || matches!(config, Some(ConfigFile::Serve(_)));
    if serve && matches!(config, Some(ConfigFile::Attach(_))) {
        return Err(usage(
            "--serve with an attach configuration: give a serve one",
        ));
    }
    if root.is_host() {
        // Before any thread exists: see braid_doctor::netns.
        match braid_doctor::netns::own_sysfs() {
            Ok(true) => tracing::debug!("mounted a sysfs of this network namespace"),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                error = %e,
                "/sys shows another network namespace's interfaces and cannot be remounted; \
                 run braid doctor under `ip netns exec` for their speeds and queues"
            ),
        }
    }
    let report = if serve {
        braid_doctor::serve::check(&root, &serve_scope(&args, &root, config)?)
    } else {
        braid_doctor::client::check(&root, &client_scope(&args, &root, config)?)
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else if args.html {
        // The page reads the same shape as --json prints.
        let findings: braid_console::model::DoctorReport =
            serde_json::from_value(serde_json::to_value(&report)?)?;
        outln!(
            "{}",
            braid_console::doctor_page(&findings, &scope_title(&args))
        );
    } else {
        out!("{}", render::text(&report));
    }
    let fixed_all = if args.apply {
        apply_fixes(&report, args.yes)?
    } else {
        report.worst() == Severity::Ok
    };
    if fixed_all {
        Ok(())
    } else {
        Err(Exit(1).into())
    }
}

/// What was checked, for the page's title.
fn scope_title(args: &DoctorArgs) -> String {
    let what = if args.serve {
        "storage host".to_owned()
    } else if let Some(c) = &args.config {
        c.display().to_string()
    } else {
        args.targets.join(" ")
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("{what} on {}", host.trim())
}

enum ConfigFile {
    Serve(Box<ServeFile>),
    Attach(AttachFile),
}

/// A serve file has `[[export]]`s, an attach file `[[volume]]`s.
fn read_config(path: &std::path::Path) -> Result<ConfigFile> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the configuration {}", path.display()))?;
    let value: toml::Value =
        toml::from_str(&text).map_err(|e| usage(format!("{}: {e}", path.display())))?;
    if value.get("export").is_some() {
        return Ok(ConfigFile::Serve(Box::new(config::load(path)?)));
    }
    if value.get("volume").is_some() {
        return Ok(ConfigFile::Attach(config::load(path)?));
    }
    Err(usage(format!(
        "{}: neither a serve configuration ([[export]]) nor an attach one ([[volume]])",
        path.display()
    )))
}

fn serve_scope(args: &DoctorArgs, root: &Root, file: Option<ConfigFile>) -> Result<ServeScope> {
    let mut scope = ServeScope::default();
    for t in &args.targets {
        scope.exports.push(t.parse().map_err(usage)?);
    }
    let mut listen = args.listen.clone();
    if let Some(ConfigFile::Serve(f)) = &file {
        for e in &f.exports {
            scope.exports.push(ExportRef {
                name: e.name.clone(),
                source: e.source.clone(),
            });
        }
        for l in &f.listen {
            listen.push(l.parse().map_err(usage)?);
        }
    }
    let mut portals: Vec<IpAddr> = Vec::new();
    if root.is_host() {
        let resolved = braid_store::portal::resolve(&listen).map_err(usage)?;
        portals.extend(resolved.portals.iter().map(|p| p.addr.ip()));
        if scope.exports.is_empty() && listen.is_empty() {
            let (exports, served) = running_serve()?;
            scope.exports = exports;
            portals = served;
        }
        let addrs = braid_netif::addrs().context("listing this host's addresses")?;
        scope.portals = portals.clone();
        for ip in portals {
            if let Some(a) = addrs.iter().find(|a| a.ip == ip && !a.loopback) {
                if !scope.portal_ifaces.contains(&a.iface) {
                    scope.portal_ifaces.push(a.iface.clone());
                }
            }
        }
    } else if listen
        .iter()
        .any(|l| !matches!(l, ListenSpec::Iface { .. }))
    {
        return Err(usage(
            "with --root, name portals by interface (--listen eth1): addresses are not in a \
             captured tree",
        ));
    } else {
        for l in &listen {
            if let ListenSpec::Iface { name, .. } = l {
                scope.portal_ifaces.push(name.clone());
            }
        }
    }
    Ok(scope)
}

fn client_scope(args: &DoctorArgs, root: &Root, file: Option<ConfigFile>) -> Result<ClientScope> {
    let mut scope = ClientScope {
        volumes: Vec::new(),
        probe_budget: (root.is_host() && !args.no_probe)
            .then_some(braid_doctor::client::PROBE_BUDGET),
    };
    match args.targets.as_slice() {
        [] => {}
        [uri] => scope.volumes.push(multipath::config(uri, &args.multipath)?),
        more => {
            return Err(usage(format!(
                "one volume URI at a time ({} given); several volumes come from --config",
                more.len()
            )))
        }
    }
    if let Some(ConfigFile::Attach(f)) = &file {
        for v in &f.volumes {
            scope
                .volumes
                .push(multipath::config(&v.uri, &v.multipath()?)?);
        }
    }
    if scope.volumes.is_empty() && root.is_host() {
        return Err(usage(
            "give the volume whose paths to check (nbd://HOST/EXPORT or --config attach.toml), \
             or --serve on a storage host",
        ));
    }
    Ok(scope)
}

/// The exports and portal addresses of every `braid serve` running here.
fn running_serve() -> Result<(Vec<ExportRef>, Vec<IpAddr>)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let all = rt.block_on(control::discover());
    let mut exports = Vec::new();
    let mut portals = Vec::new();
    for (_, status) in all {
        if let Status::Serve {
            exports: e,
            portals: p,
            ..
        } = status
        {
            exports.extend(e.into_iter().map(|e| ExportRef {
                name: e.name,
                source: e.description,
            }));
            // "10.0.1.5:10809 (on eth1)"
            portals.extend(p.iter().filter_map(|p| {
                let addr = p.split_whitespace().next()?;
                addr.parse::<std::net::SocketAddr>().ok().map(|a| a.ip())
            }));
        }
    }
    Ok((exports, portals))
}

/// Asks, then runs the fixes; true when every problem was fixed by a
/// command that succeeded.
fn apply_fixes(report: &Report, yes: bool) -> Result<bool> {
    let plan = apply::plan(report);
    let manual = apply::manual(report);
    if plan.is_empty() {
        errln!(
            "braid doctor: nothing to apply{}",
            if manual > 0 {
                format!("; {manual} finding(s) need a change by hand (the `# ...` fixes above)")
            } else {
                String::new()
            }
        );
        return Ok(manual == 0);
    }
    errln!("braid doctor --apply will run:");
    for p in &plan {
        for line in p.command.lines() {
            errln!("  {line}");
        }
    }
    if !yes {
        err!("Run these {} command(s)? [y/N] ", plan.len());
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let stdin = std::io::stdin();
        stdin.lock().read_line(&mut answer)?;
        if !stdin.is_terminal() {
            // The answer came from a pipe and was not echoed.
            errln!("{}", answer.trim());
        }
        if !apply::is_yes(&answer) {
            errln!("nothing changed");
            return Ok(false);
        }
    }
    let mut all_ok = true;
    for done in apply::run(&plan) {
        let tag = if done.ok { "done" } else { "FAILED" };
        errln!("{tag}: {}", done.command.replace('\n', "; "));
        if !done.output.is_empty() {
            for line in done.output.lines() {
                errln!("    {line}");
            }
        }
        all_ok &= done.ok;
    }
    Ok(all_ok && manual == 0)
}
