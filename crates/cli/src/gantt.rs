//! The Gantt-style timeline PNG of an analyzed trace, as the MORI-EP guide describes it: one
//! subplot per iteration, x = microseconds from the iteration start; serial kernels as
//! full-height bars; the internode lane (red/purple) in the upper half and the intranode lane
//! (green/teal) in the lower half; the region where both lanes run shaded grey and labelled
//! "concurrent". An idle stretch inside an iteration longer than 1 ms and a fifth of it (the
//! host's work between a dispatch and its combine) is cut from the plot, marked by a dashed
//! line with its length; the text tables keep the real times.

use crate::error::{CliError, CliResult};
use crate::trace::{Analysis, Kernel, Lane};
use plotters::prelude::*;
use std::path::Path;

static FONT: &[u8] = include_bytes!("../../bench/assets/DejaVuSans.ttf");

/// Most iterations drawn (the rest are in the text summary).
pub const MAX_PLOTTED: usize = 8;

fn color(k: Kernel) -> RGBColor {
    match k {
        Kernel::DispatchSend => RGBColor(214, 39, 40),
        Kernel::DispatchRecv => RGBColor(148, 103, 189),
        Kernel::CombineInter => RGBColor(173, 20, 87),
        Kernel::DispatchIntra => RGBColor(44, 160, 44),
        Kernel::CombineIntra => RGBColor(23, 190, 207),
        Kernel::CopyToStaging | Kernel::CombineStaging => RGBColor(31, 119, 180),
        Kernel::Layout | Kernel::CopyOut => RGBColor(188, 189, 34),
        Kernel::DispatchSync | Kernel::CombineSync => RGBColor(127, 127, 127),
        Kernel::CombineSyncBarrier => RGBColor(90, 90, 90),
        Kernel::CombineAll => RGBColor(255, 127, 14),
    }
}

/// Idle stretches of an iteration worth cutting: (start, length) in µs from its start, where
/// no kernel of `spans` (start, end) runs for more than 1 ms and a fifth of `dur`.
pub fn idle_cuts(spans: &[(f64, f64)], dur: f64) -> Vec<(f64, f64)> {
    let mut v: Vec<(f64, f64)> = spans.to_vec();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut cuts = Vec::new();
    let mut reach = f64::NEG_INFINITY;
    for (s, e) in v {
        if reach.is_finite() && s - reach > 1000.0_f64.max(dur / 5.0) {
            cuts.push((reach, s - reach));
        }
        reach = reach.max(e);
    }
    cuts
}

/// `x` on the plot once `cuts` are removed (each leaves a sliver of `keep` µs).
fn squeeze(x: f64, cuts: &[(f64, f64)], keep: f64) -> f64 {
    let gone: f64 = cuts.iter().filter(|c| c.0 + c.1 <= x).map(|c| c.1 - keep).sum();
    x - gone
}

/// Draws up to [`MAX_PLOTTED`] iterations to `path` (PNG). Errors: nothing to draw, or the
/// file cannot be written.
pub fn draw(a: &Analysis, path: &Path, title: &str) -> CliResult<()> {
    let err = |e: &dyn std::fmt::Display| CliError::input(format!("--out {}: {e}", path.display()));
    let its: Vec<_> = a.iterations.iter().take(MAX_PLOTTED).collect();
    if its.is_empty() {
        return Err(err(&"no iteration to draw"));
    }
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).map_err(|_| err(&"font"))?;
    // Time stamps near the float limit (1e308 us) give an infinite extent, on which the axis
    // layout never ends (found by the trace_analyze fuzz target).
    if !its.iter().all(|i| i.dur_us.is_finite()) {
        return Err(err(
            &"an iteration lasts longer than a plot axis can hold (time stamps near the float limit); --no-png skips the plot",
        ));
    }
    let cuts: Vec<Vec<(f64, f64)>> =
        its.iter().map(|it| idle_cuts(&it.kernels.iter().map(|r| (r.start_us, r.end_us)).collect::<Vec<_>>(), it.dur_us)).collect();
    let shown = its.iter().zip(&cuts).map(|(it, c)| it.dur_us - c.iter().map(|g| g.1).sum::<f64>()).fold(1.0, f64::max);
    let keep = shown * 0.03;
    let xmax = (shown + keep * cuts.iter().map(Vec::len).max().unwrap_or(0) as f64) * 1.02;
    let h = 60 + 170 * its.len() as u32;
    let root = BitMapBackend::new(path, (1400, h)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root.titled(title, ("sans-serif", 22)).map_err(|e| err(&e))?;
    let areas = root.split_evenly((its.len(), 1));
    for ((it, area), cuts) in its.iter().zip(areas.iter()).zip(&cuts) {
        let x = |v: f64| squeeze(v, cuts, keep);
        let mut c = ChartBuilder::on(area)
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(90)
            .caption(format!("iteration {} ({:.1} us)", it.index, it.dur_us), ("sans-serif", 15))
            .build_cartesian_2d(0.0..xmax, 0.0..2.0)
            .map_err(|e| err(&e))?;
        c.configure_mesh()
            .disable_y_mesh()
            .light_line_style(TRANSPARENT)
            .y_labels(5)
            .y_label_formatter(&|y: &f64| match *y {
                v if (v - 1.5).abs() < 0.26 => "internode".into(),
                v if (v - 0.5).abs() < 0.26 => "intranode".into(),
                _ => String::new(),
            })
            .x_desc(if cuts.is_empty() { "us from iteration start" } else { "us from iteration start (idle stretches cut)" })
            .draw()
            .map_err(|e| err(&e))?;
        let grey = RGBColor(200, 200, 200).mix(0.55);
        c.draw_series(it.concurrent.iter().map(|r| Rectangle::new([(x(r.start_us), 0.0), (x(r.end_us), 2.0)], grey.filled())))
            .map_err(|e| err(&e))?;
        c.draw_series(
            it.concurrent.iter().map(|r| {
                Text::new("concurrent", ((x(r.start_us) + x(r.end_us)) / 2.0 - xmax * 0.025, 1.02), ("sans-serif", 12).into_font())
            }),
        )
        .map_err(|e| err(&e))?;
        let mut bars = Vec::new();
        let mut labels = Vec::new();
        // Serial (full-height) bars first, so that lane bars running beside them stay visible.
        let mut order: Vec<_> = it.kernels.iter().collect();
        order.sort_by_key(|r| r.lane != Lane::Serial);
        for r in order {
            let Some(k) = Kernel::of(&r.name) else { continue };
            let (y0, y1) = match (r.lane, k) {
                (Lane::Internode, Kernel::DispatchRecv) => (1.08, 1.48),
                (Lane::Internode, _) => (1.52, 1.92),
                (Lane::Intranode, _) => (0.08, 0.92),
                _ => (0.0, 2.0),
            };
            let col = color(k);
            let (x0, x1) = (x(r.start_us), x(r.end_us));
            bars.push(Rectangle::new([(x0, y0), (x1, y1)], col.mix(0.85).filled()));
            bars.push(Rectangle::new([(x0, y0), (x1, y1)], BLACK.stroke_width(1)));
            let ly = if r.lane == Lane::Serial { 1.92 } else { y1 - 0.06 };
            if x1 - x0 > xmax * 0.03 || r.lane != Lane::Serial {
                labels.push((k.label(), (x0 + xmax * 0.002, ly)));
            }
        }
        c.draw_series(bars).map_err(|e| err(&e))?;
        c.draw_series(labels.into_iter().map(|(t, p)| Text::new(t, p, ("sans-serif", 11).into_font().color(&WHITE))))
            .map_err(|e| err(&e))?;
        for &(at, len) in cuts {
            let cx = x(at) + keep / 2.0;
            c.draw_series(DashedLineSeries::new([(cx, 0.0), (cx, 2.0)], 4, 3, BLACK.stroke_width(1))).map_err(|e| err(&e))?;
            c.draw_series([Text::new(
                format!("idle {:.1} ms cut", len / 1000.0),
                (cx - xmax * 0.06, 0.02),
                ("sans-serif", 11).into_font(),
            )])
            .map_err(|e| err(&e))?;
        }
    }
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_stretches_past_a_millisecond_and_a_fifth_are_cut() {
        // A dispatch (0..600), 29 ms of host work, a combine (29600..30100): one cut.
        let spans = [(0.0, 5.0), (10.0, 600.0), (40.0, 90.0), (29_600.0, 30_000.0), (29_650.0, 30_100.0)];
        assert_eq!(idle_cuts(&spans, 30_100.0), [(600.0, 29_000.0)]);
        // Gaps below a millisecond, or below a fifth of the iteration, stay.
        assert!(idle_cuts(&[(0.0, 100.0), (900.0, 1000.0)], 1000.0).is_empty());
        assert!(idle_cuts(&[(0.0, 10_000.0), (11_500.0, 20_000.0)], 20_000.0).is_empty());
        // After a cut, later times move left by the cut less the sliver kept.
        let cuts = [(600.0, 29_000.0)];
        assert_eq!(squeeze(500.0, &cuts, 20.0), 500.0);
        assert_eq!(squeeze(29_600.0, &cuts, 20.0), 620.0);
    }

    #[test]
    fn an_infinite_extent_is_refused_not_drawn_forever() {
        let t = r#"[{"name":"ep_dispatch_copy_to_staging","ph":"B","ts":-1e308,"tid":1},
                   {"name":"ep_dispatch_copy_to_staging","ph":"E","ts":1e308,"tid":1}]"#;
        let a = crate::trace::analyze(&crate::trace::parse(t).unwrap()).unwrap();
        assert!(a.iterations[0].dur_us.is_infinite());
        let path = std::env::temp_dir().join(format!("mori-gantt-inf-{}.png", std::process::id()));
        let e = draw(&a, &path, "t").unwrap_err().to_string();
        assert!(e.contains("longer than a plot axis can hold"), "{e}");
        assert!(!path.exists());
    }
}
