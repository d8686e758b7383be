// A small line chart on a canvas: a few series sampled over time.

export class RateChart {
  // series: [{ name, color }]; keeps the last `capacity` samples.
  constructor(canvas, series, capacity) {
    this.canvas = canvas;
    this.series = series.map((s) => ({ ...s, values: [] }));
    this.times = [];
    this.capacity = capacity;
  }

  push(time, values) {
    this.times.push(time);
    this.series.forEach((s, i) => s.values.push(values[i] || 0));
    if (this.times.length > this.capacity) {
      this.times.shift();
      this.series.forEach((s) => s.values.shift());
    }
    this.draw();
  }

  draw() {
    const c = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const w = c.clientWidth;
    const h = c.clientHeight;
    if (c.width !== Math.round(w * ratio) || c.height !== Math.round(h * ratio)) {
      c.width = Math.round(w * ratio);
      c.height = Math.round(h * ratio);
    }
    const g = c.getContext("2d");
    g.setTransform(ratio, 0, 0, ratio, 0, 0);
    g.clearRect(0, 0, w, h);
    const left = 56, right = 10, top = 10, bottom = 22;
    const pw = w - left - right, ph = h - top - bottom;
    let max = 0;
    for (const s of this.series) for (const v of s.values) max = Math.max(max, v);
    max = niceCeiling(max);
    g.font = "11px system-ui, sans-serif";
    g.fillStyle = "#667";
    g.strokeStyle = "#dde";
    g.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const y = top + ph - (ph * i) / 4;
      g.beginPath();
      g.moveTo(left, y + 0.5);
      g.lineTo(left + pw, y + 0.5);
      g.stroke();
      g.textAlign = "right";
      g.fillText(formatNumber((max * i) / 4), left - 6, y + 4);
    }
    const n = this.times.length;
    if (n > 0) {
      const span = Math.max(1, (this.times[n - 1] - this.times[0]) / 1000);
      g.textAlign = "left";
      g.fillText(`-${Math.round(span)} s`, left, h - 6);
      g.textAlign = "right";
      g.fillText("now", left + pw, h - 6);
    }
    const slots = Math.max(1, this.capacity - 1);
    for (const s of this.series) {
      g.strokeStyle = s.color;
      g.lineWidth = 2;
      g.beginPath();
      s.values.forEach((v, i) => {
        // The newest sample at the right edge; older ones to its left.
        const x = left + pw - ((n - 1 - i) * pw) / slots;
        const y = top + ph - (max > 0 ? (v / max) * ph : 0);
        if (i === 0) g.moveTo(x, y);
        else g.lineTo(x, y);
      });
      g.stroke();
    }
  }
}

function niceCeiling(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

export function formatNumber(v) {
  if (v >= 1e9) return `${(v / 1e9).toFixed(1)}G`;
  if (v >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (v >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
}
