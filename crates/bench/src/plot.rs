//! Pictures of the benchmarks' results, as PNGs: bandwidth and latency
//! against message size, one curve per series; ratios beside their
//! targets, one line each.

use plotters::coord::combinators::LogCoord;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

use crate::report::{BwRow, LatRow};

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
    draw_lines(
        path,
        title,
        ("message size (bytes)", "MB/s (10^6 bytes/s)"),
        &series,
        Some(size_label),
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
    descs: (&str, &str),
    series: &[(String, Vec<(f64, f64)>)],
) -> anyhow::Result<()> {
    draw_lines(path, title, descs, series, None)
}

/// As [`lines_png`], the x axis' labels by `x_label` where given.
fn draw_lines(
    path: &Path,
    title: &str,
    descs: (&str, &str),
    series: &[(String, Vec<(f64, f64)>)],
    x_label: Option<fn(f64) -> String>,
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
    let y = 0.0..ymax * 1.1;
    let mut chart = log_x_chart(&root, title, (xmin..xmax, y), descs, x_label)?;
    let curves: Vec<Curve> = series
        .iter()
        .enumerate()
        .map(|(i, (name, pts))| Curve {
            name: Some(name.clone()),
            points: pts.clone(),
            dashed: false,
            color: i,
        })
        .collect();
    draw_curves(&mut chart, &curves)?;
    root.present()?;
    Ok(())
}

/// Draws time over message size, both on log scales, one colour per
/// test, transport, mode and completion: its median as a solid curve,
/// its 99th percentile as a dashed one. Rows without a figure (or of no
/// bytes, which a log scale cannot place) are left out.
pub fn latency_png(path: &Path, title: &str, rows: &[LatRow]) -> anyhow::Result<()> {
    let mut series: Vec<(String, Points, Points)> = Vec::new();
    for r in rows {
        let (x, med, p99) = (r.size as f64, r.usec.median, r.usec.p99.max(r.usec.median));
        if r.size == 0 || !(med > 0.0 && p99.is_finite()) {
            continue;
        }
        let name = format!("{} {} {} {}", r.test, r.transport, r.mode, r.completion);
        match series.iter_mut().find(|(n, ..)| *n == name) {
            Some((_, m, p)) => {
                m.push((x, med));
                p.push((x, p99));
            }
            None => series.push((name, vec![(x, med)], vec![(x, p99)])),
        }
    }
    anyhow::ensure!(!series.is_empty(), "no latency figure to draw");
    register_font()?;
    let pts = || series.iter().flat_map(|(_, m, p)| m.iter().chain(p));
    let xmin = pts().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let xmax = pts().map(|p| p.0).fold(0.0, f64::max).max(xmin * 2.0);
    let ymin = pts().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let ymax = pts().map(|p| p.1).fold(0.0, f64::max).max(ymin * 2.0);

    let root = BitMapBackend::new(path, (1000, 640)).into_drawing_area();
    let y = (ymin * 0.8..ymax * 1.25).log_scale();
    let descs = (
        "message size (bytes)",
        "µs: median (solid), 99th percentile (dashed)",
    );
    let mut chart = log_x_chart(&root, title, (xmin..xmax, y), descs, Some(size_label))?;
    let mut curves = Vec::new();
    for (i, (name, median, p99)) in series.into_iter().enumerate() {
        curves.push(Curve {
            name: Some(name),
            points: median,
            dashed: false,
            color: i,
        });
        curves.push(Curve {
            name: None,
            points: p99,
            dashed: true,
            color: i,
        });
    }
    draw_curves(&mut chart, &curves)?;
    root.present()?;
    Ok(())
}

/// A chart over a log x axis and `Y`, drawn by a PNG backend.
type LogXChart<'b, 'a, Y> = ChartContext<'b, BitMapBackend<'a>, Cartesian2d<LogCoord<f64>, Y>>;

/// A white chart of `title` filling `root`, over `x` on a log scale and
/// `y`, its axes described, the x axis' labels by `x_label` where given.
fn log_x_chart<'b, 'a: 'b, Y>(
    root: &'b DrawingArea<BitMapBackend<'a>, Shift>,
    title: &str,
    (x, y): (std::ops::Range<f64>, Y),
    (x_desc, y_desc): (&str, &str),
    x_label: Option<fn(f64) -> String>,
) -> anyhow::Result<LogXChart<'b, 'a, Y::CoordDescType>>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x.log_scale(), y)?;
    let label = |x: &f64| match x_label {
        Some(f) => f(*x),
        None => <LogCoord<f64> as ValueFormatter<f64>>::format(x),
    };
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&label)
        .label_style(("sans-serif", 14))
        .draw()?;
    Ok(chart)
}

/// A size as an axis shows it: 8 B, 1.5 kB, 64 kB, 1 MB (powers of ten).
fn size_label(x: f64) -> String {
    let (v, unit) = if x >= 1e6 {
        (x / 1e6, "MB")
    } else if x >= 1e3 {
        (x / 1e3, "kB")
    } else {
        (x, "B")
    };
    if (v - v.round()).abs() < 0.05 {
        format!("{v:.0} {unit}")
    } else {
        format!("{v:.1} {unit}")
    }
}

/// A curve's points, (x, y).
type Points = Vec<(f64, f64)>;

/// One curve of a line chart.
struct Curve {
    /// Its name in the legend; `None`: it has none (a companion of the
    /// curve of its colour that has).
    name: Option<String>,
    points: Points,
    dashed: bool,
    /// Its colour, by index into the palette.
    color: usize,
}

/// Draws `curves` on `chart`, a dot on each point, and the legend.
fn draw_curves<'b, 'a: 'b, X, Y>(
    chart: &mut ChartContext<'b, BitMapBackend<'a>, Cartesian2d<X, Y>>,
    curves: &[Curve],
) -> anyhow::Result<()>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    for c in curves {
        let color = Palette99::pick(c.color).to_rgba();
        let pts = c.points.iter().copied();
        let drawn = if c.dashed {
            chart.draw_series(DashedLineSeries::new(pts, 8, 6, color.stroke_width(2)))?
        } else {
            chart.draw_series(LineSeries::new(pts, color.stroke_width(2)))?
        };
        if let Some(name) = &c.name {
            drawn.label(name.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
        chart.draw_series(c.points.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    Ok(())
}

/// One judged ratio for [`ratios_png`].
#[derive(Clone, Debug, PartialEq)]
pub struct RatioMark {
    /// What the ratio is of.
    pub label: String,
    /// Ours / theirs.
    pub ratio: f64,
    /// The lowest and the highest ratio of the runs behind it, if several.
    pub spread: Option<(f64, f64)>,
    /// Where the median of those runs' ratios lies, as far as they tell.
    pub interval: Option<(f64, f64)>,
    /// The target's limit.
    pub limit: f64,
    /// The ratio must stay at or below the limit (else at or above it).
    pub at_most: bool,
    /// Whether it does: `None` where the runs behind it cannot tell (its
    /// interval reaches across the target).
    pub met: Option<bool>,
}

/// The ratios a picture spans (log scale): what lies outside is drawn at
/// its edge with its value beside it.
pub const RATIO_SPAN: (f64, f64) = (0.5, 2.0);

/// Draws each ratio on its own line, first at the top, over ratios
/// [`RATIO_SPAN`] on a log scale: a dot (green where its target is met,
/// red where not, amber where the runs behind it cannot tell), a line
/// through it from the lowest to the highest ratio of those runs and a
/// thicker bar over where their median lies, its target as a black tick,
/// and parity (1.0) as a grey line.
pub fn ratios_png(path: &Path, title: &str, marks: &[RatioMark]) -> anyhow::Result<()> {
    anyhow::ensure!(!marks.is_empty(), "no ratio with a target to draw");
    register_font()?;
    let n = marks.len();
    let (lo, hi) = RATIO_SPAN;
    let clip = |x: f64| x.clamp(lo, hi);
    // Segment `n - 1 - i` holds mark `i`: the first mark on top.
    let at = |i: usize| SegmentValue::CenterOf(n - 1 - i);
    let height = 140 + 30 * u32::try_from(n.min(200)).unwrap_or(200);
    let root = BitMapBackend::new(path, (1200, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(520)
        .build_cartesian_2d(
            (lo..hi).log_scale().with_key_points(vec![
                0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 1.75, 2.0,
            ]),
            (0..n).into_segmented(),
        )?;
    let label = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(k) if *k < n => marks[n - 1 - k].label.clone(),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .x_desc(
            "ours / theirs (log scale): green met, red missed, amber a tie; line: its runs, \
             bar: their median's interval; tick: the target",
        )
        .x_label_formatter(&|x| format!("{x:.2}"))
        .y_labels(n)
        .y_label_formatter(&label)
        .disable_y_mesh()
        .label_style(("sans-serif", 13))
        .draw()?;
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(1.0, SegmentValue::Exact(0)), (1.0, SegmentValue::Last)],
        RGBColor(160, 160, 160).stroke_width(1),
    )))?;
    for (i, m) in marks.iter().enumerate() {
        let color = match m.met {
            Some(true) => RGBColor(0, 140, 60),
            Some(false) => RGBColor(200, 30, 30),
            None => RGBColor(215, 135, 0),
        };
        for (span, width) in [(m.spread, 2), (m.interval, 7)] {
            if let Some((a, b)) = span {
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(clip(a), at(i)), (clip(b), at(i))],
                    color.mix(0.55).stroke_width(width),
                )))?;
            }
        }
        let tick = EmptyElement::at((clip(m.limit), at(i)))
            + Rectangle::new([(-1, -11), (1, 11)], BLACK.filled());
        chart.draw_series(std::iter::once(tick))?;
        let dot = EmptyElement::at((clip(m.ratio), at(i))) + Circle::new((0, 0), 5, color.filled());
        chart.draw_series(std::iter::once(dot))?;
        // Beyond the span: the value, beside the dot at the edge.
        if m.ratio < lo || m.ratio > hi {
            let dx = if m.ratio > hi { -60 } else { 10 };
            let text = EmptyElement::at((clip(m.ratio), at(i)))
                + Text::new(format!("{:.2}", m.ratio), (dx, -16), ("sans-serif", 13));
            chart.draw_series(std::iter::once(text))?;
        }
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(label: &str, ratio: f64, met: Option<bool>) -> RatioMark {
        RatioMark {
            label: label.into(),
            ratio,
            spread: Some((ratio * 0.9, ratio * 1.1)),
            interval: Some((ratio * 0.95, ratio * 1.05)),
            limit: 1.0,
            at_most: true,
            met,
        }
    }

    #[test]
    fn sizes_are_labelled_in_bytes_kilobytes_and_megabytes() {
        let labels: Vec<String> = [8.0, 1000.0, 1500.0, 65536.0, 1e6, 4e6]
            .iter()
            .map(|&x| size_label(x))
            .collect();
        assert_eq!(labels, ["8 B", "1 kB", "1.5 kB", "65.5 kB", "1 MB", "4 MB"]);
    }

    fn lat(transport: &str, size: u64, median: f64, p99: f64) -> LatRow {
        LatRow {
            test: "PingPong".into(),
            transport: transport.into(),
            mode: "reliable".into(),
            completion: "poll".into(),
            size,
            iterations: 100,
            usec: crate::stats::Summary {
                min: median * 0.9,
                median,
                p99,
                mean: median,
            },
            mb_per_s_each_way: 0.0,
            mb_per_s_both: 0.0,
            cpu_initiator: 0.0,
            cpu_target: 0.0,
        }
    }

    #[test]
    fn latencies_are_drawn_as_a_png_and_rows_without_a_figure_are_left_out() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("lat.png");
        let rows = [
            lat("shm", 8, 0.2, 0.5),
            lat("shm", 1_000_000, 90.0, 140.0),
            lat("tcp", 8, 3.3, 9.0),
            lat("tcp", 1_000_000, 400.0, 700.0),
            // Of no bytes, and without a figure: not on a log scale.
            lat("tcp", 0, 3.0, 5.0),
            lat("udp", 64, 0.0, 0.0),
        ];
        latency_png(&p, "latency", &rows).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        assert!(bytes.len() > 1000, "{} bytes", bytes.len());
        // Nothing to draw: refused, and no file made.
        let none = d.path().join("none.png");
        assert!(latency_png(&none, "none", &rows[4..]).is_err());
        assert!(latency_png(&none, "none", &[]).is_err());
        assert!(!none.exists());
    }

    #[test]
    fn ratios_are_drawn_as_a_png_and_none_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("ratios.png");
        // One beyond the span on each side: drawn at its edges.
        let marks = [
            mark("shm 8 B", 0.96, Some(true)),
            mark("tcp 64 B", 1.11, Some(false)),
            mark("target CPU", 7.84, Some(false)),
            mark("put target CPU", 0.0, Some(true)),
        ];
        ratios_png(&p, "ratios", &marks).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        assert!(bytes.len() > 1000, "{} bytes", bytes.len());
        // Each verdict in its own colour: a tie is amber, and only a tie.
        let has = |p: &Path, rgb: [u8; 3]| {
            let img = image::open(p).unwrap().to_rgb8();
            img.pixels().any(|px| px.0 == rgb)
        };
        let (green, red, amber) = ([0, 140, 60], [200, 30, 30], [215, 135, 0]);
        assert!(has(&p, green) && has(&p, red) && !has(&p, amber));
        let tie = d.path().join("tie.png");
        ratios_png(&tie, "tie", &[mark("tcp 64 B", 1.0, None)]).unwrap();
        assert!(has(&tie, amber) && !has(&tie, green) && !has(&tie, red));
        assert!(ratios_png(&d.path().join("none.png"), "none", &[]).is_err());
        assert!(!d.path().join("none.png").exists());
    }
}
