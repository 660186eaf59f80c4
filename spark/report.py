"""The audit's one self-contained HTML report, with inline SVG plots drawn here.

No plotting library and nothing fetched: the file opens anywhere.
"""
import html
import math
import time

W, H = 640, 260
ML, MR, MT, MB = 64, 16, 28, 44
COLORS = ("#3b6ea5", "#c0504d", "#9bbb59", "#8064a2", "#f79646")


def _e(value):
    return html.escape(str(value), quote=True)


def _num(v):
    if v is None:
        return "–"
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e15:
            return "{:,}".format(int(v))
        return "{:,.3f}".format(v)
    if isinstance(v, int):
        return "{:,}".format(v)
    return _e(v)


def _ticks(lo, hi, count=5):
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = min((s * mag for s in (1, 2, 5, 10) if s * mag >= raw), default=raw)
    first = math.ceil(lo / step) * step
    out = []
    v = first
    while v <= hi + step * 1e-9:
        out.append(v)
        v += step
    return out


def _frame(title, body, xlabel="", ylabel=""):
    return ('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
            'viewBox="0 0 %d %d" role="img" aria-label="%s">'
            '<text x="%d" y="18" font-size="14" font-weight="bold">%s</text>%s'
            '<text x="%d" y="%d" font-size="11" text-anchor="middle">%s</text>'
            '<text x="14" y="%d" font-size="11" text-anchor="middle" '
            'transform="rotate(-90 14 %d)">%s</text></svg>'
            % (W, H, W, H, _e(title), ML, _e(title), body, (ML + W - MR) // 2, H - 6,
               _e(xlabel), (MT + H - MB) // 2, (MT + H - MB) // 2, _e(ylabel)))


def _axes(ymax, ylabels=True):
    parts = ['<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>' % (ML, H - MB, W - MR, H - MB),
             '<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#333"/>' % (ML, MT, ML, H - MB)]
    if ylabels:
        for t in _ticks(0, ymax):
            y = H - MB - (H - MB - MT) * t / ymax if ymax else H - MB
            parts.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>'
                         '<text x="%d" y="%.1f" font-size="10" text-anchor="end">%s</text>'
                         % (ML, y, W - MR, y, ML - 4, y + 3, _num(t)))
    return "".join(parts)


def line_chart(title, points, xlabel, ylabel):
    """points: [(epoch seconds, value)]."""
    if not points:
        return _frame(title, '<text x="%d" y="%d">no data</text>' % (ML + 10, H // 2))
    xs = [p[0] for p in points]
    ymax = max(max(p[1] for p in points), 1)
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    sx = lambda x: ML + (W - ML - MR) * (x - x0) / (x1 - x0)
    sy = lambda y: H - MB - (H - MB - MT) * y / ymax
    path = " ".join("%s%.1f,%.1f" % ("M" if i == 0 else "L", sx(x), sy(y))
                    for i, (x, y) in enumerate(points))
    labels = "".join('<text x="%.1f" y="%d" font-size="10" text-anchor="middle">%s</text>'
                     % (sx(x), H - MB + 14, time.strftime("%m-%d %H:%M", time.gmtime(x)))
                     for x in (x0, (x0 + x1) / 2, x1))
    body = _axes(ymax) + '<path d="%s" fill="none" stroke="%s" stroke-width="2"/>' % (
        path, COLORS[0]) + labels
    return _frame(title, body, xlabel, ylabel)


def bar_chart(title, labels, series, names, xlabel, ylabel):
    """Grouped bars: labels along x, series = list of value lists (one per name)."""
    if not labels:
        return _frame(title, '<text x="%d" y="%d">nothing to show</text>' % (ML + 10, H // 2))
    ymax = max(max(vals) for vals in zip(*series)) if series else 1
    ymax = max(ymax, 1)
    slot = (W - ML - MR) / len(labels)
    bw = slot * 0.8 / len(series)
    parts = [_axes(ymax)]
    for i, label in enumerate(labels):
        for j, vals in enumerate(series):
            v = vals[i]
            h = (H - MB - MT) * v / ymax
            x = ML + slot * i + slot * 0.1 + bw * j
            parts.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s">'
                         '<title>%s %s: %s</title></rect>'
                         % (x, H - MB - h, bw, h, COLORS[j % len(COLORS)], _e(label),
                            _e(names[j]), _num(v)))
        short = label if len(label) <= 14 else label[:13] + "…"
        parts.append('<text x="%.1f" y="%d" font-size="9" text-anchor="end" '
                     'transform="rotate(-30 %.1f %d)">%s</text>'
                     % (ML + slot * (i + 0.5), H - MB + 12, ML + slot * (i + 0.5), H - MB + 12,
                        _e(short)))
    if len(names) > 1:
        for j, name in enumerate(names):
            parts.append('<rect x="%d" y="%d" width="10" height="10" fill="%s"/>'
                         '<text x="%d" y="%d" font-size="11">%s</text>'
                         % (W - MR - 150, MT + 4 + 16 * j, COLORS[j % len(COLORS)],
                            W - MR - 135, MT + 13 + 16 * j, _e(name)))
    return _frame(title, "".join(parts), xlabel, ylabel)


def _delay_label(log10):
    seconds = 10 ** log10
    if seconds < 60:
        return "%.2gs" % seconds
    if seconds < 3600:
        return "%.2gm" % (seconds / 60)
    if seconds < 86400:
        return "%.2gh" % (seconds / 3600)
    return "%.2gd" % (seconds / 86400)


def _table(rows, columns, limit=30):
    if not rows:
        return "<p>none</p>"
    head = "".join("<th>%s</th>" % _e(c) for c in columns)
    body = "".join("<tr>%s</tr>" % "".join("<td>%s</td>" % _num(r.get(c)) for c in columns)
                   for r in rows[:limit])
    more = "<p>%d more rows in the Parquet output.</p>" % (len(rows) - limit) \
        if len(rows) > limit else ""
    return "<table><tr>%s</tr>%s</table>%s" % (head, body, more)


def _kv(pairs):
    return "<table>%s</table>" % "".join("<tr><th>%s</th><td>%s</td></tr>" % (_e(k), _num(v))
                                         for k, v in pairs)


CSS = """body{font-family:sans-serif;margin:2em;max-width:1100px;color:#222}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:2px 8px;
text-align:right;font-size:.9em}th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.verdict{font-size:1.2em;padding:.6em 1em;border-radius:4px}.clean{background:#e4f4e4}
.bad{background:#fbe4e4}.warn{background:#fbf4d4}
.plots svg{margin:.5em 1em .5em 0;border:1px solid #eee}"""


DDELAY_COLUMNS = ["avg_ddelay", "p50_ddelay", "p90_ddelay", "p99_ddelay"]


def render(summary, plots):
    q = summary["qmailanalog"]
    f = summary["findings"]
    bad = summary.get("bad_input", [])
    bad_count = sum(b["count"] for b in bad)
    if f["violations"]:
        verdict = '<p class="verdict bad">%d violation(s) found.</p>' % f["violations"]
    else:
        verdict = '<p class="verdict clean">No violation found.</p>'
    for text in summary.get("warnings", []):
        verdict += '<p class="verdict warn">warning: %s</p>' % _e(text)
    if bad_count:
        verdict += '<p class="verdict bad">%d piece(s) of bad input (see below); the rest ' \
                   'was audited.</p>' % bad_count
    delay_labels = [_delay_label(b) for b, _ in plots["delay_hist"]]
    svg = [
        line_chart("Queue size over time", plots["queue"], "time (UTC)", "messages in queue"),
        bar_chart("Delay distribution (injection to successful delivery)", delay_labels,
                  [[c for _, c in plots["delay_hist"]]], ["deliveries"], "ddelay",
                  "deliveries"),
        bar_chart("Deferrals and failures by recipient domain",
                  [d for d, _, _ in plots["domains"]],
                  [[z for _, z, _ in plots["domains"]], [x for _, _, x in plots["domains"]]],
                  ["deferrals", "failures"], "domain", "attempts"),
        bar_chart("Findings by kind", [k for k, _ in plots["findings"]],
                  [[c for _, c in plots["findings"]]], ["findings"], "kind", "findings"),
    ]
    m = summary["messages"]
    parts = [
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>qmail audit</title>"
        "<style>%s</style></head><body>" % CSS,
        "<h1>qmail audit</h1>", verdict,
        "<p>Hosts: %s. Log lines: %s. Generated %s UTC.</p>"
        % (_e(", ".join(summary["inputs"]["hosts"]) or "none"), _num(summary["log"]["lines"]),
           time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())),
        '<div class="plots">%s</div>' % "".join(svg),
        "<h2>Findings</h2>",
        _kv(sorted(f["by_kind"].items())) if f["by_kind"] else "<p>none</p>",
        _table(f["violation_examples"], ["kind", "host", "n", "birth", "time", "detail"], 50),
    ]
    if f.get("restored"):
        parts += ["<h2>Messages restored after log damage</h2>",
                  "<p>Their newest record was lost to a damaged log segment; qmail-send "
                  "delivered them again from the last readable one, so a recipient may have "
                  "got a copy twice.</p>",
                  _table(f["restored"], ["host", "n", "time", "detail"], len(f["restored"]))]
    if summary.get("fleet"):
        parts += fleet_section(summary["fleet"])
    if summary.get("fleet_queue", {}).get("hosts"):
        parts += fleet_queue_section(summary["fleet_queue"])
    parts += [
        "<h2>Messages</h2>",
        _kv([("messages (new msg occurrences)", m["messages"]), ("message numbers", m["numbers"]),
             ("ended", m["ended"]), ("still queued at the end", m["not_ended"]),
             ("bounces", m["bounces"]), ("triple bounces", m["triple_bounces"]),
             ("log began inside", m["orphans"])]),
        "<h2>qmailanalog figures (zoverall)</h2>",
        _kv([(k, v) for k, v in q.items()]),
        "<h2>Delays (seconds)</h2>",
        _table([dict(name=k, **v) for k, v in summary["delays"].items()],
               ["name", "count", "avg", "p50", "p90", "p99", "max"]),
        "<h2>By recipient domain</h2>",
        "<p>ddelay: injection to successful delivery, in seconds.</p>",
        _table(summary["per_domain"], ["domain", "attempts", "success", "failure", "deferral",
                                       "xdelay"] + DDELAY_COLUMNS),
        "<h2>By sender</h2>",
        _table(summary["per_sender"], ["sender", "messages", "bytes", "sbytes", "rbytes",
                                       "recipients", "tries", "success", "failure",
                                       "deferral", "xdelay"]),
        "<h2>By hour (UTC)</h2>",
        _table(summary["per_hour"], ["hour", "new_messages", "attempts", "success", "failure",
                                     "deferral", "completed", "bytes"] + DDELAY_COLUMNS, 72),
        "<h2>By host</h2>",
        _table(summary["per_host"], ["host", "messages", "numbers", "ended", "attempts",
                                     "success", "failure", "deferral", "bounces"]),
        "<h2>Log lines by kind</h2>", _kv(sorted(summary["log"]["by_kind"].items())),
        "" if not summary["log"].get("ignored") else
        "<p>Ignored (not qmail lines): %s.</p>" % _e(", ".join(
            "%d %s" % (v, k) for k, v in sorted(summary["log"]["ignored"].items()))),
        "<h2>Bad input</h2>",
        "<p>none</p>" if not bad else _table(
            [dict(kind=b["kind"], count=b["count"],
                  example=(b["examples"][0]["detail"] if b["examples"] else ""),
                  path=(b["examples"][0]["path"] if b["examples"] else ""))
             for b in bad], ["kind", "count", "path", "example"]),
        "</body></html>\n",
    ]
    return "".join(parts)


def fleet_section(fl):
    """Journeys across the fleet (spark/fleet.py): counts, clock skew per pair of hosts,
    end-to-end latency per route, hop latency per pair (skew-corrected)."""
    routes = [r for r in fl["latency_by_route"] if r["ended"]]
    chart = bar_chart("End-to-end latency by route (seconds)", [r["route"] for r in routes],
                      [[r["p50"] for r in routes], [r["p90"] for r in routes]], ["p50", "p90"],
                      "route", "seconds") if routes else ""
    return [
        "<h2>Fleet: journeys across hosts</h2>",
        _kv([("hosts", ", ".join(fl["hosts"])), ("journeys", fl["journeys"]),
             ("journeys across hosts", fl["across_hosts"]), ("hand-offs", fl["handoffs"]),
             ("hand-offs linked", fl["linked"]), ("hand-offs with several candidates",
                                                  fl["ambiguous"]),
             ("hand-offs to hosts without input", fl["unjudged"]),
             ("QMQP hand-offs logged by qmail-qmqpd", fl["qmqp"]["received"]),
             ("QMQP hand-offs linked", fl["qmqp"]["linked"]),
             ("journeys from null clients", fl["qmqp"]["from_null_clients"]),
             ("clock skew tolerated (s)", fl["skew_tolerance"])]),
        "<h3>Where journeys ended</h3>",
        _kv(sorted(fl["by_end"].items())) if fl["by_end"] else "<p>none</p>",
        "<h3>Clock skew observed per pair of hosts</h3>",
        "<p>The peer's <code>new msg</code> time minus the sender's <code>delivery</code> "
        "time, over linked hand-offs, in seconds.</p>",
        _table(fl["skew"], ["src", "dst", "links", "median", "min", "max"]),
        "<h3>Latency by route (seconds)</h3>",
        '<div class="plots">%s</div>' % chart,
        "<p>End to end: from the first host's <code>new msg</code> (a null client's: the hub's "
        "<code>qmqp from</code> line) to the last delivery or bounce, on the first host's "
        "clock, over the journeys that ended (not queued, not lost).</p>",
        _table(fl["latency_by_route"], ["route", "journeys", "ended", "p50", "p90", "p99",
                                         "max"]),
        "<h3>Hop latency per pair of hosts (seconds)</h3>",
        "<p>From the previous host's <code>new msg</code> to this host's (from qmail-qmqpd's "
        "line for a null client), corrected by the pair's observed skew: on one clock.</p>",
        _table(fl["latency_by_pair"], ["src", "dst", "hops", "p50", "p90", "p99", "max"]),
    ]


def fleet_queue_section(fq):
    """What is queued where now, from each host's latest snapshot (spark/fleetqueue.py)."""
    ages = list(fq["by_age"])
    chart = bar_chart("Queued messages by age", ages, [[fq["by_age"][a] for a in ages]],
                      ["messages"], "age", "messages")
    oldest = [dict(e, recipients_left=", ".join(e["recipients_left"]),
                   birth=_utc(e["birth"]))
              for e in fq["oldest"]]
    return [
        "<h2>Fleet queue: what is queued where</h2>",
        "<p>From the latest snapshot of each host. A message counts once in each recipient "
        "domain it still has pending recipients in; bytes are its size.</p>",
        _table([dict(h, snapshot_taken=_utc(h["snapshot_taken"])) for h in fq["hosts"]],
               ["host", "snapshot_taken", "messages", "recipients", "bytes"],
               len(fq["hosts"])),
        "<h3>By state</h3>", _kv(sorted(fq["by_state"].items())),
        '<div class="plots">%s</div>' % chart,
        "<h3>By host, recipient domain, age and state</h3>",
        "<p>%d rows in fleet_queue.parquet; the largest:</p>" % fq["table_rows"],
        _table(fq["largest"], ["host", "domain", "age", "state", "messages", "recipients",
                               "bytes"], len(fq["largest"])),
        "<h3>The oldest messages</h3>",
        _table(oldest, ["host", "n", "state", "birth", "age", "size", "sender", "message_id",
                        "recipients_left"], len(oldest)),
    ]


def _utc(when):
    return "–" if when is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(when))
