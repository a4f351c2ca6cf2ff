//! Object key rules.
//!
//! S3 keys are any UTF-8 string of 1 to 1024 bytes. Yutu also refuses NUL and other C0 control
//! characters except tab: they cannot be written in the XML 1.0 documents that listings return,
//! so a key holding them could be stored but never listed.

/// Longest key S3 accepts, in bytes of UTF-8.
pub const MAX_KEY_LEN: usize = 1024;

/// Why a key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("object key must not be empty")]
    Empty,
    #[error("object key is {0} bytes long; the maximum is 1024")]
    TooLong(usize),
    #[error("object key contains a control character that XML cannot carry")]
    ControlCharacter,
}

/// Checks an already percent-decoded key.
pub fn validate_object_key(key: &str) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError::Empty);
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong(key.len()));
    }
    if key.chars().any(|c| (c as u32) < 0x20 && c != '\t') {
        return Err(KeyError::ControlCharacter);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_limits() {
        assert_eq!(validate_object_key("a/b/c.txt"), Ok(()));
        assert_eq!(validate_object_key(&"k".repeat(1024)), Ok(()));
        assert_eq!(
            validate_object_key(&"k".repeat(1025)),
            Err(KeyError::TooLong(1025))
        );
        assert_eq!(validate_object_key(""), Err(KeyError::Empty));
        assert_eq!(validate_object_key("a\0b"), Err(KeyError::ControlCharacter));
        // Multi-byte characters count in bytes, as S3 counts them.
        assert_eq!(
            validate_object_key(&"é".repeat(513)),
            Err(KeyError::TooLong(1026))
        );
    }
}
