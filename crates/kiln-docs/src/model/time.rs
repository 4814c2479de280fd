//! Times as the document layer keeps them (milliseconds since the Unix epoch) and
//! as it shows them (RFC 3339, UTC, to the millisecond): every conversion between
//! the two and the system clock is here, by `humantime` (and `time`, which reads
//! the offsets humantime does not).

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

/// Why a text is not a time `parse_rfc3339_ms` accepts. The messages are what a
/// client reads (`DocumentError::InvalidExpires`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TimeParseError {
    #[error("not an RFC 3339 time such as 2026-05-01T12:00:00Z")]
    NotATime,
    #[error("no time zone: end it with Z or an offset such as +02:00")]
    NoZone,
    #[error("the offset {0:?} is not +HH:MM or -HH:MM")]
    BadOffset(String),
    #[error("the date and the time must be separated by 'T'")]
    NoSeparator,
    #[error("not an RFC 3339 time ({0})")]
    Invalid(#[source] time::error::Parse),
    #[error("before 1970")]
    Before1970,
}

/// Parses an RFC 3339 time (`2026-05-01T12:00:00Z`, `2026-05-01T14:00:00.250+02:00`,
/// `t` and `z` in lowercase too) into ms since the epoch (a fraction finer than a
/// millisecond is dropped), by the `time` crate. The error says what is wrong, for
/// a client's message.
pub(crate) fn parse_rfc3339_ms(text: &str) -> Result<u64, TimeParseError> {
    use time::format_description::well_known::Rfc3339;
    // Byte positions below are only meaningful (and slicing only safe) on ASCII.
    if !text.is_ascii() || text.len() < "2026-05-01T12:00:00Z".len() {
        return Err(TimeParseError::NotATime);
    }
    let separated = matches!(text.as_bytes()[10], b'T' | b't');
    let at = match time::OffsetDateTime::parse(text, &Rfc3339) {
        // `time` takes any character between the date and the time (RFC 3339 lets
        // an application choose a space): a document's time has always needed 'T'.
        Ok(at) if separated => at,
        Ok(_) => return Err(TimeParseError::NoSeparator),
        Err(e) => {
            return Err(match zone_refusal(text) {
                Some(why) => why,
                None if !separated => TimeParseError::NoSeparator,
                None => TimeParseError::Invalid(e),
            })
        }
    };
    // Negative before 1970, where a division would round a fraction up to 0.
    let ns = at.unix_timestamp_nanos();
    if ns < 0 {
        return Err(TimeParseError::Before1970);
    }
    u64::try_from(ns / 1_000_000).map_err(|_| TimeParseError::NotATime)
}

/// For a text `time` refused: whether its time zone is why, as a client has always
/// been told (the zone is checked first): none (`Z`, `z`, `+HH:MM` or `-HH:MM` at
/// the end), or an offset out of that form.
fn zone_refusal(text: &str) -> Option<TimeParseError> {
    if text.ends_with(['Z', 'z']) {
        return None;
    }
    let zone = text.get(text.len().checked_sub(6)?..)?;
    if !zone.starts_with(['+', '-']) {
        return Some(TimeParseError::NoZone);
    }
    let two_digits = |s: &str| match s.as_bytes() {
        [a, b] if a.is_ascii_digit() && b.is_ascii_digit() => Some((a - b'0') * 10 + (b - b'0')),
        _ => None,
    };
    match (
        two_digits(&zone[1..3]),
        &zone[3..4],
        two_digits(&zone[4..6]),
    ) {
        (Some(h), ":", Some(m)) if h <= 23 && m <= 59 => None,
        _ => Some(TimeParseError::BadOffset(zone.to_string())),
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
            "2023-11-15T03:43:20.123+05:30",
            "2023-11-15t03:43:20.123+05:30",
            "2023-11-14T22:13:20.123999999999Z",
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

    #[test]
    fn a_refused_time_says_why_as_before() {
        let why = |text| parse_rfc3339_ms(text).unwrap_err().to_string();
        assert_eq!(
            why("tomorrow"),
            "not an RFC 3339 time such as 2026-05-01T12:00:00Z"
        );
        assert_eq!(
            why("2023-11-14T22:13:20.123"),
            "no time zone: end it with Z or an offset such as +02:00"
        );
        assert_eq!(
            why("2023-11-14T22:13:20+24:00"),
            "the offset \"+24:00\" is not +HH:MM or -HH:MM"
        );
        assert_eq!(
            why("2023-11-14T22:13:20+02-00"),
            "the offset \"+02-00\" is not +HH:MM or -HH:MM"
        );
        assert_eq!(
            why("2023-11-14 22:13:20Z"),
            "the date and the time must be separated by 'T'"
        );
        assert_eq!(
            why("2023-11-14 22:13:2xZ"),
            "the date and the time must be separated by 'T'"
        );
        assert_eq!(why("1970-01-01T00:30:00+01:00"), "before 1970");
        assert_eq!(why("1969-12-31T23:59:59.9999Z"), "before 1970");
        let e = parse_rfc3339_ms("2023-13-14T22:13:20Z").unwrap_err();
        assert!(e.to_string().starts_with("not an RFC 3339 time ("), "{e}");
        let cause = std::error::Error::source(&e).expect("the time crate's error is kept");
        assert!(cause.is::<time::error::Parse>());
    }
}
