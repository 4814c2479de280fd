//! Times as the document layer keeps them (milliseconds since the Unix epoch) and
//! as it shows them (RFC 3339, UTC, to the millisecond): every conversion between
//! the two and the system clock is here, by `humantime`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn format_rfc3339_ms(ms_since_epoch: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms_since_epoch);
    humantime::format_rfc3339_millis(t).to_string()
}

/// Milliseconds since the Unix epoch of `t`; `None` before 1970.
pub(crate) fn ms_since_epoch(t: SystemTime) -> Option<u64> {
    t.duration_since(UNIX_EPOCH)
        .ok()
        .map(|d| d.as_millis() as u64)
}

/// The wall clock in ms since the epoch (0 if it is set before 1970).
pub(crate) fn now_ms() -> u64 {
    ms_since_epoch(SystemTime::now()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_through_rfc3339() {
        assert_eq!(format_rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        let text = format_rfc3339_ms(1_700_000_000_123);
        assert_eq!(text, "2023-11-14T22:13:20.123Z");
        let back = humantime::parse_rfc3339_weak(&text).unwrap();
        assert_eq!(ms_since_epoch(back), Some(1_700_000_000_123));
        assert_eq!(ms_since_epoch(UNIX_EPOCH - Duration::from_millis(1)), None);
    }
}
