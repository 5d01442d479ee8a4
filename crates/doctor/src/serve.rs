//! The storage host's side: each export's backing and the devices under
//! it, md arrays, and the NICs that carry (or could carry) portals.

use std::collections::BTreeSet;

use crate::block::{self, BlockDev};
use crate::export::{self, ExportRef};
use crate::finding::{Finding, Report};
use crate::md;
use crate::nic;
use crate::parse;
use crate::root::Root;

/// What to look at on a storage host.
#[derive(Clone, Debug, Default)]
pub struct ServeScope {
    /// The exports; with none, every md array and its members.
    pub exports: Vec<ExportRef>,
    /// Interfaces that carry portals; with none, every interface that is
    /// up.
    pub portal_ifaces: Vec<String>,
}

/// Checks the storage host seen through `root`.
pub fn check(root: &Root, scope: &ServeScope) -> Report {
    let mut findings = Vec::new();
    let mut devices: Vec<BlockDev> = Vec::new();
    let add = |devices: &mut Vec<BlockDev>, top: &BlockDev| {
        for d in block::stack(root, top) {
            if devices.iter().all(|x| x.name != d.name) {
                devices.push(d);
            }
        }
    };
    for e in &scope.exports {
        let (f, dev) = export::check(root, e);
        findings.push(f);
        if let Some(d) = dev {
            add(&mut devices, &d);
        }
    }
    let arrays = md::arrays(root);
    if scope.exports.is_empty() {
        for a in &arrays {
            if let Some(d) = block::by_name(root, &a.name) {
                add(&mut devices, &d);
            }
        }
    }
    let mem_total = root
        .read_raw("/proc/meminfo")
        .and_then(|t| parse::mem_total_kib(&t))
        .map(|k| k * 1024);
    for d in &devices {
        if let Some(a) = arrays.iter().find(|a| a.name == d.name) {
            findings.extend(md::check(a, mem_total));
        }
        findings.extend(block::check_queue(root, d));
    }
    findings.extend(check_nics(root, &scope.portal_ifaces));
    Report { findings }
}

/// Link and bond checks of the portal interfaces (and their bonds'
/// slaves), or of every interface that is up.
pub fn check_nics(root: &Root, only: &[String]) -> Vec<Finding> {
    let mut names: BTreeSet<String> = BTreeSet::new();
    if only.is_empty() {
        names.extend(
            nic::all(root)
                .into_iter()
                .filter(nic::Iface::up)
                .map(|i| i.name),
        );
    } else {
        names.extend(only.iter().cloned());
    }
    for n in names.clone() {
        names.extend(nic::bond_slaves(root, &n));
    }
    let cpus = nic::cpus_online(root).unwrap_or(1);
    let mut out = Vec::new();
    for n in &names {
        if let Some(i) = nic::read(root, n) {
            out.extend(nic::check_bond(root, &i));
            out.extend(nic::check_link(&i));
            out.extend(nic::check_irq(root, &i, cpus));
        }
    }
    out
}
