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
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x_max, mut y_max, mut y_min) = (1.0f64, 1.0f64, 0.0f64);
    for &(x, y) in all {
        x_max = x_max.max(x);
        y_max = y_max.max(y);
        y_min = y_min.min(y);
    }
    let root = SVGBackend::with_string(svg, (720, 400)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max * 1.02, y_min..y_max * 1.1)?;
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
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.3))
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}
