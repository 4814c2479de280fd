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

/// Parses an RFC 3339 time (`2026-05-01T12:00:00Z`, `2026-05-01T14:00:00.250+02:00`)
/// into ms since the epoch (a fraction finer than a millisecond is dropped). The
/// error says what is wrong, for a client's message. humantime reads only UTC, so
/// a numeric offset is taken off here and the rest handed to it as UTC.
pub(crate) fn parse_rfc3339_ms(text: &str) -> Result<u64, String> {
    // Byte positions below are only meaningful (and slicing only safe) on ASCII.
    if !text.is_ascii() || text.len() < "2026-05-01T12:00:00Z".len() {
        return Err("not an RFC 3339 time such as 2026-05-01T12:00:00Z".into());
    }
    let (local, offset_ms) = split_offset(text)?;
    let (date, time) = local.split_at(10);
    if !time.starts_with(['T', 't']) {
        return Err("the date and the time must be separated by 'T'".into());
    }
    let utc = format!("{date}T{}Z", &time[1..]);
    let at = humantime::parse_rfc3339(&utc).map_err(|e| format!("not an RFC 3339 time ({e})"))?;
    let local_ms = ms_since_epoch(at).ok_or("before 1970")?;
    u64::try_from(i128::from(local_ms) - i128::from(offset_ms))
        .map_err(|_| "before 1970".to_string())
}

/// The text before its time zone, and the zone's offset from UTC in ms (east is
/// positive): `Z` (or `z`), or `+HH:MM` / `-HH:MM`.
fn split_offset(text: &str) -> Result<(&str, i64), String> {
    if let Some(local) = text.strip_suffix(['Z', 'z']) {
        return Ok((local, 0));
    }
    let no_zone = || "no time zone: end it with Z or an offset such as +02:00".to_string();
    let (local, zone) = text.split_at_checked(text.len() - 6).ok_or_else(no_zone)?;
    let b = zone.as_bytes();
    let sign = match b[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return Err(no_zone()),
    };
    let two_digits = |s: &str| {
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse::<i64>().ok())
            .flatten()
    };
    match (two_digits(&zone[1..3]), b[3], two_digits(&zone[4..6])) {
        (Some(h), b':', Some(m)) if h <= 23 && m <= 59 => Ok((local, sign * (h * 60 + m) * 60_000)),
        _ => Err(format!("the offset {zone:?} is not +HH:MM or -HH:MM")),
    }
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

    #[test]
    fn rfc3339_times_with_offsets_parse_to_utc_ms() {
        let at = 1_700_000_000_123;
        for text in [
            "2023-11-14T22:13:20.123Z",
            "2023-11-14t22:13:20.123z",
            "2023-11-14T22:13:20.123456Z",
            "2023-11-15T00:13:20.123+02:00",
            "2023-11-14T20:43:20.123-01:30",
            "2023-11-14T22:13:20.123+00:00",
            "2023-11-14T22:13:20.123-00:00",
        ] {
            assert_eq!(parse_rfc3339_ms(text), Ok(at), "{text}");
        }
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Ok(0));
        for bad in [
            "",
            "tomorrow",
            "2023-11-14",
            "2023-11-14T22:13:20",
            "2023-11-14 22:13:20Z",
            "2023-11-14T22:13:20+2:00",
            "2023-11-14T22:13:20+24:00",
            "2023-11-14T22:13:20+02-00",
            "2023-13-14T22:13:20Z",
            "2023-11-14T25:13:20Z",
            "1969-12-31T23:59:59Z",
            "1970-01-01T00:30:00+01:00",
            "2023-11-14T22:13:20.1x3Z",
            "2023-11-14T22:13:2\u{e9}Z",
            "\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}\u{e9}",
        ] {
            assert!(parse_rfc3339_ms(bad).is_err(), "{bad:?}");
        }
    }
}
