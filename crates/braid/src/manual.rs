//! Manual pages and shell completions, generated from the same clap
//! definitions that parse the command line, so `man braid-serve`, `--help`
//! and tab completion can never disagree.

use std::path::Path;

use anyhow::{Context, Result};
use clap::CommandFactory;

use crate::cli::{Cli, CompletionsArgs, ManpagesArgs};

/// Prints the completion script for one shell on standard output.
pub fn completions(args: CompletionsArgs) -> Result<()> {
    let mut cmd = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "braid", &mut script);
    crate::out::write(format_args!("{}", String::from_utf8_lossy(&script)));
    Ok(())
}

/// Writes `braid.1` and one page per subcommand (`braid-serve.1`, and
/// `braid-tls-init.1` for nested ones) into `args.dir`.
pub fn manpages(args: ManpagesArgs) -> Result<()> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let mut cmd = Cli::command();
    cmd.build();
    let written = write_pages(&cmd, "braid", &args.dir)?;
    crate::out::outln!("wrote {written} manual pages to {}", args.dir.display());
    Ok(())
}

fn write_pages(cmd: &clap::Command, name: &str, dir: &Path) -> Result<usize> {
    // Each page is titled by its full name so `man braid-serve` finds it
    // and its synopsis reads `braid serve ...`.
    let page = cmd
        .clone()
        .name(name.to_owned())
        .bin_name(name.replace('-', " "));
    let mut text = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut text)
        .with_context(|| format!("rendering {name}.1"))?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    let mut n = 1;
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        n += write_pages(sub, &format!("{name}-{}", sub.get_name()), dir)?;
    }
    Ok(n)
}
