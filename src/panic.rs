//! The message of a caught panic: the one helper that every `catch_unwind`
//! of the crate (pipeline stages and sources, decoders, shard readers, the
//! CPU pools' jobs, remote fetches) reports panics with.

use std::any::Any;

/// The text a panic was raised with (`panic!("...")`'s message), or a
/// fixed text when its payload is not a string.
pub(crate) fn message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn strings_and_other_payloads() {
        let caught = |f: fn()| std::panic::catch_unwind(f).unwrap_err();
        assert_eq!(super::message(&*caught(|| panic!("plain"))), "plain");
        assert_eq!(
            super::message(&*caught(|| panic!("formatted {}", 1))),
            "formatted 1"
        );
        assert_eq!(
            super::message(&*caught(|| std::panic::panic_any(7_u8))),
            "a panic without a message"
        );
    }
}
