//! Charts for the reports of `simulate` and `replay --report`, as SVG
//! files drawn with plotters.

use plotters::prelude::*;

/// One line of a chart: its name and its points.
pub(crate) struct Series {
    pub(crate) name: String,
    pub(crate) points: Vec<(f64, f64)>,
}

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
    let root = SVGBackend::with_string(svg, (720, 400)).into_drawing_area();
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
                s.points.iter().copied(),
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
