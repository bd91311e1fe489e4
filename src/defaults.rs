//! The defaults of configuration keys, for serde's `default = "…"`: one generic function per
//! kind with the value in its path (`defaults::secs::<30>`), so a key's default reads beside the
//! key and no component declares its own `fn d_30s`.

use std::time::Duration;

/// A switch that is on unless configured off.
pub(crate) fn yes() -> bool {
    true
}

/// `N` seconds.
pub(crate) fn secs<const N: u64>() -> Duration {
    Duration::from_secs(N)
}

/// `N` milliseconds.
pub(crate) fn millis<const N: u64>() -> Duration {
    Duration::from_millis(N)
}

/// A count or a size of `N`.
pub(crate) fn count<const N: usize>() -> usize {
    N
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_is_the_one_in_the_path() {
        assert!(yes());
        assert_eq!(secs::<30>(), Duration::from_secs(30));
        assert_eq!(millis::<500>(), Duration::from_millis(500));
        assert_eq!(count::<256>(), 256);
    }
}
