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

/// What `drain --wait` shows: `done` of `len` objects moved off the node.
const COUNT_TEMPLATE: &str = "{msg} [{bar:30}] {pos}/{len} objects, {elapsed} elapsed";

/// What `status --wait` shows: a spinner and what is still in motion.
const SPINNER_TEMPLATE: &str = "{spinner} {msg} ({elapsed})";

/// A bar counting `len` items (objects moved by a drain), or a hidden one when stderr is not
/// a terminal. Unlike a transfer's, shown however small: a drain is slow whatever its count.
pub fn for_count(len: u64, msg: String) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template(COUNT_TEMPLATE)
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::new(len).with_style(style).with_message(msg)
}

/// A spinner for a wait with no count to show, or a hidden one off a terminal.
pub fn spinner(msg: String) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template(SPINNER_TEMPLATE)
        .unwrap_or_else(|_| ProgressStyle::default_spinner());
    let bar = ProgressBar::new_spinner()
        .with_style(style)
        .with_message(msg);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
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
        assert!(ProgressStyle::with_template(COUNT_TEMPLATE).is_ok());
        assert!(ProgressStyle::with_template(SPINNER_TEMPLATE).is_ok());
    }

    #[test]
    fn hidden_without_a_terminal() {
        // Tests run with stderr captured, not on a terminal.
        if !std::io::stderr().is_terminal() {
            assert!(for_transfer(1 << 40, "x".into()).is_hidden());
            assert!(for_count(10, "x".into()).is_hidden());
            assert!(spinner("x".into()).is_hidden());
        }
    }
}
