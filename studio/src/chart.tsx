// A line chart on a <canvas>, drawn by hand (no chart library: a few hundred bytes).
// The figure carries its data as attributes (data-samples, data-last, data-max) so
// tests and people can read what the chart shows.
import { useEffect, useRef } from 'preact/hooks';

export interface Series {
  name: string;
  color: string;
  values: number[];
}

function fmt(v: number): string {
  if (!Number.isFinite(v)) return '–';
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toFixed(1) + 'G';
  if (a >= 1e6) return (v / 1e6).toFixed(1) + 'M';
  if (a >= 1e4) return (v / 1e3).toFixed(1) + 'k';
  if (a >= 100 || v === Math.round(v)) return Math.round(v).toString();
  return v.toFixed(2);
}

/** A tick's label: up to 3 significant digits, k/M/G from 10,000 (no `0.00`). */
function tick(v: number): string {
  const a = Math.abs(v);
  const short = (x: number) => String(Number(x.toPrecision(3)));
  if (a >= 1e9) return short(v / 1e9) + 'G';
  if (a >= 1e6) return short(v / 1e6) + 'M';
  if (a >= 1e4) return short(v / 1e3) + 'k';
  return short(v);
}

export interface Axis {
  /** The value at the top of the chart. */
  max: number;
  /** The labels of the top, middle and bottom lines. */
  labels: string[];
  /** Nothing above zero (or no data): a 0–1 scale, marked idle. */
  idle: boolean;
}

/** The y axis for `values`: from 0 to a round top (1, 2, 4 or 5 times a power of
 * ten, a little above the peak), so the labels read 0 / 1 / 2, 0 / 0.2 / 0.4,
 * 0 / 25k / 50k. With nothing above zero the scale is 0–1 and the chart says idle
 * (a top computed from a zero peak would read 0.00 / 0.00 / 0). */
export function axis(values: number[]): Axis {
  const peak = values.reduce((m, v) => (Number.isFinite(v) && v > m ? v : m), 0);
  if (!(peak > 0)) return { max: 1, labels: ['1', '0.5', '0'], idle: true };
  const base = 10 ** Math.floor(Math.log10(peak));
  const m = [1, 2, 4, 5, 10].find((k) => k * base >= peak * 1.05) ?? 10;
  const max = m * base;
  return { max, labels: [tick(max), tick(max / 2), '0'], idle: false };
}

function draw(canvas: HTMLCanvasElement, series: Series[], capacity: number, ax: Axis) {
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth;
  const h = canvas.clientHeight;
  if (canvas.width !== w * dpr || canvas.height !== h * dpr) {
    canvas.width = w * dpr;
    canvas.height = h * dpr;
  }
  const ctx = canvas.getContext('2d');
  if (!ctx) return;
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  const max = ax.max;
  const left = 44;
  const top = 6;
  const bottom = h - 6;
  ctx.strokeStyle = '#e3e6ea';
  ctx.fillStyle = '#6b7280';
  ctx.font = '10px system-ui, sans-serif';
  ctx.lineWidth = 1;
  for (let i = 0; i <= 2; i++) {
    const y = top + ((bottom - top) * i) / 2;
    ctx.beginPath();
    ctx.moveTo(left, y);
    ctx.lineTo(w, y);
    ctx.stroke();
    ctx.fillText(ax.labels[i] ?? '', 2, y + 3);
  }
  if (ax.idle) {
    ctx.textAlign = 'center';
    ctx.fillText('idle', left + (w - left) / 2, top + (bottom - top) / 2 - 4);
    ctx.textAlign = 'start';
  }
  const step = (w - left) / Math.max(1, capacity - 1);
  for (const s of series) {
    ctx.strokeStyle = s.color;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    const offset = capacity - s.values.length;
    s.values.forEach((v, i) => {
      const x = left + (offset + i) * step;
      const y = bottom - (v / max) * (bottom - top);
      if (i === 0) ctx.moveTo(x, y);
      else ctx.lineTo(x, y);
    });
    ctx.stroke();
  }
}

export function Chart(props: { id: string; title: string; unit: string; series: Series[]; capacity: number }) {
  const ref = useRef<HTMLCanvasElement>(null);
  const all = props.series.flatMap((s) => s.values);
  const ax = axis(all);
  useEffect(() => {
    if (ref.current) draw(ref.current, props.series, props.capacity, ax);
  });
  const last = props.series.map((s) => s.values[s.values.length - 1] ?? 0);
  return (
    <figure
      class="chart"
      data-chart={props.id}
      data-samples={props.series[0]?.values.length ?? 0}
      data-last={last.join(',')}
      data-max={all.length ? Math.max(...all) : 0}
      data-axis={ax.labels.join(' / ')}
      data-idle={ax.idle ? 'true' : 'false'}
    >
      <figcaption>
        <b>{props.title}</b>
        {props.series.map((s, i) => (
          <span key={s.name} class="legend">
            <i class={`swatch c${colorIndex(s.color)}`} />
            {s.name} {fmt(last[i])}
            {props.unit}
          </span>
        ))}
        {ax.idle && (
          <span class="muted" data-testid="idle">
            idle
          </span>
        )}
      </figcaption>
      <canvas ref={ref} />
    </figure>
  );
}

export const COLORS = ['#2563eb', '#dc2626', '#16a34a', '#d97706', '#7c3aed'];
function colorIndex(c: string): number {
  return Math.max(0, COLORS.indexOf(c));
}
