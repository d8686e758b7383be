//! The run as a picture: a hand-written SVG (no dependency) with two
//! charts, latency by percentile (HdrHistogram's "nines" x axis, log y) and
//! throughput over time.

use crate::stats::Tick;
use hdrhistogram::Histogram;
use std::fmt::Write;

const W: f64 = 900.0;
const H: f64 = 760.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 30.0;
const PLOT_W: f64 = W - LEFT - RIGHT;
const COLORS: [&str; 4] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"];

/// One latency curve: (percentile in `[0, 100)`, latency in ms) points.
pub struct Curve {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Percentile curve of a histogram in nanoseconds, in milliseconds.
pub fn curve(label: &str, h: &Histogram<u64>) -> Curve {
    let mut points = Vec::new();
    if !h.is_empty() {
        // 0 to 99.999% in steps even on the nines scale.
        for i in 0..=250 {
            let nines = f64::from(i) / 50.0; // 0..5
            let q = 1.0 - 10f64.powf(-nines);
            points.push((q * 100.0, h.value_at_quantile(q) as f64 / 1e6));
        }
    }
    Curve { label: label.to_string(), points }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn nines(pct: f64) -> f64 {
    -(1.0 - pct / 100.0).max(1e-7).log10()
}

/// The SVG document.
pub fn svg(title: &str, curves: &[Curve], ticks: &[Tick]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(s, r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#, W / 2.0, esc(title));
    latency_chart(&mut s, curves, 50.0, 300.0);
    throughput_chart(&mut s, ticks, 430.0, 280.0);
    s.push_str("</svg>\n");
    s
}

fn latency_chart(s: &mut String, curves: &[Curve], top: f64, height: f64) {
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">latency by percentile (ms, log scale)</text>"#,
        W / 2.0,
        top - 8.0
    );
    let all: Vec<f64> = curves.iter().flat_map(|c| c.points.iter().map(|p| p.1)).filter(|v| *v > 0.0).collect();
    let (lo, hi) = if all.is_empty() {
        (0.01, 1.0)
    } else {
        let min = all.iter().cloned().fold(f64::MAX, f64::min);
        let max = all.iter().cloned().fold(0.0, f64::max);
        (10f64.powf(min.log10().floor()), 10f64.powf(max.log10().ceil().max(min.log10().floor() + 1.0)))
    };
    let x_of = |pct: f64| LEFT + nines(pct) / 5.0 * PLOT_W;
    let y_of = |ms: f64| top + height - (ms.max(lo).log10() - lo.log10()) / (hi.log10() - lo.log10()) * height;
    frame(s, top, height);
    for (i, label) in ["0%", "90%", "99%", "99.9%", "99.99%", "99.999%"].iter().enumerate() {
        let x = LEFT + i as f64 / 5.0 * PLOT_W;
        grid_v(s, x, top, height, label);
    }
    let mut decade = lo;
    while decade <= hi * 1.0001 {
        grid_h(s, y_of(decade), &format_ms(decade));
        decade *= 10.0;
    }
    for (i, c) in curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = c.points.iter().map(|(p, v)| format!("{:.1},{:.1}", x_of(*p), y_of(*v))).collect();
        if !pts.is_empty() {
            let _ =
                writeln!(s, r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#, pts.join(" "));
        }
        legend(s, i, top, color, &c.label);
    }
}

fn throughput_chart(s: &mut String, ticks: &[Tick], top: f64, height: f64) {
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">throughput over time (msg/s; shaded: warm-up)</text>"#,
        W / 2.0,
        top - 8.0
    );
    frame(s, top, height);
    // Axes end on a round value, gridlines at round steps (1, 2, 2.5 or 5
    // times a power of ten), so a reader can read values off the chart.
    let t_step = nice_step(ticks.iter().map(|t| t.t_s).fold(1.0, f64::max) / 5.0);
    let t_max = axis_end(ticks.iter().map(|t| t.t_s).fold(1.0, f64::max), t_step);
    let v_step =
        nice_step(ticks.iter().map(|t| t.produce_msgs_per_s.max(t.consume_msgs_per_s)).fold(1.0, f64::max) / 4.0);
    let v_max = axis_end(
        ticks.iter().map(|t| t.produce_msgs_per_s.max(t.consume_msgs_per_s)).fold(1.0, f64::max) * 1.05,
        v_step,
    );
    let x_of = |t: f64| LEFT + t / t_max * PLOT_W;
    let y_of = |v: f64| top + height - v / v_max * height;
    if let Some(first_measured) = ticks.iter().position(|t| t.measuring) {
        if first_measured > 0 {
            let x = x_of(ticks[first_measured - 1].t_s);
            let _ = writeln!(
                s,
                r##"<rect x="{LEFT}" y="{top}" width="{:.1}" height="{height}" fill="#eeeeee"/>"##,
                x - LEFT
            );
        }
    }
    for t in steps(t_max, t_step) {
        grid_v(s, x_of(t), top, height, &format!("{} s", trim_float(t)));
    }
    for v in steps(v_max, v_step) {
        grid_h(s, y_of(v), &format_count(v));
    }
    type Series = (&'static str, fn(&Tick) -> f64);
    let series: [Series; 2] = [("produce", |t| t.produce_msgs_per_s), ("consume", |t| t.consume_msgs_per_s)];
    for (i, (label, f)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<String> = ticks.iter().map(|t| format!("{:.1},{:.1}", x_of(t.t_s), y_of(f(t)))).collect();
        if !pts.is_empty() {
            let _ =
                writeln!(s, r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#, pts.join(" "));
        }
        legend(s, i, top, color, label);
    }
}

fn frame(s: &mut String, top: f64, height: f64) {
    let _ =
        writeln!(s, r#"<rect x="{LEFT}" y="{top}" width="{PLOT_W}" height="{height}" fill="none" stroke="black"/>"#);
}

fn grid_v(s: &mut String, x: f64, top: f64, height: f64, label: &str) {
    let _ = writeln!(s, r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{}" stroke="#dddddd"/>"##, top + height);
    let _ = writeln!(s, r#"<text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#, top + height + 16.0, esc(label));
}

fn grid_h(s: &mut String, y: f64, label: &str) {
    let _ = writeln!(s, r##"<line x1="{LEFT}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#dddddd"/>"##, LEFT + PLOT_W);
    let _ = writeln!(s, r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#, LEFT - 6.0, y + 4.0, esc(label));
}

fn legend(s: &mut String, i: usize, top: f64, color: &str, label: &str) {
    let y = top + 16.0 + i as f64 * 16.0;
    let x = LEFT + 12.0;
    let _ = writeln!(s, r#"<rect x="{x}" y="{}" width="12" height="3" fill="{color}"/>"#, y - 4.0);
    let _ = writeln!(s, r#"<text x="{}" y="{y}">{}</text>"#, x + 18.0, esc(label));
}

fn format_ms(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        let digits = (-v.log10()).ceil() as usize;
        format!("{v:.digits$}")
    }
}

fn format_count(v: f64) -> String {
    if v >= 1e6 {
        format!("{}M", trim_float(v / 1e6))
    } else if v >= 1e3 {
        format!("{}k", trim_float(v / 1e3))
    } else {
        trim_float(v)
    }
}

/// Up to two decimals, without trailing zeros: 2.5, 250, 1.25.
fn trim_float(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The smallest of 1, 2, 2.5, 5 and 10 times a power of ten that is at
/// least `raw` (a positive, finite step; 1 otherwise).
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let pow = 10f64.powf(raw.log10().floor());
    let m = [1.0, 2.0, 2.5, 5.0, 10.0].into_iter().find(|m| m * pow >= raw * (1.0 - 1e-9)).unwrap_or(10.0);
    m * pow
}

/// `max` rounded up to a whole number of `step`s (at least one).
fn axis_end(max: f64, step: f64) -> f64 {
    (max / step - 1e-9).ceil().max(1.0) * step
}

/// 0, step, 2 step, ... up to `end` (a whole number of steps).
fn steps(end: f64, step: f64) -> impl Iterator<Item = f64> {
    let n = (end / step).round() as u32;
    (0..=n).map(move |i| f64::from(i) * step)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_take_round_steps() {
        assert_eq!(nice_step(117_000.0), 200_000.0);
        assert_eq!(nice_step(1.6), 2.0);
        assert_eq!(nice_step(2.2), 2.5);
        assert_eq!(nice_step(3.0), 5.0);
        assert_eq!(nice_step(6.0), 10.0);
        assert_eq!(nice_step(10.0), 10.0);
        assert_eq!(nice_step(0.0), 1.0);
        assert_eq!(axis_end(587_000.0, 200_000.0), 600_000.0);
        assert_eq!(axis_end(8.0, 2.0), 8.0);
        assert_eq!(steps(600_000.0, 200_000.0).map(format_count).collect::<Vec<_>>(), ["0", "200k", "400k", "600k"]);
        assert_eq!(format_count(2_500_000.0), "2.5M");
        assert_eq!(trim_float(32.0), "32");
    }

    #[test]
    fn svg_is_well_formed_enough() {
        let mut h = crate::stats::new_histogram();
        for v in 1..1000u64 {
            h.record(v * 1000).unwrap();
        }
        let ticks = vec![
            Tick { t_s: 1.0, produce_msgs_per_s: 10.0, ..Tick::default() },
            Tick { t_s: 2.0, measuring: true, produce_msgs_per_s: 20.0, consume_msgs_per_s: 19.0, ..Tick::default() },
        ];
        let doc = svg("a <b> & c", &[curve("publish", &h), curve("e2e", &crate::stats::new_histogram())], &ticks);
        assert!(doc.starts_with("<svg") && doc.trim_end().ends_with("</svg>"));
        assert_eq!(doc.matches("<polyline").count(), 3, "two throughput series and one non-empty latency curve");
        assert!(doc.contains("a &lt;b&gt; &amp; c"));
        assert!(!doc.contains("NaN") && !doc.contains("inf"));
    }
}
