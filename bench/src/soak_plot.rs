//! SOAK's intervals drawn as an SVG by hand: four small panels over the soak's
//! minutes (RSS, disk, p99, throughput), each with its axes, ticks and a legend.

use serde_json::Value;
use std::fmt::Write;
use std::path::Path;

const PANEL_W: f64 = 380.0;
const PANEL_H: f64 = 230.0;
/// Margins inside a panel: left (y labels), right, top (title), bottom (x labels).
const ML: f64 = 58.0;
const MR: f64 = 14.0;
const MT: f64 = 30.0;
const MB: f64 = 38.0;
const COLORS: [&str; 2] = ["#1f6fb4", "#d9622b"];

/// One curve: its name and a value per row.
struct Series {
    name: &'static str,
    values: Vec<f64>,
}

/// A step of 1, 2 or 5 x 10^k, about a fifth of `max`.
fn nice_step(max: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let raw = max / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let n = raw / mag;
    mag * if n <= 1.0 {
        1.0
    } else if n <= 2.0 {
        2.0
    } else if n <= 5.0 {
        5.0
    } else {
        10.0
    }
}

fn label(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 1000.0 && v % 1000.0 != 0.0 {
        format!("{:.1}k", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// One panel at (`x0`, `y0`): `title`, the x axis in minutes `xs`, the curves.
fn panel(
    svg: &mut String,
    x0: f64,
    y0: f64,
    title: &str,
    unit: &str,
    xs: &[f64],
    series: &[Series],
) {
    let (w, h) = (PANEL_W - ML - MR, PANEL_H - MT - MB);
    let (left, top) = (x0 + ML, y0 + MT);
    let xmax = xs.iter().copied().fold(0.0, f64::max).max(1e-9);
    let ymax_data = series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .fold(0.0, f64::max);
    let ystep = nice_step(ymax_data * 1.05);
    let ymax = (ymax_data * 1.05 / ystep).ceil().max(1.0) * ystep;
    let xstep = nice_step(xmax);
    let px = |x: f64| left + x / xmax * w;
    let py = |y: f64| top + h - y / ymax * h;
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="13" font-weight="bold">{title}</text>"#,
        x0 + ML,
        y0 + 18.0
    );
    // Grid and y ticks.
    let mut y = 0.0;
    while y <= ymax + ystep * 1e-6 {
        let yy = py(y);
        let _ = writeln!(
            svg,
            r##"<line x1="{left:.1}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" font-size="10" text-anchor="end">{}</text>"##,
            left + w,
            left - 5.0,
            yy + 3.5,
            label(y)
        );
        y += ystep;
    }
    // x ticks.
    let mut x = 0.0;
    while x <= xmax + xstep * 1e-6 {
        let xx = px(x);
        let _ = writeln!(
            svg,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#444"/><text x="{xx:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"##,
            top + h,
            top + h + 4.0,
            top + h + 15.0,
            label(x)
        );
        x += xstep;
    }
    // Axes and their labels.
    let _ = writeln!(
        svg,
        r##"<polyline points="{left:.1},{top:.1} {left:.1},{:.1} {:.1},{:.1}" fill="none" stroke="#444"/>"##,
        top + h,
        left + w,
        top + h
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">minute</text>"#,
        left + w / 2.0,
        top + h + 30.0
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate({:.1},{:.1}) rotate(-90)" font-size="10" text-anchor="middle">{unit}</text>"#,
        x0 + 12.0,
        top + h / 2.0
    );
    // The curves, with a legend at the top right.
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = xs
            .iter()
            .zip(&s.values)
            .map(|(x, y)| format!("{:.1},{:.1}", px(*x), py(*y)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="1.8"/>"#,
            pts.join(" ")
        );
        for p in &pts {
            let (cx, cy) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(
                svg,
                r#"<circle cx="{cx}" cy="{cy}" r="2.2" fill="{color}"/>"#
            );
        }
        let lx = x0 + PANEL_W - MR - 130.0;
        let ly = y0 + 12.0 + i as f64 * 13.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"/><text x="{:.1}" y="{:.1}" font-size="10">{}</text>"#,
            lx + 16.0,
            lx + 20.0,
            ly + 3.5,
            s.name
        );
    }
}

/// Draws the soak's interval rows into `path`.
pub(crate) fn write(path: &Path, rows: &[Value]) -> anyhow::Result<()> {
    let col = |k: &str, scale: f64| -> Vec<f64> {
        rows.iter()
            .map(|r| r[k].as_f64().unwrap_or(0.0) * scale)
            .collect()
    };
    let mib = 1.0 / (1u64 << 20) as f64;
    let xs = col("minute", 1.0);
    let (cols, rows_n) = (2.0, 2.0);
    let (width, height) = (PANEL_W * cols, PANEL_H * rows_n + 24.0);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" viewBox="0 0 {width:.0} {height:.0}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        svg,
        r##"<rect width="100%" height="100%" fill="#ffffff"/><text x="10" y="16" font-size="12">kiln serve under SOAK (YCSB A + index query, changes feed, subscription, backups, attachments), one point per interval</text>"##
    );
    let panels: [(&str, &str, Vec<Series>); 4] = [
        (
            "Server memory",
            "MiB",
            vec![
                Series {
                    name: "RSS",
                    values: col("rss_bytes", mib),
                },
                Series {
                    name: "RSS anonymous",
                    values: col("rss_anon_bytes", mib),
                },
            ],
        ),
        (
            "Disk",
            "MiB",
            vec![
                Series {
                    name: "data directory",
                    values: col("disk_bytes", mib),
                },
                Series {
                    name: "data file",
                    values: col("data_file_bytes", mib),
                },
            ],
        ),
        (
            "p99 latency",
            "ms",
            vec![
                Series {
                    name: "YCSB A op",
                    values: col("p99_us", 1e-3),
                },
                Series {
                    name: "index query",
                    values: col("query_p99_us", 1e-3),
                },
            ],
        ),
        (
            "Throughput",
            "YCSB ops/s",
            vec![Series {
                name: "YCSB A",
                values: col("ops_per_sec", 1.0),
            }],
        ),
    ];
    for (i, (title, unit, series)) in panels.iter().enumerate() {
        let x0 = (i % 2) as f64 * PANEL_W;
        let y0 = 24.0 + (i / 2) as f64 * PANEL_H;
        panel(&mut svg, x0, y0, title, unit, &xs, series);
    }
    svg.push_str("</svg>\n");
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, svg)?;
    Ok(())
}
