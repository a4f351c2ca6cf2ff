//! The transfer progress bar.
//!
//! Shown only when it helps: the transfer is big enough to take a moment (over 4 MiB) and a
//! person is watching stderr. In pipes, scripts and tests it is hidden, so stderr carries
//! nothing but errors.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

/// Transfers up to this size finish too fast for a bar to be worth drawing.
const THRESHOLD: u64 = 4 * 1024 * 1024;

const TEMPLATE: &str = "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}";

/// A bar for a transfer of `len` bytes, or a hidden one.
pub fn for_transfer(len: u64, msg: String) -> ProgressBar {
    if !should_show(len, std::io::stderr().is_terminal()) {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template(TEMPLATE)
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::new(len).with_style(style).with_message(msg)
}

fn should_show(len: u64, stderr_is_tty: bool) -> bool {
    stderr_is_tty && len > THRESHOLD
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_big_transfers_on_a_terminal() {
        assert!(!should_show(THRESHOLD, true));
        assert!(should_show(THRESHOLD + 1, true));
        assert!(!should_show(u64::MAX, false));
    }

    #[test]
    fn template_is_valid() {
        assert!(ProgressStyle::with_template(TEMPLATE).is_ok());
    }

    #[test]
    fn hidden_without_a_terminal() {
        // Tests run with stderr captured, not on a terminal.
        if !std::io::stderr().is_terminal() {
            assert!(for_transfer(1 << 40, "x".into()).is_hidden());
        }
    }
}
