//! Output: the seed's table, JSON rows and a PNG plot.

use crate::paged::PagedReport;
use serde::Serialize;
use std::path::Path;

/// One measured point, in the units the seed uses (nixlbench's formulas).
#[derive(Debug, Clone, Copy, Serialize, serde::Deserialize, PartialEq)]
pub struct Row {
    /// Message size, bytes.
    pub msg_size: u64,
    /// Transfers per iteration.
    pub batch: u64,
    /// Timed iterations.
    pub iters: u64,
    /// `msg × batch × iters / 1e9 / (total_us / 1e6)`, GB/s (GB = 1e9).
    pub avg_bw_gbps: f64,
    /// `total_us / (iters × batch)`, µs per transfer.
    pub avg_lat_us: f64,
    /// Whole timed loop, µs.
    pub total_us: f64,
    /// With `--copy-baseline`: the bare copies' `total / (iters × batch)`, µs, timed in the
    /// same run between the same buffers (`mori_bench::baseline`); `null` in JSON otherwise.
    /// (Always serialized: rows also travel between ranks as postcard, which has no field
    /// names to skip by.)
    pub copy_lat_us: Option<f64>,
}

impl Row {
    /// Applies the seed's formulas to one whole-loop duration.
    pub fn new(msg: u64, batch: u64, iters: u64, total: std::time::Duration) -> Row {
        let total_us = total.as_secs_f64() * 1e6;
        Row {
            msg_size: msg,
            batch,
            iters,
            avg_bw_gbps: (msg * batch * iters) as f64 / 1e9 / (total_us / 1e6),
            avg_lat_us: total_us / (iters * batch) as f64,
            total_us,
            copy_lat_us: None,
        }
    }
}

/// The header line of the seed: `MsgSize(B)  Batch  Iters  AvgBW(GB/s)  AvgLat(us)  TotalDur(us)`.
pub const HEADER: [&str; 6] = ["MsgSize(B)", "Batch", "Iters", "AvgBW(GB/s)", "AvgLat(us)", "TotalDur(us)"];

/// The columns `--copy-baseline` adds: the bare copy's latency and the engine's ratio to it.
pub const BASELINE_HEADER: [&str; 2] = ["CopyLat(us)", "Lat/Copy"];

/// Renders rows as the seed's whitespace-aligned table (plus [`BASELINE_HEADER`] when the
/// rows carry a copy baseline).
pub fn table(rows: &[Row]) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::NOTHING);
    let baseline = rows.iter().any(|r| r.copy_lat_us.is_some());
    let mut header = HEADER.to_vec();
    if baseline {
        header.extend(BASELINE_HEADER);
    }
    t.set_header(&header);
    for r in rows {
        let mut cells = vec![
            r.msg_size.to_string(),
            r.batch.to_string(),
            r.iters.to_string(),
            format!("{:.3}", r.avg_bw_gbps),
            format!("{:.2}", r.avg_lat_us),
            format!("{:.1}", r.total_us),
        ];
        if baseline {
            let c = r.copy_lat_us.unwrap_or(f64::NAN);
            cells.extend([format!("{c:.2}"), format!("{:.3}", r.avg_lat_us / c)]);
        }
        t.add_row(cells);
    }
    for i in 0..header.len() {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(comfy_table::CellAlignment::Right);
        }
    }
    t.to_string()
}

/// `text` with `prefix` and a space in front of every line: the seed's `[gpu N]` rows of one
/// pair and the `[AGGREGATE]` lines.
pub fn prefixed(prefix: &str, text: &str) -> String {
    text.lines().map(|l| format!("{prefix} {l}")).collect::<Vec<_>>().join("\n")
}

/// Writes `{ "config": ..., "validation": ..., "rows": [...] }`, plus `"paged": {...}` (the
/// report's fields) after a `--paged` run.
pub fn write_json<C: Serialize>(
    path: &Path,
    config: &C,
    validation: &str,
    rows: &[Row],
    paged: Option<&PagedReport>,
) -> Result<(), String> {
    #[derive(Serialize)]
    struct Doc<'a, C> {
        config: &'a C,
        validation: &'a str,
        rows: &'a [Row],
        #[serde(skip_serializing_if = "Option::is_none")]
        paged: Option<&'a PagedReport>,
    }
    let s = serde_json::to_string_pretty(&Doc { config, validation, rows, paged }).map_err(|e| format!("--json: {e}"))?;
    std::fs::write(path, s).map_err(|e| format!("--json {}: {e}", path.display()))
}

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Draws bandwidth and latency against message size (or batch when `x_is_batch`), log2 x axis.
pub fn plot(path: &Path, rows: &[Row], x_is_batch: bool, title: &str) -> Result<(), String> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| format!("--plot {}: {e}", path.display());
    if rows.is_empty() {
        return Err(err(&"no rows to plot"));
    }
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).map_err(|_| err(&"font"))?;
    let root = BitMapBackend::new(path, (1200, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root.titled(title, ("sans-serif", 20)).map_err(|e| err(&e))?;
    let (l, r) = root.split_horizontally(600);
    let xs: Vec<f64> = rows.iter().map(|r| if x_is_batch { r.batch } else { r.msg_size } as f64).collect();
    let (xmin, xmax) = (xs.iter().cloned().fold(f64::MAX, f64::min), xs.iter().cloned().fold(0.0, f64::max));
    let xlabel = if x_is_batch { "batch (transfers per iteration)" } else { "message size (bytes)" };
    type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;
    let series: [(&str, Vec<f64>, &Area, RGBColor); 2] = [
        ("bandwidth (GB/s)", rows.iter().map(|r| r.avg_bw_gbps).collect(), &l, BLUE),
        ("latency per transfer (us)", rows.iter().map(|r| r.avg_lat_us).collect(), &r, RED),
    ];
    for (name, ys, area, color) in series.iter() {
        let ymax = ys.iter().cloned().fold(0.0, f64::max) * 1.1 + 1e-9;
        let ymin = ys.iter().cloned().fold(f64::MAX, f64::min).max(1e-6) * 0.9;
        let mut c = ChartBuilder::on(area)
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .caption(*name, ("sans-serif", 16))
            .build_cartesian_2d((xmin.max(1.0)..xmax.max(2.0)).log_scale(), (ymin..ymax).log_scale())
            .map_err(|e| err(&e))?;
        c.configure_mesh().x_desc(xlabel).y_desc(*name).draw().map_err(|e| err(&e))?;
        c.draw_series(LineSeries::new(xs.iter().cloned().zip(ys.iter().cloned()), color.stroke_width(2))).map_err(|e| err(&e))?;
        c.draw_series(xs.iter().zip(ys.iter()).map(|(&x, &y)| Circle::new((x, y), 3, color.filled()))).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formulas_follow_nixlbench() {
        // 1 MiB x 16 x 100 iterations in 0.5 s.
        let r = Row::new(1 << 20, 16, 100, Duration::from_millis(500));
        assert!((r.avg_bw_gbps - (1048576.0 * 16.0 * 100.0 / 1e9 / 0.5)).abs() < 1e-9);
        assert!((r.avg_lat_us - 500_000.0 / 1600.0).abs() < 1e-9);
        assert!((r.total_us - 500_000.0).abs() < 1e-6);
        let t = table(&[r]);
        let first = t.lines().next().unwrap();
        for h in HEADER {
            assert!(first.contains(h), "{first}");
        }
        assert!(t.contains("1048576") && t.contains("3.355") && t.contains("312.50"), "{t}");
    }

    #[test]
    fn plot_writes_a_png() {
        let dir = std::env::temp_dir().join(format!("mori-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("p.png");
        let rows: Vec<Row> = (3..10).map(|k| Row::new(1 << k, 4, 10, Duration::from_micros(100 + k))).collect();
        plot(&p, &rows, false, "test").unwrap();
        let b = std::fs::read(&p).unwrap();
        assert_eq!(&b[1..4], b"PNG");
        assert!(b.len() > 5000);
        std::fs::remove_dir_all(&dir).ok();
    }
}
