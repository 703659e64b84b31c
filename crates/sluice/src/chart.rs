//! Charts for the reports of `simulate` and `replay --report`, as SVG
//! files drawn with plotters.

use plotters::prelude::*;

/// One line of a chart: its name and its points.
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) points: Vec<(f64, f64)>,
}

/// The chart's size in pixels.
const SIZE: (u32, u32) = (720, 400);

/// The most points a line is drawn with: the lowest and the highest point
/// in each of as many columns as the chart is pixels wide, which draws the
/// same line as every point would. So a chart's size grows with its lines,
/// never with the points behind them.
pub(crate) const MOST_POINTS: usize = 2 * SIZE.0 as usize;

/// The colours of the series, in order: distinct, and readable on white.
const COLOURS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

/// Draws `series` as lines on one chart: an SVG document.
pub(crate) fn lines(
    title: &str,
    (x_label, y_label): (&str, &str),
    series: &[Series],
) -> anyhow::Result<String> {
    let mut svg = String::new();
    draw(&mut svg, title, (x_label, y_label), series)
        .map_err(|e| anyhow::anyhow!("cannot draw the chart {title:?}: {e}"))?;
    Ok(svg)
}

fn draw(
    svg: &mut String,
    title: &str,
    (x_label, y_label): (&str, &str),
    series: &[Series],
) -> Result<(), Box<dyn std::error::Error>> {
    // The x axis spans the points, wherever they start; the y axis
    // includes 0.
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x_min, mut x_max) = (f64::INFINITY, f64::NEG_INFINITY);
    let (mut y_max, mut y_min) = (1.0f64, 0.0f64);
    for &(x, y) in all {
        x_min = x_min.min(x);
        x_max = x_max.max(x);
        y_max = y_max.max(y);
        y_min = y_min.min(y);
    }
    if x_min > x_max {
        (x_min, x_max) = (0.0, 1.0);
    }
    let x_pad = ((x_max - x_min) * 0.02).max(1e-9);
    let root = SVGBackend::with_string(svg, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x_min..x_max + x_pad, y_min..y_max * 1.1)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .light_line_style(WHITE)
        .draw()?;
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                thinned(&s.points, (x_min, x_max)),
                colour.stroke_width(2),
            ))?
            .label(s.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
    }
    let (x_range, y_range) = ((x_min, x_max), (y_min, y_max * 1.1));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.3))
        .position(emptiest_corner(series, x_range, y_range))
        .draw()?;
    root.present()?;
    Ok(())
}

/// `points` as a line across `x_range` draws them, in at most
/// [`MOST_POINTS`]: in each of `MOST_POINTS / 2` columns of equal width, the
/// lowest and the highest point, in the order of their `x`. Fewer points
/// are kept as they are.
fn thinned(points: &[(f64, f64)], (x_min, x_max): (f64, f64)) -> Vec<(f64, f64)> {
    if points.len() <= MOST_POINTS {
        return points.to_vec();
    }
    let columns = MOST_POINTS / 2;
    let width = (x_max - x_min).max(f64::MIN_POSITIVE) / columns as f64;
    // Each column's lowest and highest point.
    type Extremes = ((f64, f64), (f64, f64));
    let mut extremes: Vec<Option<Extremes>> = vec![None; columns];
    for &(x, y) in points {
        // A NaN or an x out of range lands in the first or last column.
        let column = (((x - x_min) / width) as usize).min(columns - 1);
        let e = extremes[column].get_or_insert(((x, y), (x, y)));
        if y < e.0.1 {
            e.0 = (x, y);
        }
        if y > e.1.1 {
            e.1 = (x, y);
        }
    }
    extremes
        .into_iter()
        .flatten()
        .flat_map(|(low, high)| {
            if low == high {
                vec![low]
            } else if low.0 <= high.0 {
                vec![low, high]
            } else {
                vec![high, low]
            }
        })
        .collect()
}

/// The corner of the plot where the legend hides the fewest points: the
/// one with the fewest in its quarter-wide, third-high box.
fn emptiest_corner(
    series: &[Series],
    (x_min, x_max): (f64, f64),
    (y_min, y_max): (f64, f64),
) -> SeriesLabelPosition {
    let (w, h) = ((x_max - x_min).max(1e-12), (y_max - y_min).max(1e-12));
    let in_corner = |right: bool, top: bool| {
        series
            .iter()
            .flat_map(|s| &s.points)
            .filter(|&&(x, y)| {
                let (fx, fy) = ((x - x_min) / w, (y - y_min) / h);
                (if right { fx >= 0.7 } else { fx <= 0.3 })
                    && (if top { fy >= 0.6 } else { fy <= 0.4 })
            })
            .count()
    };
    // Ties go to the first: the upper right, where readers look first.
    [
        (true, true, SeriesLabelPosition::UpperRight),
        (false, true, SeriesLabelPosition::UpperLeft),
        (true, false, SeriesLabelPosition::LowerRight),
        (false, false, SeriesLabelPosition::LowerLeft),
    ]
    .into_iter()
    .min_by_key(|&(right, top, _)| in_corner(right, top))
    .map_or(SeriesLabelPosition::UpperRight, |(_, _, p)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The most bytes an SVG of four lines takes, whatever their points:
    /// what `simulate` draws. Measured at 70 KiB with four lines of two
    /// million points each, every one of them noise.
    const MOST_SVG_BYTES: usize = 96 << 10;

    #[test]
    fn a_chart_of_millions_of_points_stays_small_and_keeps_each_columns_extremes() {
        let noise = |seed: u64| {
            let mut rng = fastrand::Rng::with_seed(seed);
            (0..2_000_000)
                .map(|i| (f64::from(i) / 1000.0, rng.f64() * 1e6))
                .collect::<Vec<_>>()
        };
        let lines: Vec<Series> = (0..4)
            .map(|i| Series {
                name: format!("line {i}"),
                points: noise(i),
            })
            .collect();
        let svg = super::lines("noise", ("x", "y"), &lines).unwrap();
        assert!(
            svg.len() <= MOST_SVG_BYTES,
            "{} bytes, more than {MOST_SVG_BYTES}",
            svg.len()
        );
        let kept = thinned(&lines[0].points, (0.0, 1999.999));
        assert!(kept.len() <= MOST_POINTS, "{} points", kept.len());
        assert!(kept.windows(2).all(|w| w[0].0 <= w[1].0), "out of order");
        // The highest and the lowest point of all are drawn.
        let (low, high) = lines[0].points.iter().fold(
            ((0.0, f64::INFINITY), (0.0, f64::NEG_INFINITY)),
            |(lo, hi), &p| {
                (
                    if p.1 < lo.1 { p } else { lo },
                    if p.1 > hi.1 { p } else { hi },
                )
            },
        );
        assert!(kept.contains(&low) && kept.contains(&high));
    }

    #[test]
    fn a_line_of_few_points_is_drawn_as_it_is() {
        let points: Vec<(f64, f64)> = (0..MOST_POINTS).map(|i| (i as f64, 1.0)).collect();
        assert_eq!(thinned(&points, (0.0, MOST_POINTS as f64)), points);
    }

    #[test]
    fn the_legend_goes_where_no_line_runs() {
        let rising = Series {
            name: "rising".into(),
            points: (0..=100).map(|i| (f64::from(i), f64::from(i))).collect(),
        };
        // A line from the lower left to the upper right leaves the other
        // two corners; the upper left comes first.
        let corner = emptiest_corner(&[rising], (0.0, 100.0), (0.0, 100.0));
        assert!(matches!(corner, SeriesLabelPosition::UpperLeft));
        let flat_high = Series {
            name: "high".into(),
            points: (0..=100).map(|i| (f64::from(i), 95.0)).collect(),
        };
        let corner = emptiest_corner(&[flat_high], (0.0, 100.0), (0.0, 100.0));
        assert!(matches!(corner, SeriesLabelPosition::LowerRight));
    }
}
