//! The SVG of `compare --svg`: one bar per variant for global-memory
//! traffic, and for the measured time where there is one (else arithmetic
//! intensity). plotters with its SVG backend only: text is written as SVG
//! text elements, so no font is read from the system.

use plotters::prelude::*;

use super::compare::Comparison;
use crate::error::{Error, Result};

/// Writes the plot of `cmp` to `path`.
pub fn write_svg(cmp: &Comparison, path: &std::path::Path) -> Result<()> {
    let svg = render(cmp)?;
    std::fs::write(path, svg)
        .map_err(|e| Error::Environment(format!("cannot write {}: {e}", path.display())))
}

/// The SVG text of the plot.
pub fn render(cmp: &Comparison) -> Result<String> {
    let mut svg = String::new();
    let labels: Vec<String> = (1..=cmp.rows.len()).map(|i| format!("#{i}")).collect();
    let mb: Vec<f64> = cmp
        .rows
        .iter()
        .map(|r| r.traffic.as_ref().map_or(0.0, |t| t.bytes() as f64 / 1e6))
        .collect();
    let (right, right_title): (Vec<f64>, String) = if cmp.target.is_some() {
        (
            cmp.rows.iter().map(|r| r.time_us.unwrap_or(0.0)).collect(),
            format!(
                "time (us), {}",
                cmp.device.clone().unwrap_or_else(|| "not measured".into())
            ),
        )
    } else {
        (
            cmp.rows
                .iter()
                .map(|r| r.intensity().unwrap_or(0.0))
                .collect(),
            "arithmetic intensity (flop/byte)".into(),
        )
    };
    {
        let width = (480 + 60 * cmp.rows.len() as u32).min(1800);
        let legend_height = 18 * cmp.rows.len() as u32 + 16;
        let root =
            SVGBackend::with_string(&mut svg, (width, 420 + legend_height)).into_drawing_area();
        let fail = |e: &dyn std::fmt::Display| Error::Internal(format!("plotting: {e}"));
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let root = root
            .titled(
                &format!("polyfuse compare: {}", cmp.program),
                ("sans-serif", 18),
            )
            .map_err(|e| fail(&e))?;
        let (charts, legend_area) = root.split_vertically(400);
        let (left_area, right_area) = charts.split_horizontally(width / 2);
        bars(
            &left_area,
            "global memory traffic (MB)",
            &labels,
            &mb,
            &BLUE,
        )
        .map_err(|e| fail(&e))?;
        bars(&right_area, &right_title, &labels, &right, &RED).map_err(|e| fail(&e))?;
        for (i, r) in cmp.rows.iter().enumerate() {
            let text = match &r.error {
                Some(e) => format!(
                    "#{} {}: {}",
                    i + 1,
                    r.variant.label(),
                    e.lines().next().unwrap_or("")
                ),
                None => format!("#{} {}", i + 1, r.variant.label()),
            };
            legend_area
                .draw(&Text::new(
                    text,
                    (16, 4 + 18 * i as i32),
                    ("sans-serif", 13).into_font().color(&BLACK),
                ))
                .map_err(|e| fail(&e))?;
        }
        root.present().map_err(|e| fail(&e))?;
    }
    Ok(svg)
}

fn bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    labels: &[String],
    values: &[f64],
    color: &RGBColor,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let top = values.iter().copied().fold(0.0f64, f64::max).max(1e-9) * 1.15;
    let n = values.len().max(1) as u32;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 14))
        .margin(12)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d(
            (0u32..n.saturating_sub(1).max(1)).into_segmented(),
            0f64..top,
        )?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .draw()?;
    chart.draw_series(values.iter().enumerate().map(|(i, v)| {
        let i = i as u32;
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(i), 0.0),
                (SegmentValue::Exact(i + 1), *v),
            ],
            color.mix(0.7).filled(),
        );
        bar.set_margin(0, 0, 6, 6);
        bar
    }))?;
    Ok(())
}
