//! `macrolink completions` and `macrolink man`: shell completions and
//! manual pages, generated from the command line's own definition.

use clap::CommandFactory;
use std::path::Path;

/// Writes completions of the command line `C` for `shell` to stdout.
pub fn completions<C: CommandFactory>(shell: clap_complete::Shell) {
    let mut cmd = C::command();
    let name = cmd.get_name().to_string();
    clap_complete::generate(shell, &mut cmd, name, &mut std::io::stdout());
}

/// Writes a manual page for the command line `C` and one for each of its
/// commands (`macrolink.1`, `macrolink-cp.1`, ...) into `dir`.
pub fn pages<C: CommandFactory>(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    clap_mangen::generate_to(C::command(), dir)?;
    Ok(())
}
