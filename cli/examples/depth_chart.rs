//! Draws decode tokens/s against the cache's depth, one line per KV type, kvcore beside
//! llama.cpp (BENCHMARKS.md shows the current one).
//!
//! Usage: `depth_chart RUN_DIR OUT.svg`, where RUN_DIR holds the JSON files that
//! `benches/kv_types_vs_llamacpp.sh` writes: arrays of rows from `kvcore bench --json`
//! and `benches/llamacpp_driver.py bench`. Every `tg` row is a point: its series is the
//! system and its KV setting (`kvcore f16 KV`, `llama.cpp q8_0 KV, FA`), its x the depth.
//! The repetitions of all the files' rows of one series and depth are pooled (kvcore's
//! runs A and B, before and after llama.cpp's): the line joins their medians and a
//! whisker spans their min–max.

use anyhow::{Context, bail};
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// One line: kvcore's or not, its name, and per depth `(depth, median, min, max)`.
type Line = (bool, String, Vec<(f64, f64, f64, f64)>);

/// The fields of a bench row this chart reads (both systems write them).
#[derive(Debug, serde::Deserialize)]
struct Row {
    backend: String,
    test: String,
    depth: usize,
    tok_s: Vec<f64>,
    #[serde(default)]
    kv_type: Option<String>,
    #[serde(default)]
    activations: Option<String>,
    #[serde(default)]
    sequences: Option<usize>,
    #[serde(default)]
    type_k: Option<String>,
    #[serde(default)]
    type_v: Option<String>,
    #[serde(default)]
    flash_attn: Option<bool>,
}

impl Row {
    /// `(is kvcore, series name)`.
    fn series(&self) -> (bool, String) {
        if self.backend == "llama.cpp" {
            let (k, v) = (self.type_k.as_deref(), self.type_v.as_deref());
            let kv = match (k, v) {
                (Some(k), Some(v)) if k != v => format!("{k}/{v}"),
                (Some(k), _) => k.to_string(),
                _ => "f16".to_string(),
            };
            let fa = if self.flash_attn == Some(true) {
                ", FA"
            } else {
                ""
            };
            (false, format!("llama.cpp {kv} KV{fa}"))
        } else {
            let kv = self.kv_type.as_deref().unwrap_or("f32");
            let acts = match self.activations.as_deref() {
                Some("q8") => ", q8 acts",
                _ => "",
            };
            (true, format!("kvcore {kv} KV{acts}"))
        }
    }
}

const KVCORE: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(23, 190, 207),
    RGBColor(148, 103, 189),
];
const LLAMA: [RGBColor; 4] = [
    RGBColor(255, 127, 14),
    RGBColor(214, 39, 40),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
];

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, out] = args.as_slice() else {
        bail!("usage: depth_chart RUN_DIR OUT.svg");
    };
    let (dir, out) = (PathBuf::from(dir), PathBuf::from(out));
    // series -> depth -> pooled tok/s
    let mut series: BTreeMap<(bool, String), BTreeMap<usize, Vec<f64>>> = BTreeMap::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    for file in &files {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let rows: Vec<Row> = serde_json::from_str(&text)
            .with_context(|| format!("{} is not an array of bench rows", file.display()))?;
        for row in rows {
            if !row.test.starts_with("tg") || row.sequences.unwrap_or(1) != 1 {
                continue;
            }
            series
                .entry(row.series())
                .or_default()
                .entry(row.depth)
                .or_default()
                .extend(&row.tok_s);
        }
    }
    if series.is_empty() {
        bail!("no decode (tg) rows in {}", dir.display());
    }
    // kvcore's lines first.
    let lines: Vec<Line> = series
        .into_iter()
        .rev()
        .map(|((kvcore, name), depths)| {
            let points = depths
                .into_iter()
                .map(|(d, mut v)| {
                    let (lo, hi) = (
                        v.iter().copied().fold(f64::INFINITY, f64::min),
                        v.iter().copied().fold(0.0, f64::max),
                    );
                    (d as f64, median(&mut v), lo, hi)
                })
                .collect();
            (kvcore, name, points)
        })
        .collect();
    let x_max = lines
        .iter()
        .flat_map(|l| l.2.iter().map(|p| p.0))
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.04;
    let y_max = lines
        .iter()
        .flat_map(|l| l.2.iter().map(|p| p.3))
        .fold(0.0, f64::max)
        * 1.1;

    let root = SVGBackend::new(&out, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Decode against depth (median of pooled runs, min–max)",
            ("sans-serif", 18),
        )
        .margin(14)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("positions in the cache before the decoded tokens")
        .y_desc("tokens/s, one token per step")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    let (mut ki, mut li) = (0, 0);
    for (kvcore, name, points) in &lines {
        let colour = if *kvcore {
            ki += 1;
            KVCORE[(ki - 1) % KVCORE.len()]
        } else {
            li += 1;
            LLAMA[(li - 1) % LLAMA.len()]
        };
        let style = colour.stroke_width(2);
        chart
            .draw_series(LineSeries::new(points.iter().map(|p| (p.0, p.1)), style))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart.draw_series(
            points
                .iter()
                .map(|p| PathElement::new(vec![(p.0, p.2), (p.0, p.3)], colour.stroke_width(1))),
        )?;
        if *kvcore {
            chart.draw_series(
                points
                    .iter()
                    .map(|p| Circle::new((p.0, p.1), 4, colour.filled())),
            )?;
        } else {
            chart.draw_series(
                points
                    .iter()
                    .map(|p| TriangleMarker::new((p.0, p.1), 5, colour.filled())),
            )?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .draw()?;
    root.present()?;
    println!("{}", out.display());
    Ok(())
}
