//! An SVG chart of a simulation report: hit ratio per policy (with the infinite-cache bound),
//! TTFT per policy (mean and p99), and the largest prefill backlog over time per policy.
//!
//! Hand-written SVG: three simple panels do not justify a plotting dependency, and the file
//! opens in any browser.

use std::fmt::Write as _;

use super::report::SimReport;

const COLORS: [&str; 6] = [
    "#8c8c8c", "#e6a532", "#4c9be8", "#9b59b6", "#d62728", "#2ca02c",
];
const W: f64 = 900.0;
const PANEL_H: f64 = 260.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 180.0;

fn color(i: usize) -> &'static str {
    COLORS[i % COLORS.len()]
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A "nice" axis maximum at or above `v`.
fn nice_max(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let mag = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * mag >= v {
            return m * mag;
        }
    }
    10.0 * mag
}

/// Renders the report as an SVG document.
pub fn render(report: &SimReport) -> String {
    let n = report.policies.len().max(1);
    let height = 3.0 * (PANEL_H + 40.0) + 60.0;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(o, "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>");
    let s = &report.settings;
    let _ = writeln!(
        o,
        "<text x=\"{LEFT}\" y=\"24\" font-size=\"15\">{} — {} prefill / {} decode, {} tokens cached each, speed {}x</text>",
        esc(&report.trace),
        s.prefill,
        s.decode,
        s.cache_tokens,
        s.speed
    );
    let plot_w = W - LEFT - RIGHT;
    let slot = plot_w / n as f64;
    let bar_w = slot * 0.6;

    // Panel 1: hit ratio.
    let top = 50.0;
    axis(&mut o, top, "cache hit ratio (%)", 100.0);
    for (i, (name, p)) in report.policies.iter().enumerate() {
        let h = p.hit_ratio * PANEL_H;
        let x = LEFT + i as f64 * slot + (slot - bar_w) / 2.0;
        let _ = writeln!(
            o,
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{bar_w:.1}\" height=\"{h:.1}\" fill=\"{}\"/>",
            top + PANEL_H - h,
            color(i)
        );
        let _ = writeln!(
            o,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{:.1}%</text>",
            x + bar_w / 2.0,
            top + PANEL_H - h - 4.0,
            p.hit_ratio * 100.0
        );
        label(&mut o, x + bar_w / 2.0, top + PANEL_H + 14.0, name);
    }
    let yb = top + PANEL_H - report.upper_bound_hit_ratio * PANEL_H;
    let _ = writeln!(
        o,
        "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{yb:.1}\" y2=\"{yb:.1}\" stroke=\"black\" stroke-dasharray=\"6 4\"/>",
        LEFT + plot_w
    );
    let _ = writeln!(
        o,
        "<text x=\"{:.1}\" y=\"{:.1}\">infinite cache {:.1}%</text>",
        LEFT + plot_w + 6.0,
        yb + 4.0,
        report.upper_bound_hit_ratio * 100.0
    );

    // Panel 2: TTFT mean (solid) and p99 (light), seconds.
    let top = top + PANEL_H + 40.0;
    let max_s = report
        .policies
        .iter()
        .map(|(_, p)| p.ttft_p99_ms / 1e3)
        .fold(0.0, f64::max);
    let ymax = nice_max(max_s);
    axis(&mut o, top, "TTFT (s): mean, p99", ymax);
    for (i, (name, p)) in report.policies.iter().enumerate() {
        let x = LEFT + i as f64 * slot + (slot - bar_w) / 2.0;
        let half = bar_w / 2.0;
        for (k, v) in [p.ttft_mean_ms / 1e3, p.ttft_p99_ms / 1e3]
            .iter()
            .enumerate()
        {
            let h = (v / ymax).min(1.0) * PANEL_H;
            let _ = writeln!(
                o,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{}\" fill-opacity=\"{}\"/>",
                x + k as f64 * half,
                top + PANEL_H - h,
                half - 2.0,
                color(i),
                if k == 0 { "1" } else { "0.45" }
            );
            let _ = writeln!(
                o,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"10\">{v:.1}</text>",
                x + k as f64 * half + half / 2.0,
                top + PANEL_H - h - 3.0
            );
        }
        label(&mut o, x + bar_w / 2.0, top + PANEL_H + 14.0, name);
    }

    // Panel 3: largest prefill backlog over time.
    let top = top + PANEL_H + 40.0;
    let t_max = report
        .backlog
        .iter()
        .flat_map(|(_, v)| v.iter().map(|(t, _)| *t))
        .fold(0.0, f64::max);
    let b_max = nice_max(
        report
            .backlog
            .iter()
            .flat_map(|(_, v)| v.iter().map(|(_, b)| *b))
            .fold(0.0, f64::max),
    );
    axis(&mut o, top, "largest prefill backlog (s) over time", b_max);
    let tx = |t: f64| LEFT + t / t_max.max(1e-9) * plot_w;
    let by = |b: f64| top + PANEL_H - (b / b_max).min(1.0) * PANEL_H;
    for (i, (name, series)) in report.backlog.iter().enumerate() {
        let points: Vec<String> = series
            .iter()
            .map(|(t, b)| format!("{:.1},{:.1}", tx(*t), by(*b)))
            .collect();
        let _ = writeln!(
            o,
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>",
            color(i),
            points.join(" ")
        );
        let ly = top + 14.0 + i as f64 * 16.0;
        let _ = writeln!(
            o,
            "<line x1=\"{:.1}\" x2=\"{:.1}\" y1=\"{ly:.1}\" y2=\"{ly:.1}\" stroke=\"{}\" stroke-width=\"3\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            LEFT + plot_w + 6.0,
            LEFT + plot_w + 26.0,
            color(i),
            LEFT + plot_w + 30.0,
            ly + 4.0,
            esc(name)
        );
    }
    let _ = writeln!(
        o,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">time (s), 0 – {t_max:.0}</text>",
        LEFT + plot_w / 2.0,
        top + PANEL_H + 16.0
    );
    o.push_str("</svg>\n");
    o
}

/// A panel's frame, title and y ticks.
fn axis(o: &mut String, top: f64, title: &str, ymax: f64) {
    let plot_w = W - LEFT - RIGHT;
    let _ = writeln!(
        o,
        "<text x=\"{LEFT}\" y=\"{:.1}\" font-weight=\"bold\">{}</text>",
        top - 8.0,
        esc(title)
    );
    for k in 0..=4 {
        let v = ymax * f64::from(k) / 4.0;
        let y = top + PANEL_H - f64::from(k) / 4.0 * PANEL_H;
        let _ = writeln!(
            o,
            "<line x1=\"{LEFT}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT + plot_w,
            LEFT - 6.0,
            y + 4.0,
            if ymax >= 10.0 { format!("{v:.0}") } else { format!("{v:.2}") }
        );
    }
    let _ = writeln!(
        o,
        "<line x1=\"{LEFT}\" x2=\"{LEFT}\" y1=\"{top:.1}\" y2=\"{:.1}\" stroke=\"black\"/>",
        top + PANEL_H
    );
}

fn label(o: &mut String, x: f64, y: f64, text: &str) {
    let _ = writeln!(
        o,
        "<text x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"middle\" font-size=\"11\">{}</text>",
        esc(text)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_axis_maxima() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(7.0), 10.0);
        assert_eq!(nice_max(21.0), 25.0);
        assert_eq!(nice_max(0.3), 0.5);
    }
}
