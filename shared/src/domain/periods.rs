//! Budget periods that recur (a compatible extension of the spec's `BudgetLedger` period): the
//! grammar of `period_recurrence` and what the scripts store for it. The roll itself is
//! `roll_period` in `lua/lib/periods.lua`.

use crate::error::{ApiError, ApiResult};

/// The shortest period a budget may recur with.
pub const MIN_PERIOD_MS: i64 = 60_000;

/// How a budget's period recurs: calendar months, or a fixed length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recurrence {
    /// On the day of the month the period ended (or the month's last day when it is shorter).
    Monthly,
    /// A fixed length in milliseconds.
    Every(i64),
}

impl Recurrence {
    /// `DAILY`, `WEEKLY`, `MONTHLY`, or an ISO 8601 duration in weeks, or days, hours, minutes
    /// and seconds (`P2W`, `P3D`, `PT12H`, `P1DT12H`, `PT90M`), at least a minute long.
    pub fn parse(text: &str) -> ApiResult<Recurrence> {
        let bad = || {
            ApiError::invalid(format!(
                "period_recurrence {text:?} must be DAILY, WEEKLY, MONTHLY or an ISO 8601 duration such as P3D or PT12H \
                 (at least one minute)"
            ))
        };
        let ms = match text {
            "MONTHLY" => return Ok(Recurrence::Monthly),
            "DAILY" => 86_400_000,
            "WEEKLY" => 7 * 86_400_000,
            _ => iso_duration_ms(text).ok_or_else(bad)?,
        };
        if ms < MIN_PERIOD_MS {
            return Err(bad());
        }
        Ok(Recurrence::Every(ms))
    }

    /// What the ledger stores as `period_every`: `M`, or the length in ms.
    pub fn code(self) -> String {
        match self {
            Recurrence::Monthly => "M".to_string(),
            Recurrence::Every(ms) => ms.to_string(),
        }
    }
}

/// The length of `P<n>W`, or `P[<n>D][T[<n>H][<n>M][<n>S]]` with at least one part.
fn iso_duration_ms(text: &str) -> Option<i64> {
    let rest = text.strip_prefix('P')?;
    if let Some(weeks) = rest.strip_suffix('W') {
        return weeks.parse::<i64>().ok()?.checked_mul(7 * 86_400_000);
    }
    let (date, time) = match rest.split_once('T') {
        Some((d, t)) if !t.is_empty() => (d, Some(t)),
        Some(_) => return None,
        None => (rest, None),
    };
    let mut total: i64 = 0;
    let mut parts = 0;
    let mut add = |section: &str, units: &[(char, i64)]| -> Option<()> {
        let mut number = String::new();
        let mut next = 0;
        for c in section.chars() {
            if c.is_ascii_digit() {
                number.push(c);
                continue;
            }
            let at = units[next..].iter().position(|(u, _)| *u == c)? + next;
            let n: i64 = number.parse().ok()?;
            total = total.checked_add(n.checked_mul(units[at].1)?)?;
            number.clear();
            next = at + 1;
            parts += 1;
        }
        number.is_empty().then_some(())
    };
    add(date, &[('D', 86_400_000)])?;
    if let Some(t) = time {
        add(t, &[('H', 3_600_000), ('M', 60_000), ('S', 1_000)])?;
    }
    (parts > 0).then_some(total)
}

/// The UTC day of the month of an epoch-ms instant (a monthly period's anchor).
pub fn day_of_month(ms: i64) -> u32 {
    super::civil_from_days(ms.div_euclid(86_400_000)).2 as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recurrences_parse() {
        assert_eq!(Recurrence::parse("MONTHLY").unwrap(), Recurrence::Monthly);
        assert_eq!(Recurrence::parse("DAILY").unwrap(), Recurrence::Every(86_400_000));
        assert_eq!(Recurrence::parse("WEEKLY").unwrap(), Recurrence::Every(604_800_000));
        assert_eq!(Recurrence::parse("P2W").unwrap(), Recurrence::Every(2 * 604_800_000));
        assert_eq!(Recurrence::parse("P1DT12H").unwrap(), Recurrence::Every(129_600_000));
        assert_eq!(Recurrence::parse("PT90M").unwrap(), Recurrence::Every(5_400_000));
        assert_eq!(Recurrence::parse("PT3600S").unwrap(), Recurrence::Every(3_600_000));
        for bad in ["", "P", "PT", "PT30S", "P1Y", "P1M", "PT1H2D", "P1DT", "daily", "P-1D", "PT1.5H", "P1D2D"] {
            assert!(Recurrence::parse(bad).is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn days_of_month() {
        assert_eq!(day_of_month(0), 1);
        // 2026-01-31T23:59:59Z and 2024-02-29T00:00:00Z
        assert_eq!(day_of_month(1_769_903_999_000), 31);
        assert_eq!(day_of_month(1_709_164_800_000), 29);
    }
}
