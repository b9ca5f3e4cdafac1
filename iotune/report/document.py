"""report.md (figures as PNG files beside it) and report.html (self-contained: figures
embedded, a check that marks any figure the browser could not draw)."""

from __future__ import annotations

import base64
import html
import io
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iotune.report import figures as fg
from iotune.report import latency_figures as lf
from iotune.report import tables as tb
from iotune.report.load import ReportData

NOTE = (
    "GiB = 2^30 bytes (the study's tables say GB and mean GiB). Measured values first, the "
    "I/O model's estimate in parentheses; request counts are block requests issued to the "
    "drives, 'focus' being exactly the AIO block size."
)


@dataclass
class Section:
    title: str
    table: tb.Table | None = None
    figure: fg.Drawn | None = None
    text: str | None = None


def sections(data: ReportData, study_threads: dict[str, Any] | None) -> list[Section]:
    out: list[Section] = []
    drawn = {d.name: d for d in lf.draw_all(data, study_threads)}
    for size in tb.sizes(data.runs):
        out.append(Section(f"Model size {size}", table=tb.size_table(data.runs, size)))
    for name in (
        "step_time",
        "step_vs_drives",
        "optimizer_share",
        "nvme_bytes",
        "request_sizes",
        "run_latency",
    ):
        if name in drawn:
            out.append(Section(drawn[name].title, figure=drawn[name]))
    ck = tb.checkpoint_table(data.runs)
    if ck[1]:
        out.append(
            Section(
                "Checkpoints",
                table=ck,
                text="a save's median seconds: the step blocked, and until its files were "
                "durable; its bytes beside the I/O model's; what it read from the offload "
                "volume and wrote to the checkpoint volume; on a RAID5/6, what the members "
                "wrote against the save, beside full stripes' K/(K-p).",
            )
        )
    persisted = tb.persist_table(data.runs)
    if persisted[1]:
        out.append(
            Section(
                "Persisted saves",
                table=persisted,
                text="each save's copy from its snapshot to the persist volume, beside the "
                "training (medians): seconds from the save until durable with its latest, and "
                "how long the next save or the run's end waited for it; what the persist "
                "volume's drives wrote for it; on a RAID5/6, what the members wrote against "
                "the persist, beside full stripes' K/(K-p).",
            )
        )
    header, rows = tb.prediction_table(data.runs)
    if rows:
        out.append(
            Section(
                "Step time predicted from measured bandwidth",
                table=(header, rows),
                text="optimizer = reads / read bandwidth + CPU Adam + writes / write "
                "bandwidth (DeepSpeed swaps a sub-group in, updates it, swaps it out); step = "
                "baseline forward + backward + what of the gradients' writing outlasts "
                "backward + optimizer.",
            )
        )
    for s in data.sweeps:
        out.append(
            Section(
                f"AIO sweep {s.name}", table=tb.sweep_table(s), figure=drawn.get(f"sweep_{s.name}")
            )
        )
        lat = drawn.get(f"sweep_latency_{s.name}")
        if lat is not None:
            out.append(Section(lat.title, figure=lat))
    for doc in data.threads:
        out.append(
            Section(f"CPU Adam over threads ({doc.get('source', '')})", table=tb.threads_table(doc))
        )
    if "adam_threads" in drawn:
        out.append(Section(drawn["adam_threads"].title, figure=drawn["adam_threads"]))
    return out


def _md_table(t: tb.Table) -> str:
    header, rows = t

    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def write(
    out: Path, data: ReportData, formats: list[str], study_threads: dict[str, Any] | None
) -> dict[str, Any]:
    """Write the figures and the asked formats; returns what was written."""
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    secs = sections(data, study_threads)
    pngs: dict[str, bytes] = {}
    for s in secs:
        if s.figure:
            pngs[s.figure.name] = _png(s.figure.fig)
            (out / f"{s.figure.name}.png").write_bytes(pngs[s.figure.name])
            plt.close(s.figure.fig)
    stamp = time.strftime("%Y-%m-%d %H:%M")
    written: dict[str, Any] = {"out": str(out), "figures": [f"{n}.png" for n in pngs]}
    if "md" in formats:
        parts = [f"# iotune report ({stamp})", "", NOTE, "", "Sources: " + "; ".join(data.sources)]
        for s in secs:
            parts += ["", f"## {s.title}", ""]
            if s.text:
                parts += [s.text, ""]
            if s.table:
                parts.append(_md_table(s.table))
            if s.figure:
                parts += [
                    "",
                    f"![{s.figure.title}]({s.figure.name}.png)",
                    "",
                    f"*{s.figure.caption}*",
                ]
        (out / "report.md").write_text("\n".join(parts) + "\n")
        written["md"] = "report.md"
    if "html" in formats:
        (out / "report.html").write_text(_html(secs, pngs, data, stamp))
        written["html"] = "report.html"
    return written


_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1400px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
figure{margin:1em 0 2em}figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:13px;color:#555}.broken{color:#b00;font-weight:bold}
"""

# Marks the page with how many figures rendered; names any that did not.
_CHECK = """
window.addEventListener('load', function () {
  var imgs = document.querySelectorAll('figure img');
  var ok = 0, bad = [];
  imgs.forEach(function (i) {
    if (i.complete && i.naturalWidth > 0) { ok++; } else { bad.push(i.alt); }
  });
  document.body.setAttribute('data-figures-rendered', ok + '/' + imgs.length);
  if (bad.length) {
    var p = document.createElement('p');
    p.className = 'broken';
    p.textContent = 'figures that did not render: ' + bad.join(', ');
    document.body.insertBefore(p, document.body.firstChild);
  }
});
"""


def _html_table(t: tb.Table) -> str:
    header, rows = t
    h = "".join(f"<th>{html.escape(c)}</th>" for c in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><thead><tr>{h}</tr></thead><tbody>{body}</tbody></table>"


def _html(secs: list[Section], pngs: dict[str, bytes], data: ReportData, stamp: str) -> str:
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>iotune report {html.escape(stamp)}</title><style>{_CSS}</style>",
        f"<script>{_CHECK}</script></head><body>",
        f"<h1>iotune report</h1><p>{html.escape(stamp)}. {html.escape(NOTE)}</p>",
        "<p>Sources: " + html.escape("; ".join(data.sources)) + "</p>",
    ]
    for s in secs:
        parts.append(f"<h2>{html.escape(s.title)}</h2>")
        if s.text:
            parts.append(f"<p>{html.escape(s.text)}</p>")
        if s.table:
            parts.append(_html_table(s.table))
        if s.figure:
            b64 = base64.b64encode(pngs[s.figure.name]).decode()
            parts.append(
                f"<figure><img alt='{html.escape(s.figure.title)}' "
                f"src='data:image/png;base64,{b64}'><figcaption>"
                f"{html.escape(s.figure.caption)}</figcaption></figure>"
            )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def study_threads() -> dict[str, Any] | None:
    """The study's CPU-Adam thread figures with its model's parameter count (iotune's
    preset of that size)."""
    from iotune.model.presets import load_presets
    from iotune.model.published import load_study

    doc = load_study().get("adam_threads")
    if not doc:
        return None
    size = doc["size"]
    p = next((p for p in load_presets().values() if p.size == size), None)
    if p is None:
        return None
    return {**doc, "params": p.geometry.param_count()}
