//! The Gantt-style timeline PNG of an analyzed trace, as the MORI-EP guide describes it: one
//! subplot per iteration, x = microseconds from the iteration start; serial kernels as
//! full-height bars; the internode lane (red/purple) in the upper half and the intranode lane
//! (green/teal) in the lower half; the region where both lanes run shaded grey and labelled
//! "concurrent".

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

/// Draws up to [`MAX_PLOTTED`] iterations to `path` (PNG). Errors: nothing to draw, or the
/// file cannot be written.
pub fn draw(a: &Analysis, path: &Path, title: &str) -> CliResult<()> {
    let err = |e: &dyn std::fmt::Display| CliError::input(format!("--out {}: {e}", path.display()));
    let its: Vec<_> = a.iterations.iter().take(MAX_PLOTTED).collect();
    if its.is_empty() {
        return Err(err(&"no iteration to draw"));
    }
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).map_err(|_| err(&"font"))?;
    let xmax = its.iter().map(|i| i.dur_us).fold(1.0, f64::max) * 1.02;
    // Time stamps near the float limit (1e308 us) give an infinite extent, on which the axis
    // layout never ends (found by the trace_analyze fuzz target).
    if !xmax.is_finite() {
        return Err(err(
            &"an iteration lasts longer than a plot axis can hold (time stamps near the float limit); --no-png skips the plot",
        ));
    }
    let h = 60 + 170 * its.len() as u32;
    let root = BitMapBackend::new(path, (1400, h)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root.titled(title, ("sans-serif", 22)).map_err(|e| err(&e))?;
    let areas = root.split_evenly((its.len(), 1));
    for (it, area) in its.iter().zip(areas.iter()) {
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
            .x_desc("us from iteration start")
            .draw()
            .map_err(|e| err(&e))?;
        let grey = RGBColor(200, 200, 200).mix(0.55);
        c.draw_series(it.concurrent.iter().map(|r| Rectangle::new([(r.start_us, 0.0), (r.end_us, 2.0)], grey.filled())))
            .map_err(|e| err(&e))?;
        c.draw_series(
            it.concurrent
                .iter()
                .map(|r| Text::new("concurrent", ((r.start_us + r.end_us) / 2.0 - xmax * 0.025, 1.02), ("sans-serif", 12).into_font())),
        )
        .map_err(|e| err(&e))?;
        let mut bars = Vec::new();
        let mut labels = Vec::new();
        for r in &it.kernels {
            let Some(k) = Kernel::of(&r.name) else { continue };
            let (y0, y1) = match (r.lane, k) {
                (Lane::Internode, Kernel::DispatchRecv) => (1.08, 1.48),
                (Lane::Internode, _) => (1.52, 1.92),
                (Lane::Intranode, _) => (0.08, 0.92),
                _ => (0.0, 2.0),
            };
            let col = color(k);
            bars.push(Rectangle::new([(r.start_us, y0), (r.end_us, y1)], col.mix(0.85).filled()));
            bars.push(Rectangle::new([(r.start_us, y0), (r.end_us, y1)], BLACK.stroke_width(1)));
            let ly = if r.lane == Lane::Serial { 1.92 } else { y1 - 0.06 };
            if r.dur_us > xmax * 0.03 || r.lane != Lane::Serial {
                labels.push((k.label(), (r.start_us + xmax * 0.002, ly)));
            }
        }
        c.draw_series(bars).map_err(|e| err(&e))?;
        c.draw_series(labels.into_iter().map(|(t, p)| Text::new(t, p, ("sans-serif", 11).into_font().color(&WHITE))))
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

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
