//! ISO 8601 UTC timestamps as the EC2 Query API writes and reads them (`2024-05-01T12:00:00.000Z`),
//! without a date crate: the days-from-civil conversion of Howard Hinnant's `chrono`-compatible
//! algorithms.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `2024-05-01T12:00:00Z` for a time at or after the epoch (earlier times print the epoch).
pub(crate) fn format_utc(time: SystemTime) -> String {
    let secs = time.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.fff]Z` (UTC only, as EC2 answers); `None` for anything else.
pub(crate) fn parse_utc(text: &str) -> Option<SystemTime> {
    let text = text.trim().strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut date_parts = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (date_parts.next()??, date_parts.next()??, date_parts.next()??);
    let (clock, fraction) = match time.split_once('.') {
        Some((clock, fraction)) => (clock, fraction),
        None => (time, ""),
    };
    let mut clock_parts = clock.splitn(3, ':').map(|p| p.parse::<i64>().ok());
    let (hour, minute, second) = (clock_parts.next()??, clock_parts.next()??, clock_parts.next()??);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let nanos = if fraction.is_empty() {
        0
    } else {
        let digits: String = fraction.chars().take(9).collect();
        if !digits.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        format!("{digits:0<9}").parse::<u32>().ok()?
    };
    let secs = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    let secs = u64::try_from(secs).ok()?;
    Some(UNIX_EPOCH + Duration::new(secs, nanos))
}

/// Milliseconds since the epoch (0 before it).
pub fn millis(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_parses_the_same_instant() {
        let time = UNIX_EPOCH + Duration::from_secs(1_714_564_800); // 2024-05-01T12:00:00Z
        assert_eq!(format_utc(time), "2024-05-01T12:00:00Z");
        assert_eq!(parse_utc("2024-05-01T12:00:00Z"), Some(time));
        assert_eq!(
            parse_utc("2024-05-01T12:00:00.250Z"),
            Some(time + Duration::from_millis(250))
        );
        assert_eq!(
            parse_utc("2006-01-02T15:04:05.000Z").map(millis),
            Some(1_136_214_245_000)
        );
    }

    #[test]
    fn leap_days_and_the_epoch() {
        assert_eq!(format_utc(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let leap = parse_utc("2024-02-29T23:59:59Z").expect("a leap day parses");
        assert_eq!(format_utc(leap), "2024-02-29T23:59:59Z");
        assert_eq!(format_utc(leap + Duration::from_secs(1)), "2024-03-01T00:00:00Z");
    }

    #[test]
    fn refuses_what_ec2_does_not_write() {
        for text in [
            "",
            "2024-05-01",
            "2024-05-01T12:00:00",
            "2024-13-01T00:00:00Z",
            "2024-05-01T12:00:00+02:00",
        ] {
            assert_eq!(parse_utc(text), None, "{text:?}");
        }
    }
}
