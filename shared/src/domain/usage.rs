//! Spend reports (getUsage, getAdminUsage): the rollup buckets a time range covers, the groups
//! the scripts keep (`lua/lib/usage.lua`), and the rows a report shows, grouped by what the
//! caller asked for. Pure: the buckets' contents come from `ops::usage`.

use std::collections::BTreeMap;

use serde::Serialize;

use super::civil_from_days;
use crate::error::{ApiError, ApiResult};

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 86_400_000;

/// The size of a rollup bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Granularity {
    Hour,
    Day,
    Month,
}

impl Granularity {
    pub fn parse(s: &str) -> ApiResult<Granularity> {
        match s {
            "hour" => Ok(Granularity::Hour),
            "day" => Ok(Granularity::Day),
            "month" => Ok(Granularity::Month),
            _ => Err(ApiError::invalid("granularity must be hour, day or month")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Granularity::Hour => "hour",
            Granularity::Day => "day",
            Granularity::Month => "month",
        }
    }

    /// The bucket (its number) holding the instant `ms`.
    pub fn bucket_of(self, ms: i64) -> i64 {
        match self {
            Granularity::Hour => ms.div_euclid(HOUR_MS),
            Granularity::Day => ms.div_euclid(DAY_MS),
            Granularity::Month => {
                let (y, m, _) = civil_from_days(ms.div_euclid(DAY_MS));
                y * 12 + m - 1
            }
        }
    }

    /// When bucket `n` starts (epoch ms).
    pub fn start_ms(self, n: i64) -> i64 {
        match self {
            Granularity::Hour => n * HOUR_MS,
            Granularity::Day => n * DAY_MS,
            Granularity::Month => days_from_civil(n.div_euclid(12), n.rem_euclid(12) + 1, 1) * DAY_MS,
        }
    }

    /// The bucket's name in its key (`TenantKeys::usage_bucket`), as the scripts spell it.
    pub fn key_part(self, n: i64) -> String {
        let letter = match self {
            Granularity::Hour => 'h',
            Granularity::Day => 'd',
            Granularity::Month => 'm',
        };
        format!("{letter}{n}")
    }
}

/// Day number (days since 1970-01-01) of a UTC date (H. Hinnant's days-from-civil).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468
}

/// What a report may group by (the unit is always a group: amounts of different units are
/// never added).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Dim {
    Scope,
    Workspace,
    App,
    Workflow,
    Agent,
    Toolset,
    ActionKind,
    ActionName,
}

impl Dim {
    const ALL: [Dim; 8] = [
        Dim::Scope,
        Dim::Workspace,
        Dim::App,
        Dim::Workflow,
        Dim::Agent,
        Dim::Toolset,
        Dim::ActionKind,
        Dim::ActionName,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Dim::Scope => "scope",
            Dim::Workspace => "workspace",
            Dim::App => "app",
            Dim::Workflow => "workflow",
            Dim::Agent => "agent",
            Dim::Toolset => "toolset",
            Dim::ActionKind => "action_kind",
            Dim::ActionName => "action_name",
        }
    }

    /// `group_by`: names separated by commas (`unit` is accepted and always implied), each
    /// once; empty groups by unit only.
    pub fn parse_list(s: &str) -> ApiResult<Vec<Dim>> {
        let mut out = Vec::new();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty() && *n != "unit") {
            let dim = Dim::ALL.into_iter().find(|d| d.name() == name).ok_or_else(|| {
                ApiError::invalid(format!(
                    "group_by: unknown dimension '{name}' (scope, workspace, app, workflow, agent, toolset, unit, \
                     action_kind, action_name)"
                ))
            })?;
            if out.contains(&dim) {
                return Err(ApiError::invalid(format!("group_by names {name} twice")));
            }
            out.push(dim);
        }
        out.sort();
        Ok(out)
    }

    fn value_of(self, g: &Group) -> String {
        let level = |name: &str| {
            g.scope
                .split('/')
                .find_map(|seg| seg.strip_prefix(name).and_then(|v| v.strip_prefix(':')))
                .unwrap_or("")
                .to_string()
        };
        match self {
            Dim::Scope => g.scope.clone(),
            Dim::ActionKind => g.action_kind.clone(),
            Dim::ActionName => g.action_name.clone(),
            level_dim => level(level_dim.name()),
        }
    }
}

/// One group a bucket keeps: "<scope>\x1f<unit>\x1f<action kind>\x1f<action name>" (the unit's
/// `other` group holds what came past the bucket's cap).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub scope: String,
    pub unit: String,
    pub action_kind: String,
    pub action_name: String,
}

impl Group {
    pub fn parse(field: &str) -> Option<Group> {
        let mut parts = field.split('\u{1f}');
        let g = Group {
            scope: parts.next()?.to_string(),
            unit: parts.next()?.to_string(),
            action_kind: parts.next()?.to_string(),
            action_name: parts.next()?.to_string(),
        };
        parts.next().is_none().then_some(g)
    }
}

/// A group's figures in one bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Figures {
    /// What was charged: commits' actual amounts and events' amounts.
    pub spent: i128,
    /// The estimates of the reservations that ended (committed, released or expired).
    pub estimated: i128,
    /// Commits and events.
    pub charges: u64,
    /// Reservations that ended.
    pub reservations: u64,
    /// Of those, the ones released or expired (nothing charged).
    pub released: u64,
}

impl Figures {
    /// "<spent> <estimated> <charges> <reservations> <released>".
    pub fn parse(value: &str) -> Option<Figures> {
        let mut parts = value.split(' ');
        let f = Figures {
            spent: parts.next()?.parse().ok()?,
            estimated: parts.next()?.parse().ok()?,
            charges: parts.next()?.parse().ok()?,
            reservations: parts.next()?.parse().ok()?,
            released: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(f)
    }

    fn add(&mut self, o: &Figures) {
        self.spent += o.spent;
        self.estimated += o.estimated;
        self.charges += o.charges;
        self.reservations += o.reservations;
        self.released += o.released;
    }
}

/// One row of a report: a bucket, the values of the dimensions grouped by (in `group_by`'s
/// order), the unit and the figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub bucket: i64,
    pub dims: Vec<String>,
    pub unit: String,
    pub figures: Figures,
}

/// What a report keeps of the groups: a unit, and a scope prefix (whole segments).
#[derive(Debug, Clone, Default)]
pub struct Selection {
    pub unit: Option<String>,
    pub scope_prefix: Option<String>,
}

impl Selection {
    fn keeps(&self, g: &Group) -> bool {
        self.unit.as_ref().is_none_or(|u| *u == g.unit)
            && self.scope_prefix.as_ref().is_none_or(|p| {
                g.scope == *p || g.scope.strip_prefix(p.as_str()).is_some_and(|rest| rest.starts_with('/'))
            })
    }
}

/// The rows of one bucket (its groups as the script gives them: field, value, ...), grouped by
/// `dims` and the unit, in order of their dimension values. A group that does not parse is a
/// fault, never silently dropped.
pub fn bucket_rows(bucket: i64, fields: &[String], dims: &[Dim], selection: &Selection) -> ApiResult<Vec<Row>> {
    let mut rows: BTreeMap<(Vec<String>, String), Figures> = BTreeMap::new();
    for pair in fields.chunks(2) {
        let [field, value] = pair else {
            return Err(ApiError::internal("usage bucket: odd reply"));
        };
        let (Some(g), Some(f)) = (Group::parse(field), Figures::parse(value)) else {
            return Err(ApiError::internal(format!("usage bucket: malformed group {field:?} = {value:?}")));
        };
        if !selection.keeps(&g) {
            continue;
        }
        let key = (dims.iter().map(|d| d.value_of(&g)).collect(), g.unit.clone());
        rows.entry(key).or_default().add(&f);
    }
    Ok(rows.into_iter().map(|((dims, unit), figures)| Row { bucket, dims, unit, figures }).collect())
}

/// A report's rows as CSV (RFC 4180): a header, then one line per row.
pub fn csv(granularity: Granularity, dims: &[Dim], rows: &[Row]) -> String {
    let mut out = String::from("bucket_start,bucket_end");
    for d in dims {
        out.push(',');
        out.push_str(d.name());
    }
    out.push_str(",unit,spent,estimated,charges,reservations,released\r\n");
    for r in rows {
        out.push_str(&super::format_rfc3339_ms(granularity.start_ms(r.bucket)));
        out.push(',');
        out.push_str(&super::format_rfc3339_ms(granularity.start_ms(r.bucket + 1)));
        for v in &r.dims {
            out.push(',');
            out.push_str(&csv_field(v));
        }
        let f = &r.figures;
        out.push_str(&format!(
            ",{},{},{},{},{},{}\r\n",
            csv_field(&r.unit),
            f.spent,
            f.estimated,
            f.charges,
            f.reservations,
            f.released
        ));
    }
    out
}

/// A CSV field, quoted when it holds a comma, a quote or a line break; a leading `=`, `+`, `-`
/// or `@` is prefixed with `'` so a spreadsheet never runs client text as a formula.
fn csv_field(v: &str) -> String {
    let v = if v.starts_with(['=', '+', '-', '@']) { format!("'{v}") } else { v.to_string() };
    if v.contains([',', '"', '\r', '\n']) {
        format!("\"{}\"", v.replace('"', "\"\""))
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_start_where_the_calendar_says() {
        let ms = crate::domain::parse_rfc3339_ms("2026-03-15T10:20:00Z").unwrap();
        let m = Granularity::Month.bucket_of(ms);
        assert_eq!(m, 2026 * 12 + 2);
        assert_eq!(crate::domain::format_rfc3339_ms(Granularity::Month.start_ms(m)), "2026-03-01T00:00:00.000Z");
        assert_eq!(crate::domain::format_rfc3339_ms(Granularity::Month.start_ms(m + 10)), "2027-01-01T00:00:00.000Z");
        let d = Granularity::Day.bucket_of(ms);
        assert_eq!(crate::domain::format_rfc3339_ms(Granularity::Day.start_ms(d)), "2026-03-15T00:00:00.000Z");
        assert_eq!(Granularity::Hour.key_part(Granularity::Hour.bucket_of(ms)), format!("h{}", ms / 3_600_000));
    }

    #[test]
    fn rows_group_by_the_dimensions_asked_and_always_by_unit() {
        let fields: Vec<String> = [
            ("tenant:t/workspace:a/agent:x\u{1f}TOKENS\u{1f}llm.completion\u{1f}gpt", "10 12 1 1 0"),
            ("tenant:t/workspace:a/agent:y\u{1f}TOKENS\u{1f}llm.completion\u{1f}gpt", "5 0 1 0 0"),
            ("tenant:t/workspace:b\u{1f}TOKENS\u{1f}tool.call\u{1f}search", "7 9 1 2 1"),
            ("tenant:t/workspace:a\u{1f}USD_MICROCENTS\u{1f}llm.completion\u{1f}gpt", "3 3 1 1 0"),
        ]
        .iter()
        .flat_map(|(g, v)| [g.to_string(), v.to_string()])
        .collect();
        let rows = bucket_rows(1, &fields, &[Dim::Workspace], &Selection::default()).unwrap();
        let got: Vec<(String, String, i128, u64)> =
            rows.iter().map(|r| (r.dims[0].clone(), r.unit.clone(), r.figures.spent, r.figures.charges)).collect();
        assert_eq!(
            got,
            vec![
                ("a".into(), "TOKENS".into(), 15, 2),
                ("a".into(), "USD_MICROCENTS".into(), 3, 1),
                ("b".into(), "TOKENS".into(), 7, 1)
            ]
        );
        let sel = Selection { unit: Some("TOKENS".into()), scope_prefix: Some("tenant:t/workspace:a".into()) };
        let rows = bucket_rows(1, &fields, &[Dim::Agent, Dim::ActionName], &sel).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].dims, vec!["x".to_string(), "gpt".to_string()]);
        // a prefix is whole segments: workspace:a never admits workspace:ab
        let sel = Selection { unit: None, scope_prefix: Some("tenant:t/workspace".into()) };
        assert!(bucket_rows(1, &fields, &[], &sel).unwrap().is_empty());
        assert!(bucket_rows(1, &["x".into(), "1 2 3 4 5".into()], &[], &Selection::default()).is_err());
    }

    #[test]
    fn group_by_is_strict() {
        assert_eq!(Dim::parse_list("agent,unit,workspace").unwrap(), vec![Dim::Workspace, Dim::Agent]);
        assert!(Dim::parse_list("agent,agent").is_err());
        assert!(Dim::parse_list("model").is_err());
        assert!(Dim::parse_list("").unwrap().is_empty());
    }

    #[test]
    fn csv_quotes_and_defuses_formulas() {
        let rows = vec![Row {
            bucket: 0,
            dims: vec!["=cmd()".into(), "a,b".into()],
            unit: "TOKENS".into(),
            figures: Figures { spent: 3, estimated: 4, charges: 1, reservations: 1, released: 0 },
        }];
        let text = csv(Granularity::Day, &[Dim::Agent, Dim::ActionName], &rows);
        assert_eq!(
            text,
            "bucket_start,bucket_end,agent,action_name,unit,spent,estimated,charges,reservations,released\r\n\
             1970-01-01T00:00:00.000Z,1970-01-02T00:00:00.000Z,'=cmd(),\"a,b\",TOKENS,3,4,1,1,0\r\n"
        );
    }
}
