//! Progress of a long run, on standard error.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar of `total` steps with a message (hidden where standard error is
/// not a terminal).
pub fn bar(total: u64) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}
