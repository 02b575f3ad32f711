//! Reading a real job trace (Philly's CSV, plain or gzip) into jobs.
//!
//! A job of `g` GPUs on nodes of `p` GPUs becomes one task when `g <= p`, and
//! otherwise a gang of `ceil(g / p)` identical tasks of `ceil(g / tasks)` GPUs
//! each (Philly's 16-GPU job on 8-GPU nodes: a gang of 2 × 8 GPUs). Jobs are
//! ordered by submit time (the file is not) and times are made relative to
//! the first submit. An optional `gpu_model` column is replayed as a
//! `gpu.model=…` constraint.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use flate2::read::GzDecoder;
use muster_core::sm::{AllocSpec, LabelExpr, Limits, Resources};
use thiserror::Error;

use crate::job::Job;

/// Why a trace could not be read.
#[derive(Debug, Error)]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("cannot read trace {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The header lacks a required column.
    #[error("trace header lacks the column {0:?} (need timestamp, duration, num_gpus)")]
    MissingColumn(&'static str),
    /// A row does not parse.
    #[error("trace line {line}: {reason}")]
    BadRow {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// The trace holds no jobs.
    #[error("trace holds no jobs")]
    Empty,
}

/// Reads a trace file (gzip-compressed if it starts with the gzip magic).
pub fn load_trace(path: &Path, node: &Resources, limit: Option<usize>) -> Result<Vec<Job>, TraceError> {
    let io = |source| TraceError::Io { path: path.display().to_string(), source };
    let mut file = File::open(path).map_err(io)?;
    let mut magic = [0u8; 2];
    let n = file.read(&mut magic).map_err(io)?;
    let file = File::open(path).map_err(io)?;
    let reader: Box<dyn BufRead> = if n == 2 && magic == [0x1f, 0x8b] {
        Box::new(BufReader::new(GzDecoder::new(file)))
    } else {
        Box::new(BufReader::new(file))
    };
    parse_trace(reader, node, limit).map_err(|e| match e {
        TraceError::Io { source, .. } => io(source),
        other => other,
    })
}

/// Parses trace CSV text.
pub fn parse_trace(reader: impl BufRead, node: &Resources, limit: Option<usize>) -> Result<Vec<Job>, TraceError> {
    let mut lines = reader.lines();
    let io = |source| TraceError::Io { path: "<input>".into(), source };
    let header = lines.next().ok_or(TraceError::Empty)?.map_err(io)?;
    let columns: Vec<&str> = header.trim().split(',').collect();
    let col = |name: &'static str| columns.iter().position(|c| *c == name).ok_or(TraceError::MissingColumn(name));
    let (c_time, c_duration, c_gpus) = (col("timestamp")?, col("duration")?, col("num_gpus")?);
    let c_cluster = columns.iter().position(|c| *c == "cluster");
    // Optional: the GPU model a job asked for, replayed as a constraint.
    let c_model = columns.iter().position(|c| *c == "gpu_model");
    let limits = Limits::default();

    let mut rows: Vec<(u64, usize, u64, u32, String, Option<String>)> = Vec::new();
    for (i, line) in lines.enumerate() {
        let line_no = i + 2;
        let line = line.map_err(io)?;
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| TraceError::BadRow { line: line_no, reason };
        let fields: Vec<&str> = line.trim().split(',').collect();
        let field = |c: usize| fields.get(c).copied().ok_or_else(|| bad(format!("missing column {}", c + 1)));
        let submit_s =
            parse_timestamp(field(c_time)?).ok_or_else(|| bad(format!("bad timestamp {:?}", fields[c_time])))?;
        let duration: f64 = field(c_duration)?
            .parse()
            .ok()
            .filter(|d: &f64| d.is_finite() && *d >= 0.0)
            .ok_or_else(|| bad(format!("bad duration {:?}", fields[c_duration])))?;
        let gpus: u32 = field(c_gpus)?.parse().map_err(|_| bad(format!("bad num_gpus {:?}", fields[c_gpus])))?;
        let owner = c_cluster.and_then(|c| fields.get(c)).map_or("trace", |s| s).to_string();
        let model = c_model.and_then(|c| fields.get(c)).map(|m| m.trim()).filter(|m| !m.is_empty());
        let model = match model {
            Some(m) => Some(
                LabelExpr::parse(&format!("gpu.model={m}"))
                    .map_err(|e| bad(format!("bad gpu_model: {e}")))?
                    .to_string(),
            ),
            None => None,
        };
        rows.push((submit_s, line_no, (duration * 1000.0).round() as u64, gpus, owner, model));
    }
    rows.sort_by_key(|r| (r.0, r.1));
    if let Some(limit) = limit {
        rows.truncate(limit);
    }
    let first = rows.first().ok_or(TraceError::Empty)?.0;
    let per_node = node.gpus.max(1);
    Ok(rows
        .into_iter()
        .map(|(submit_s, _, duration_ms, gpus, owner, model)| {
            let gang = gpus.div_ceil(per_node).max(1);
            let task_gpus = gpus.div_ceil(gang);
            let share = u64::from(task_gpus.max(1));
            let resources = Resources {
                gpus: task_gpus,
                vram_mb: if task_gpus > 0 { node.vram_mb / 2 } else { 0 },
                mem_mb: (node.mem_mb * share / u64::from(per_node) / 2).max(1),
                cpus: (node.cpus * task_gpus.max(1) / per_node / 2).max(1),
            };
            let mut spec = AllocSpec::new(owner, gang, resources, vec!["trace-job".into()]);
            if let Some(m) = model {
                spec.placement.constraints = LabelExpr::parse_list(&m).expect("checked above");
            }
            spec.walltime_s = (duration_ms / 1000 * 2 + 600).min(limits.max_walltime_s);
            // A job longer than the longest walltime allowed (16 of Philly's
            // 82,247 ran past 30 days) runs until the budget watchdog would
            // stop it.
            let duration_ms = duration_ms.clamp(1, spec.walltime_s * 1000);
            Job::plain((submit_s - first) * 1000, spec, duration_ms)
        })
        .collect())
}

/// Parses `YYYY-MM-DD HH:MM:SS` (UTC) into seconds since the Unix epoch.
pub fn parse_timestamp(s: &str) -> Option<u64> {
    let (date, time) = s.trim().split_once(' ')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.split(':').map(|x| x.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 || hh < 0 || mm < 0 || ss < 0
    {
        return None;
    }
    let days = muster_core::words::days_from_civil(y, m, day);
    u64::try_from(days * 86_400 + hh * 3600 + mm * 60 + ss).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE: Resources = Resources { gpus: 8, vram_mb: 32_000, mem_mb: 512_000, cpus: 64 };

    #[test]
    fn timestamps_parse_to_unix_seconds() {
        assert_eq!(parse_timestamp("1970-01-01 00:00:00"), Some(0));
        assert_eq!(parse_timestamp("2017-10-09 07:01:55"), Some(1_507_532_515));
        assert_eq!(parse_timestamp("2000-02-29 12:00:00"), Some(951_825_600));
        assert_eq!(parse_timestamp("2017-13-01 00:00:00"), None);
        assert_eq!(parse_timestamp("yesterday"), None);
    }

    #[test]
    fn rows_become_sorted_jobs_and_big_jobs_become_gangs() {
        let csv = "timestamp,duration,num_gpus,gpu_time,cluster\n\
                   2017-10-09 07:01:55,66.0,1,66.0,vc1\n\
                   2017-10-09 07:00:00,10.5,16,168.0,vc2\n\
                   2017-10-09 07:00:01,20,12,240.0,vc2\n";
        let jobs = parse_trace(csv.as_bytes(), &NODE, None).unwrap();
        assert_eq!(jobs.len(), 3);
        assert_eq!((jobs[0].submit_ms, jobs[0].spec.gang_size, jobs[0].spec.resources.gpus), (0, 2, 8));
        assert_eq!(jobs[0].duration_ms, 10_500);
        assert_eq!(jobs[0].spec.owner, "vc2");
        assert_eq!((jobs[1].submit_ms, jobs[1].spec.gang_size, jobs[1].spec.resources.gpus), (1_000, 2, 6));
        assert_eq!((jobs[2].submit_ms, jobs[2].spec.gang_size, jobs[2].spec.resources.gpus), (115_000, 1, 1));
        let limited = parse_trace(csv.as_bytes(), &NODE, Some(1)).unwrap();
        assert_eq!(limited.len(), 1);
        assert_eq!(limited[0].spec.gang_size, 2, "the limit keeps the earliest submits");
    }

    #[test]
    fn bad_input_names_the_line_or_column() {
        let missing = "timestamp,duration\n2017-10-09 07:01:55,66\n";
        assert!(matches!(parse_trace(missing.as_bytes(), &NODE, None), Err(TraceError::MissingColumn("num_gpus"))));
        let bad = "timestamp,duration,num_gpus\n2017-10-09 07:01:55,66,1\n2017-10-09 07:01:55,-3,1\n";
        let err = parse_trace(bad.as_bytes(), &NODE, None).unwrap_err();
        assert!(matches!(err, TraceError::BadRow { line: 3, .. }), "{err}");
        assert!(matches!(parse_trace("timestamp,duration,num_gpus\n".as_bytes(), &NODE, None), Err(TraceError::Empty)));
    }

    #[test]
    fn the_shipped_trace_loads_whole() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("traces/philly.csv.gz");
        let jobs = load_trace(&path, &NODE, None).unwrap();
        // 82,247 jobs: the source README counts 82,248 lines, one of them the blank last line.
        assert_eq!(jobs.len(), 82_247);
        assert!(jobs.windows(2).all(|w| w[0].submit_ms <= w[1].submit_ms));
        assert_eq!(jobs.iter().filter(|j| j.spec.gang_size == 16).count(), 3, "the three 128-GPU jobs");
    }
}
