//! Checks of a call's arguments and of the node's answers, before anything is sent or after
//! it came back.

use super::{Buffer, KvError, MAX_BATCH};

pub(super) fn same_len(keys: &[String], n: usize, what: &str) -> Result<(), KvError> {
    if keys.len() != n {
        return Err(KvError::InvalidArgument(format!(
            "{} keys but {n} {what}",
            keys.len()
        )));
    }
    Ok(())
}

pub(super) fn check_batch(keys: &[String]) -> Result<(), KvError> {
    if keys.len() > MAX_BATCH {
        return Err(KvError::InvalidArgument(format!(
            "{} keys in one batch; the server takes at most {MAX_BATCH}",
            keys.len()
        )));
    }
    if let Some(i) = keys.iter().position(|k| k.is_empty()) {
        return Err(KvError::InvalidArgument(format!("key {i} is empty")));
    }
    Ok(())
}

pub(super) fn check_range(buf: &Buffer, i: usize, off: u64, len: u64) -> Result<(), KvError> {
    if off.checked_add(len).is_none_or(|end| end > buf.len()) {
        return Err(KvError::InvalidArgument(format!(
            "key {i}: bytes {off}..{off}+{len} are outside the {}-byte buffer",
            buf.len()
        )));
    }
    Ok(())
}

pub(super) fn expect_len(got: usize, want: usize, what: &str) -> Result<(), KvError> {
    if got != want {
        return Err(KvError::InvalidResponse(format!(
            "{what} answered {got} results for {want} keys"
        )));
    }
    Ok(())
}
