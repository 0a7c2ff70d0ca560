//! Draws `docs/benchmarks.png`: render and validation time against scale (log-log,
//! from `hapwright bench`) on the left, end-to-end latency p50/p95 bars on the right.

use std::path::Path;

use anyhow::{Context, Result, anyhow};
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::report::ScaleReport;
use crate::scenarios::Latency;

/// Registers the TTF font at `font` as plotters' `sans-serif` (the `ab_glyph` backend
/// has no system fonts).
pub fn register_font(font: &Path) -> Result<()> {
    let bytes =
        std::fs::read(font).with_context(|| format!("reading the font {}", font.display()))?;
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow!("{} is not a usable TrueType font", font.display()))
}

/// One bar group of the latency panel.
pub struct Bar {
    /// Label under the bar (`runtime, 100`).
    pub label: String,
    /// p50, ms.
    pub p50: f64,
    /// p95, ms.
    pub p95: f64,
    /// The target for p50, ms.
    pub target: f64,
}

/// The bars for a list of latencies and their targets.
pub fn bars(latencies: &[(Latency, f64)]) -> Vec<Bar> {
    latencies
        .iter()
        .map(|(l, target)| Bar {
            label: format!("{}, {}", l.path, l.backends),
            p50: l.quantile(0.5),
            p95: l.quantile(0.95),
            target: *target,
        })
        .collect()
}

/// Draws the chart into `out` (PNG, 1200×520).
pub fn draw(out: &Path, scales: &[ScaleReport], bars: &[Bar]) -> Result<()> {
    let root = BitMapBackend::new(out, (1200, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(640);
    draw_scales(&left, scales)?;
    draw_bars(&right, bars)?;
    root.present()
        .with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

/// A line of the scale panel: its name, colour and value.
type Series = (&'static str, RGBColor, fn(&ScaleReport) -> f64);

fn draw_scales(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    scales: &[ScaleReport],
) -> Result<()> {
    let series: [Series; 3] = [
        ("render", BLUE, |s| s.render_ms),
        ("phase 1 (parser)", GREEN, |s| s.phase1_ms),
        ("phase 2 (haproxy -c)", RED, |s| s.phase2_ms),
    ];
    let max_x = scales.iter().map(|s| s.scale as f64).fold(10.0, f64::max) * 2.0;
    let values = scales
        .iter()
        .flat_map(|s| series.iter().map(move |(_, _, f)| f(s)));
    let max_y = values.clone().fold(1.0, f64::max) * 2.0;
    let min_y = values.filter(|v| *v > 0.0).fold(max_y, f64::min).min(1.0) / 2.0;
    let mut chart = ChartBuilder::on(area)
        .caption(
            "hapwright bench: time vs scale (log-log)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((5.0..max_x).log_scale(), (min_y..max_y).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("Services")
        .y_desc("milliseconds")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y}"))
        .label_style(("sans-serif", 13))
        .draw()?;
    for (name, color, value) in series {
        let points: Vec<(f64, f64)> = scales
            .iter()
            .map(|s| (s.scale as f64, value(s).max(min_y)))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 4, color.filled())),
        )?;
    }
    // The render target: 50 ms at 10,000.
    chart
        .draw_series(std::iter::once(Cross::new(
            (10_000.0, 50.0),
            7,
            BLACK.stroke_width(2),
        )))?
        .label("render target (50 ms at 10,000)")
        .legend(|(x, y)| Cross::new((x + 9, y), 5, BLACK.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

fn draw_bars(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    bars: &[Bar],
) -> Result<()> {
    let max_y = bars
        .iter()
        .flat_map(|b| [b.p50, b.p95, b.target])
        .fold(10.0, f64::max)
        * 1.15;
    let n = bars.len().max(1);
    let labels: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(
            "end-to-end latency: file write → answer",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..n as f64, 0.0..max_y)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.01 && i < labels.len() {
                labels[i].clone()
            } else {
                String::new()
            }
        })
        .x_desc("path, backends")
        .y_desc("milliseconds")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .label_style(("sans-serif", 13))
        .draw()?;
    let p50 = RGBColor(70, 110, 200);
    let p95 = RGBColor(240, 160, 60);
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let x = i as f64;
            Rectangle::new([(x + 0.12, 0.0), (x + 0.48, b.p50)], p50.filled())
        }))?
        .label("p50")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], p50.filled()));
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let x = i as f64;
            Rectangle::new([(x + 0.52, 0.0), (x + 0.88, b.p95)], p95.filled())
        }))?
        .label("p95")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], p95.filled()));
    chart
        .draw_series(bars.iter().enumerate().map(|(i, b)| {
            let x = i as f64;
            PathElement::new(
                vec![(x + 0.05, b.target), (x + 0.95, b.target)],
                BLACK.stroke_width(2),
            )
        }))?
        .label("p50 target")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 13))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
