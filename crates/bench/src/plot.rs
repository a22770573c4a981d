//! Bandwidth against message size, one curve per series, as a PNG.

use plotters::prelude::*;
use std::path::Path;

use crate::report::BwRow;

/// Where the text font comes from (Debian's fonts-dejavu-core).
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Draws MB/s over message size (log x), one curve per transport/mode/completion.
pub fn bandwidth_png(path: &Path, title: &str, rows: &[BwRow]) -> anyhow::Result<()> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    for r in rows {
        let name = format!("{} {} {}", r.transport, r.mode, r.completion);
        let Some(mbs) = r.mb_per_s else { continue };
        match series.iter_mut().find(|(n, _)| *n == name) {
            Some((_, pts)) => pts.push((r.size as f64, mbs)),
            None => series.push((name, vec![(r.size as f64, mbs)])),
        }
    }
    lines_png(
        path,
        title,
        ("message size (bytes)", "MB/s (10^6 bytes/s)"),
        &series,
    )
}

fn register_font() -> anyhow::Result<()> {
    let font = std::fs::read(FONT)
        .map_err(|e| anyhow::anyhow!("{FONT}: {e} (install Debian's fonts-dejavu-core)"))?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("{FONT} is not a usable font"))
}

/// Draws named series of (x, y) points over a log x axis.
pub fn lines_png(
    path: &Path,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    series: &[(String, Vec<(f64, f64)>)],
) -> anyhow::Result<()> {
    register_font()?;
    let xs = || series.iter().flat_map(|(_, p)| p.iter().map(|(x, _)| *x));
    let xmin = xs().fold(f64::INFINITY, f64::min).clamp(1.0, f64::MAX);
    let xmax = xs().fold(2.0, f64::max).max(xmin * 2.0);
    let ymax = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
        .fold(1.0, f64::max);

    let root = BitMapBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d((xmin..xmax).log_scale(), 0.0..ymax * 1.1)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .label_style(("sans-serif", 14))
        .draw()?;
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    root.present()?;
    Ok(())
}
