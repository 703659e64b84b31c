//! Durations on the command line, written as in the policy file: a number
//! of seconds (`1.5`) or a duration with units (`500ms`, `30s`, `2m`,
//! `1h 30m`), parsed by humantime.

use std::time::Duration;

/// A positive duration, for clap's `value_parser`.
pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let d = match s.parse::<f64>() {
        Ok(secs) => Duration::try_from_secs_f64(secs)
            .map_err(|_| format!("{s:?} is not a number of seconds ≥ 0"))?,
        Err(_) => humantime::parse_duration(s)
            .map_err(|e| format!("{s:?} is not a duration like 30s or 500ms: {e}"))?,
    };
    if d.is_zero() {
        return Err(format!("{s:?}: the duration must be positive"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::parse;
    use std::time::Duration;

    #[test]
    fn durations_parse_as_seconds_or_with_units() {
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h 30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse("1.5"), Ok(Duration::from_millis(1500)));
        for bad in ["", "0s", "0", "-1s", "-1", "s", "1e400", "3 parsecs"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
