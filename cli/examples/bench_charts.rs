//! Draws the end-to-end benchmark charts of BENCHMARKS.md as SVG files.
//!
//! Usage: `bench_charts RESULTS.json OUT_DIR [MODEL.gguf]`, where RESULTS.json is the
//! `charts.json` that `benches/compare_llamacpp.sh` writes and MODEL defaults to the
//! cached SmolLM2 (`$KVCORE_MODEL` first).
//!
//! - `kv_memory.svg`: left, `KvStore::bytes()` of a [`GrowKv`] and a [`DenseKv`] of the
//!   model's geometry (`n_layers`, `kv_dim`, trained context) against the number of
//!   positions appended, computed by appending one position at a time to the real stores
//!   (log–log axes, so GrowKv's doublings are evenly spaced steps); right, the measured
//!   peak RSS of a 16-token chat (medians, with min–max whiskers) from the JSON.
//! - `decode_speed.svg`: decode (token generation) and prefill throughput per backend
//!   and thread count beside llama.cpp, medians with min–max whiskers, from the JSON.
//!
//! The JSON holds three lists of bars, `chat_peak_rss_mib`, `decode_tok_s` and
//! `prefill_tok_s`, each bar `{ "label", "system", "median", "min", "max" }`; `system`
//! (`"kvcore"` or anything else) picks the bar colour.

use anyhow::{Context, bail};
use kvcore::gguf::GgufFile;
use kvcore::model::LlamaConfig;
use kvcore::ndarray::Array2;
use kvcore::{Append, DenseKv, GrowKv, KvStore};
use kvcore_fetch as fetch;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};

const MIB: f64 = 1024.0 * 1024.0;
const KVCORE_COLOUR: RGBColor = RGBColor(31, 119, 180);
const OTHER_COLOUR: RGBColor = RGBColor(255, 127, 14);
const DENSE_COLOUR: RGBColor = RGBColor(214, 39, 40);

/// One bar: a median with its spread over the runs.
#[derive(Debug, serde::Deserialize)]
struct Bar {
    label: String,
    system: String,
    median: f64,
    min: f64,
    max: f64,
}

/// The measured side of the charts (`charts.json`).
#[derive(Debug, serde::Deserialize)]
struct Results {
    chat_peak_rss_mib: Vec<Bar>,
    decode_tok_s: Vec<Bar>,
    prefill_tok_s: Vec<Bar>,
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (results, out_dir, model) = match args.as_slice() {
        [r, o] => (PathBuf::from(r), PathBuf::from(o), fetch::smollm2_path()?),
        [r, o, m] => (PathBuf::from(r), PathBuf::from(o), PathBuf::from(m)),
        _ => bail!("usage: bench_charts RESULTS.json OUT_DIR [MODEL.gguf]"),
    };
    let text = std::fs::read_to_string(&results)
        .with_context(|| format!("cannot read {}", results.display()))?;
    let results: Results = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a charts.json", results.display()))?;
    let file =
        GgufFile::open(&model).with_context(|| format!("cannot load model {}", model.display()))?;
    let config = LlamaConfig::from_gguf(&file)?;
    std::fs::create_dir_all(&out_dir)?;

    let kv_path = out_dir.join("kv_memory.svg");
    kv_memory_chart(&kv_path, &config, &results.chat_peak_rss_mib)?;
    let speed_path = out_dir.join("decode_speed.svg");
    speed_chart(&speed_path, &results.decode_tok_s, &results.prefill_tok_s)?;
    println!("{}\n{}", kv_path.display(), speed_path.display());
    Ok(())
}

/// `(positions appended, bytes())` after each append of one position (K and V rows of
/// every layer) to `kv`, keeping only the first and last point of each flat run.
fn bytes_curve<K: KvStore>(mut kv: K) -> anyhow::Result<Vec<(f64, f64)>> {
    let mut points: Vec<(f64, f64)> = Vec::new();
    let g = kv.geometry();
    let row = Array2::<f32>::zeros((1, g.kv_dim())); // [1, kv_dim]
    for pos in 0..kv.max_ctx() {
        let mut tx = Append::begin(&mut kv, pos, 1)?;
        for layer in 0..g.n_layers {
            tx.write(layer, row.view(), row.view())?;
        }
        tx.commit()?;
        let point = ((pos + 1) as f64, kv.bytes() as f64 / MIB);
        // Drop the middle of a flat run: the step's corners are all a line needs.
        if let [.., a, b] = points.as_slice()
            && a.1 == point.1
            && b.1 == point.1
        {
            points.pop();
        }
        points.push(point);
    }
    Ok(points)
}

fn kv_memory_chart(path: &Path, c: &LlamaConfig, rss: &[Bar]) -> anyhow::Result<()> {
    let ctx = c.context_len;
    let grow = bytes_curve(GrowKv::new(c.kv_geometry(), ctx)?)?;
    let dense = bytes_curve(DenseKv::new(c.kv_geometry(), ctx)?)?;
    let root = SVGBackend::new(path, (1200, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(660);

    let y_min = grow.first().map_or(1.0, |p| p.1) / 2.0;
    let y_max = dense.iter().map(|p| p.1).fold(0.0, f64::max) * 2.0;
    let mut chart = ChartBuilder::on(&left)
        .caption(
            format!(
                "KV store bytes vs positions ({} layers, kv_dim {}, max_ctx {ctx})",
                c.n_layers,
                c.kv_dim()
            ),
            ("sans-serif", 17),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(65)
        .build_cartesian_2d((1.0..ctx as f64).log_scale(), (y_min..y_max).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("positions appended (log)")
        .y_desc("KvStore::bytes() in MiB (log)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.1}"))
        .draw()?;
    // Dense first, so GrowKv's last step (to the full size) is drawn over it.
    for (name, points, colour) in [
        ("DenseKv::new (preallocated)", dense, DENSE_COLOUR),
        ("GrowKv::new (grows on demand)", grow, KVCORE_COLOUR),
    ] {
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .draw()?;

    bar_panel(
        &right,
        "Peak RSS of a 16-token chat (median, min–max)",
        "MiB",
        rss,
    )?;
    root.present()?;
    Ok(())
}

fn speed_chart(path: &Path, decode: &[Bar], prefill: &[Bar]) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, (1200, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(600);
    bar_panel(
        &left,
        "Decode (median, min–max)",
        "tokens/s, one token per step",
        decode,
    )?;
    bar_panel(
        &right,
        "Prefill (median, min–max)",
        "tokens/s, whole prompt per pass",
        prefill,
    )?;
    root.present()?;
    Ok(())
}

/// Horizontal bars, first bar on top, each with a min–max whisker and its median as text.
fn bar_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    unit: &str,
    bars: &[Bar],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    if bars.is_empty() {
        bail!("no bars for the panel {title:?}");
    }
    let n = bars.len();
    let x_max = bars.iter().map(|b| b.max.max(b.median)).fold(0.0, f64::max) * 1.25;
    // Segment i (from the bottom) holds bar n - 1 - i, so the list reads top to bottom.
    let at = |i: usize| SegmentValue::CenterOf(n - 1 - i);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(190)
        // An integer range's segments include its end, so `0..n - 1` gives n segments.
        .build_cartesian_2d(0.0..x_max, (0..n - 1).into_segmented())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc(unit)
        .y_labels(n)
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) if *i < n => {
                bars[n - 1 - i].label.clone()
            }
            _ => String::new(),
        })
        .draw()?;
    let colour = |b: &Bar| {
        if b.system == "kvcore" {
            KVCORE_COLOUR
        } else {
            OTHER_COLOUR
        }
    };
    chart.draw_series(
        Histogram::horizontal(&chart)
            .margin(6)
            .style_func(|v, _| match v {
                SegmentValue::Exact(i) | SegmentValue::CenterOf(i) if *i < n => {
                    colour(&bars[n - 1 - i]).filled()
                }
                _ => BLACK.filled(),
            })
            .data(bars.iter().enumerate().map(|(i, b)| (n - 1 - i, b.median))),
    )?;
    chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
        PathElement::new(vec![(b.min, at(i)), (b.max, at(i))], BLACK.stroke_width(2))
    }))?;
    chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
        Text::new(
            format!("{:.1}", b.median),
            (b.max.max(b.median) + x_max * 0.01, at(i)),
            ("sans-serif", 13),
        )
    }))?;
    Ok(())
}
